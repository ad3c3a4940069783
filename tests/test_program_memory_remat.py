"""The memory the program planner predicts for a training step whose layers are
rematerialised (``jax.checkpoint``), against XLA's compiled memory: the backward pass's
recomputation reads only the forward pass's saved arrays, and XLA runs it, and slices those
arrays for the weight gradients, in the forward pass, so that the saved arrays are not held to
the end of the backward pass (:mod:`shardwise._program.remat`)."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp

import shardwise
from shardwise._model.profile import BUILTIN

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
