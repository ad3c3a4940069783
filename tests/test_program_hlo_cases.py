"""Programs of kinds users write that the planner once mispredicted: every plan of each, run,
equals ``jax.jit`` of the function, and its predicted collectives (kind, axes, bytes) are the
compiled HLO's. Found by planning and verifying a few dozen small functions of every kind
(reductions, sorts, loops, conditionals, dtypes, empty arrays, gradients): on 8 simulated CPU
devices, as the suite runs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import shardwise
from shardwise._program.graph import build
from shardwise._xla.verified import by_kind

MESH = "data=2,model=4"
_rng = np.random.default_rng(0)
X = jnp.asarray(_rng.standard_normal((16, 32)), jnp.float32)
W = jnp.asarray(_rng.standard_normal((32, 64)), jnp.float32)


def _grad_only(x, w):  # the loss itself is never returned: XLA never computes its sum
    return jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w)))(w)


CASES = {
    "grad without its value": (_grad_only, (X, W)),
    "slice to nothing": (lambda x, w: x[:0] @ w, (X, W)),
    "contraction over nothing": (lambda x, w: x[:, :0] @ w[:0, :], (X, W)),
    "empty batch, summed": (lambda x, w: jnp.tanh(x @ w).sum(0), (jnp.zeros((0, 32)), W)),
    "empty operands of a dot": (jnp.matmul, (jnp.zeros((16, 0)), jnp.zeros((0, 64)))),
    "sum of an empty slice": (lambda x, w: x[:0].sum(0) + w[:, :32].sum(1), (X, W)),
    "gradient over an empty batch": (_grad_only, (jnp.zeros((0, 32)), W)),
    # a concatenation with an empty piece still reads the others (an associative scan makes one)
    "associative scan": (lambda x, w: jax.lax.associative_scan(jnp.add, x @ w), (X, W)),
    # a CPU computes bfloat16 in float32: its gathers and sums move float32
    "bfloat16 operands": (
        lambda x, w: jnp.tanh(x @ w),
        (X.astype("bfloat16"), W.astype("bfloat16")),
    ),
    "bfloat16 gradient": (_grad_only, (X.astype("bfloat16"), W.astype("bfloat16"))),
    "cast to bfloat16": (lambda x, w: x.astype("bfloat16") @ w.astype("bfloat16"), (X, W)),
    # XLA gathers top_k's operand whole, even split on the batch alone
    "top_k of rows": (lambda x, w: jax.lax.top_k(x @ w, 5)[0], (X, W)),
    # stop_gradient and copy are their operand: one gather of it serves both readers
    "solve": (lambda x, w: jnp.linalg.solve(x.T @ x + 32 * jnp.eye(32), w), (X, W)),
    # a scan whose carries start as constants and take values from the arrays it reads
    "searchsorted": (lambda a, v: jnp.searchsorted(a, v), (jnp.sort(W[:, 0]), X[:, 0])),
    # a dot to a scalar: its partial sums are summed as any dot's
    "dot of vectors": (jnp.dot, (X[0], W[:, 0])),
    # a dot with a constant operand (the ones a sum's gradient is), done whole on each device,
    # beside the dots of the same line: the miscompile guard took its few terms for a split
    "attention gradient": (
        lambda q, k: jax.grad(lambda q: jax.nn.dot_product_attention(q, k, k).sum())(q),
        (X.reshape(2, 16, 2, 8), X[::-1].reshape(2, 16, 2, 8)),
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_every_plan_runs_equal_to_jit_and_its_collectives_are_the_compiled_ones(name):
    fn, args = CASES[name]
    plan = shardwise.plan(fn, *args, mesh=MESH, profile="cpu-2core", top=2)
    want = jax.jit(fn)(*args)
    tol = 2e-2 if want.dtype == jnp.bfloat16 else 1e-5
    for p in plan.plans:
        got = plan.sharded(p.name)(*args)
        np.testing.assert_allclose(
            np.asarray(got, np.float32), np.asarray(want, np.float32), rtol=tol, atol=tol
        )
    checked = plan.verify(repeat=1)
    wrong = [
        (p.name, by_kind(p.predicted.collectives), by_kind(p.verified.collectives))
        for p in checked.plans
        if p.verified is not None and not p.verified.collectives_match
    ]
    assert wrong == []


def _causal_scores(q, k):  # the mask as Flax's make_causal_mask makes it: iotas compared
    idx = jnp.broadcast_to(jnp.arange(q.shape[1]), q.shape[:2])
    mask = idx[:, :, None] >= idx[:, None, :]
    return jax.nn.softmax(jnp.where(mask, jnp.einsum("btd,bsd->bts", q, k), -1e9), axis=-1)


@pytest.mark.parametrize("keys", ["-,data", "-,(data,model)"])
def test_a_causal_mask_is_made_whole_where_the_keys_are_split(keys):
    """The keys' positions split on an axis: XLA had split the mask's ``iota`` on it and
    gathered it again for the queries' positions, a collective no plan predicts (every
    plan that kept the keys split)."""
    q, k = X[:16].reshape(2, 8, 32), X[::-1][:16].reshape(2, 8, 32)
    plan = shardwise.plan(_causal_scores, q, k, mesh=MESH, profile="cpu-2core", top=3,
                          fixed={"k": keys})  # fmt: skip
    want = jax.jit(_causal_scores)(q, k)
    for p in plan.plans:
        np.testing.assert_allclose(plan.sharded(p.name)(q, k), want, rtol=1e-5, atol=1e-6)
    checked = plan.verify(repeat=1)
    assert [p.name for p in checked.plans if not p.verified.collectives_match] == []


def test_what_nothing_reads_is_not_planned():
    """``jax.grad`` leaves the loss's forward sum in the trace; XLA drops it, and so does the
    graph (a planned sum would be costed, and its all-reduce predicted)."""
    S = jax.ShapeDtypeStruct
    graph = build(_grad_only, [S((16, 32), "float32"), S((32, 64), "float32")])
    assert [s.prim for s in graph.steps if s.kind != "dot"] == ["transpose"]
    assert sum(s.kind == "dot" for s in graph.steps) == 2


@pytest.mark.parametrize(
    "fn", [lambda x: x, jnp.copy, lambda x: (x, jnp.tanh(x) * 2)], ids=["x", "copy", "x and more"]
)
def test_an_argument_returned_as_it_is_has_a_result_buffer_of_its_own(fn):
    """XLA copies an argument it returns (not donated) into a result buffer: every plan's
    memory is the compiled program's (it was half of it), within the 16 bytes of a tuple of
    two results' pointers."""
    plan = shardwise.plan(fn, X, mesh=MESH, profile="cpu-2core", top=2).verify(repeat=1)
    found = {p.name: (p.predicted.memory_bytes, p.verified.memory_bytes) for p in plan.plans}
    assert all(0 <= compiled - predicted <= 16 for predicted, compiled in found.values()), found


