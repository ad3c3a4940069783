"""The memory the program planner predicts for a training step whose layers are
rematerialised (``jax.checkpoint``), against XLA's compiled memory: the backward pass's
recomputation reads only the forward pass's saved arrays, and XLA runs it, and slices those
arrays for the weight gradients, in the forward pass, so that the saved arrays are not held to
the end of the backward pass (:mod:`shardwise._program.remat`)."""

from __future__ import annotations

import itertools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType

import shardwise
from helpers import ANOTHER_MACHINE
from shardwise._model.profile import BUILTIN, Profile
from shardwise._program.graph import Graph, build
from shardwise._program.remat import bodies, scheduled, twins
from shardwise._program.verify import compile_program

S = jax.ShapeDtypeStruct


def _layer(w: jax.Array, b: jax.Array, x: jax.Array) -> jax.Array:
    return jnp.tanh(x @ w.T + b)


def _loss(params: list[tuple[jax.Array, jax.Array]], x: jax.Array, y: jax.Array) -> jax.Array:
    for w, b in params[:-1]:
        x = jax.checkpoint(_layer)(w, b, x)
    w, b = params[-1]
    return jnp.mean((x @ w.T + b - y) ** 2)


def _step(params: list[tuple[jax.Array, jax.Array]], x: jax.Array, y: jax.Array) -> jax.Array:
    return jax.value_and_grad(_loss)(params, x, y)


def _args() -> tuple[object, ...]:
    sizes = [32, 64, 64, 64, 16]
    params = [(S((b, a), "float32"), S((b,), "float32")) for a, b in itertools.pairwise(sizes)]
    return params, S((64, 32), "float32"), S((64, 16), "float32")


OFF: dict[str, float] = {}
"""The plans known to compile outside the bounds (compiled ÷ predicted, as measured), checked
to be still off, so that the day one is fixed this test says so. None now: data×tensor was
1.263 (XLA sliced its replicated activations for the weight gradients early and held three
slices at once) until a broadcast operand (each layer's bias) was read moved to its result's
layout, as XLA reads it: the data×tensor plan changed with that (compiled 79 KB, now 61 KB)
and is within them (1.09)."""


def test_checkpointed_mlp_memory_within_bounds_of_xla_for_every_plan():
    plan = shardwise.plan(_step, *_args(), mesh="data=2,model=4", profile=BUILTIN["cpu-2core"])
    checked = plan.verify(repeat=1)
    ratios = {}
    for p in checked.plans:
        assert p.verified is not None and p.verified.memory_bytes, p.name
        ratios[p.name] = p.verified.memory_bytes / p.predicted.memory_bytes
    within = {n: r for n, r in ratios.items() if 0.8 <= r <= 1.25}
    assert set(ratios) - set(within) == set(OFF), ratios


def _in_body(graph: Graph, k: int) -> bool:
    return any(graph.steps[k].key[: len(b)] == b for b in bodies(graph))


def test_each_recomputed_layer_is_paired_with_the_forward_pass_twin():
    """The backward pass's recomputation of each checkpointed layer (its weight's transpose,
    its dot, its bias's broadcast) is paired with the forward pass's steps that compute the
    same: the candidates XLA merges."""
    graph = build(_step, _args())
    found = twins(graph)
    dots = [k for k in found if graph.steps[k].kind == "dot"]
    assert len(dots) == 3  # (the three checkpointed layers; the last layer is not)
    assert len(found) == 9
    for k, f in found.items():
        a, b = graph.steps[k], graph.steps[f]
        assert _in_body(graph, k) and not _in_body(graph, f)
        assert (a.prim, a.op, a.dim_map) == (b.prim, b.op, b.dim_map)
        made, twin = graph.values[a.output], graph.values[b.output]
        assert (made.shape, made.dtype) == (twin.shape, twin.dtype)


@pytest.mark.parametrize("profile", ["cpu-2core", "another machine"])
def test_xla_merges_every_recomputed_dot_the_model_merges(profile: str):
    """Every recomputed dot that the memory model takes as merged with the forward pass's
    twin (laid out alike, summing nothing after it: :func:`~shardwise._program.remat.alike`)
    is one dot fewer in the compiled program, and the prediction counts its FLOPs once, as
    XLA does (within 10% of XLA's count for every plan, where counting them twice had been
    1.21–1.43x it)."""
    chosen = BUILTIN["cpu-2core"] if profile == "cpu-2core" else Profile.from_json(ANOTHER_MACHINE)
    plan = shardwise.plan(_step, *_args(), mesh="data=2,model=4", profile=chosen)
    graph = plan.graph
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    leaves = [np.zeros(a.shape, a.dtype) for a in jax.tree.leaves(_args())]
    dots = sum(step.kind == "dot" for step in graph.steps)
    merged_anywhere = 0
    for p in plan.plans:
        found = scheduled(graph, p.layouts, plan.mesh)
        merged = sum(graph.steps[k].kind == "dot" for k in found.merged)
        compiled = compile_program(plan, p, mesh, leaves)[1]
        assert len(re.findall(r" dot\(", compiled.as_text())) <= dots - merged, p.name
        counted = compiled.cost_analysis()
        counted = counted[0] if isinstance(counted, list) else counted  # (older JAX: a list)
        assert 0.9 <= p.predicted.flops / counted["flops"] <= 1.1, p.name
        merged_anywhere += merged
    assert merged_anywhere > 0


def _residual(w: jax.Array, x: jax.Array) -> jax.Array:
    return x + jnp.tanh(x @ w)


def _residual_step(ws: list[jax.Array], x: jax.Array) -> jax.Array:
    def loss(ws: list[jax.Array], x: jax.Array) -> jax.Array:
        for w in ws:
            x = jax.checkpoint(_residual)(w, x)
        return jnp.mean(x**2)

    return jax.value_and_grad(loss)(ws, x)


def test_a_merged_residual_layer_holds_what_its_backward_pass_reads():
    """Checkpointed residual layers (``x + tanh(x @ w)``) whose recomputation XLA merges: the
    backward pass's ``tanh`` derivative needs the forward dot's result, which the layer's
    output mixes with its input, so that result is held to the backward pass. (Taken instead
    from the last buffer of its class, which the residual stream joins to every layer's, the
    next layer's output, these plans had been predicted at 0.71–0.73 of XLA's memory.)"""
    args = ([S((64, 64), "float32")] * 4, S((64, 64), "float32"))
    profile = Profile.from_json(ANOTHER_MACHINE)  # (its plans merge the recomputation)
    plan = shardwise.plan(_residual_step, *args, mesh="data=2,model=4", profile=profile)
    ratios = {
        p.name: p.verified.memory_bytes / p.predicted.memory_bytes
        for p in plan.verify(repeat=1).plans
        if p.verified is not None
    }
    assert len(ratios) == len(plan.plans)
    assert all(0.8 <= r <= 1.25 for r in ratios.values()), ratios
