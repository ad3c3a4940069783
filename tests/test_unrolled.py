"""A model written as a Python loop of layers plans as the same model under ``lax.scan``
does: each layer laid out as the scan's body, each of its steps predicted to take the scan's
time per layer; its identical layers are solved once, and nothing is lost by it."""

from __future__ import annotations

import jax
import pytest

import shardwise
from shardwise._model.mesh import MeshSpec
from shardwise._model.profile import BUILTIN
from shardwise._program import eliminate
from shardwise._program.fold import fold
from shardwise._program.models import block
from shardwise._program.pricing import build_problem
from shardwise._program.problem import effective_mesh
from shardwise._program.search import WIDE, _solve, solve

S = jax.ShapeDtypeStruct
LAYERS = 3
HIDDEN, HEADS, FFN = 256, 8, 1024  # weights large beside activations: tensor parallel wins


def _weights(lead: tuple[int, ...]) -> dict[str, S]:
    d = HIDDEN // HEADS
    qkv = S((*lead, HIDDEN, HEADS, d), "float32")
    return {
        "wq": qkv,
        "wk": qkv,
        "wv": qkv,
        "wo": S((*lead, HEADS, d, HIDDEN), "float32"),
        "w1": S((*lead, HIDDEN, FFN), "float32"),
        "w2": S((*lead, FFN, HIDDEN), "float32"),
    }


def unrolled(x: jax.Array, params: list[dict[str, jax.Array]]) -> jax.Array:
    for p in params:
        x = block(x, p)
    return x


def scanned(x: jax.Array, params: dict[str, jax.Array]) -> jax.Array:
    return jax.lax.scan(lambda h, p: (block(h, p), None), x, params)[0]


X = S((2, 16, HIDDEN), "float32")


@pytest.mark.parametrize("mesh", ["data=2,model=4", "x=8"])
def test_an_unrolled_stack_plans_each_layer_as_its_scan_does(mesh):
    loop = shardwise.plan(unrolled, X, [_weights(()) for _ in range(LAYERS)], mesh=mesh,
                          profile="cpu-2core", top=1)  # fmt: skip
    scan = shardwise.plan(scanned, X, _weights((LAYERS,)), mesh=mesh, profile="cpu-2core", top=1)
    looped, stacked = loop.chosen, scan.chosen
    assert any(s.axes for s in stacked.in_specs[1:])  # some weight is split: not trivial
    # each layer's weights as the stack's, but for the stack's layer dimension (kept whole)
    names = dict(zip(scan.graph.names, stacked.in_specs, strict=True))
    for name, spec in zip(loop.graph.names, looped.in_specs, strict=True):
        if name == "x":
            assert spec == names["x"]
            continue
        whole = names["params" + name.split("]", 1)[1]]  # params[1]['wq'] -> params['wq']
        assert whole.padded(1)[0] == ()
        assert whole.entries[1:] == spec.entries
    # each layer's dots as the scan body's, each taking the scan's time per layer
    body = [(k, s) for k, s in enumerate(scan.graph.steps) if s.kind == "dot"]
    dots = [(k, s) for k, s in enumerate(loop.graph.steps) if s.kind == "dot"]
    assert len(dots) == LAYERS * len(body)
    for layer in range(LAYERS):
        for (k, step), (j, inner) in zip(dots[layer * len(body) :], body, strict=False):
            assert step.op == inner.op
            assert looped.layouts.steps[step.key] == stacked.layouts.steps[inner.key]
            per_layer = stacked.predicted.step_seconds[j] / LAYERS
            assert looped.predicted.step_seconds[k] == pytest.approx(per_layer, rel=1e-12)


@pytest.mark.parametrize("train", [False, True])
def test_an_unrolled_stack_folds_into_one_layer_and_loses_nothing(train):
    """The layers hang off the residual stream (one class: every block adds to it): alike
    layers are solved once (in a training step the first layer's backward pass differs, as
    nothing needs its input's gradient), and cost what solving them all does."""
    weights = [_weights(()) for _ in range(LAYERS)]
    fn, args = (_loss, (weights, X, X)) if train else (unrolled, (X, weights))
    graph = shardwise.plan(fn, *args, mesh="x=8", profile="cpu-2core", top=1, train=train).graph
    mesh = effective_mesh(MeshSpec.parse("x=8"))
    problem = build_problem(graph, mesh, BUILTIN["cpu-2core"])
    small = problem
    while (folding := fold(small)) is not None:  # as solve folds it
        small = folding.problem
    assert len(small.labels) < len(problem.labels) * 2 / 3  # a layer, at least, folded away
    folded, whole = solve(problem), _solve(problem, (), (), 60.0)
    assert folded is not None and whole is not None
    assert folded.seconds == pytest.approx(whole.seconds, rel=1e-12)


def _loss(params: list[dict[str, jax.Array]], x: jax.Array, y: jax.Array) -> jax.Array:
    return ((unrolled(x, params) - y) ** 2).mean()


def test_the_training_step_of_a_chain_of_layers_is_solved_by_dynamic_programming(monkeypatch):
    """A chain of ``relu(h @ w)`` layers' training step is a ladder: each weight is read by its
    forward dot, by the backward dot that carries the gradient on and by the dot that makes
    its own gradient. Folding into two neighbours leaves its rungs; folding into all of them
    at once solves it, to the integer program's cost."""

    def loss(ws: list[jax.Array], x: jax.Array, y: jax.Array) -> jax.Array:
        for w in ws:
            x = jax.nn.relu(x @ w)
        return ((x - y) ** 2).mean()

    ws = [S((256, 256), "float32") for _ in range(6)]
    x = S((64, 256), "float32")
    plan = shardwise.plan(loss, ws, x, x, mesh="data=2,model=4", profile="cpu-2core", top=1,
                          train=True)  # fmt: skip
    assert plan.method == WIDE and plan.optimal
    problem = build_problem(plan.graph, effective_mesh(plan.mesh), BUILTIN["cpu-2core"])
    wide = solve(problem)
    monkeypatch.setattr(eliminate, "WIDE_TABLE", 0)
    milp = solve(problem)
    assert wide is not None and milp is not None and "integer program" in milp.method
    assert wide.seconds == pytest.approx(milp.seconds, rel=1e-9)