def test_an_implicit_broadcast_moves_its_operand_to_the_results_layout():
    """``x * y`` with ``y`` of shape ``(1, 1, 32)``, split on its features, and ``x`` on its
    batch: XLA gathers ``y`` (128 bytes) and multiplies in ``x``'s layout. The plan had the
    product made split like ``y`` and moved to ``x``'s layout (an all-to-all of the whole
    product, 2 KiB), a collective the compiled program does not have."""
    x, y = jnp.ones((8, 16, 32)), jnp.ones((1, 1, 32))
    fixed = {"x": "x", "y": "-,-,x"}
    plan = shardwise.plan(lambda x, y: x * y, x, y, mesh="x=8", profile="cpu-2core", fixed=fixed)
    checked = plan.verify(repeat=1)
    search = checked.get("search")
    assert [(c.kind, c.bytes) for c in search.predicted.collectives] == [("all-gather", 128)]
    assert all(p.verified is not None and p.verified.collectives_match for p in checked.plans)
    np.testing.assert_array_equal(np.asarray(plan.sharded()(x, y)), np.asarray(x * y))


def test_an_embedding_gradient_on_an_explicit_mesh_compiles_as_planned(monkeypatch):
    """A tied-embedding language model's gradient planned on an Explicit mesh: traced on
    Explicit axes, the scatter-add of the embedding's gradient carried the mesh's types into
    its combiner, which JAX lowered as constraints, and XLA gathered the updates and indices
    (an all-gather the plan does not have) where the plan sums partial tables. It is traced
    on the mesh's Auto twin, and every plan compiles as predicted."""
    from pathlib import Path

    from jax.sharding import AxisType

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import hlo_cases

    fn, args = hlo_cases.PIECES["tied-embedding lm gradient"]
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
    checked = shardwise.plan(fn, *args, mesh=mesh, profile="cpu-2core", top=2).verify(repeat=1)
    assert len(checked.plans) > 2
    assert all(p.verified is not None and p.verified.collectives_match for p in checked.plans)


def test_the_zeros_of_a_contraction_over_nothing_move_as_a_product_would():
    # the gradient of an einsum that contracts an index of size 0 is zeros made in the dot's
    # layout: XLA moves them to where they are read (two all-to-alls of 192 B), which the
    # search's plans had left out of their predictions, and chosen plans that need them
    def loss(params, x):
        v = jnp.einsum("okf,kofy,fodk->fkd", x, params["w1"], params["w2"])
        return jnp.mean(jnp.square(jnp.concatenate([params["w3"], v], axis=1)))

    z = jnp.zeros
    params = {"w1": z((8, 0, 2, 16)), "w2": z((2, 0, 12, 8)), "w3": jnp.ones((2, 3, 12))}
    plan = shardwise.plan(jax.grad(loss), params, z((0, 8, 2)), mesh="a=2,b=2,c=2",
                          profile="cpu-2core")  # fmt: skip
    checked = plan.verify(repeat=1)
    assert all(p.verified.collectives_match for p in checked.plans if p.verified is not None)
