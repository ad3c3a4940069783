"""Batch statistics as ``jax.vmap`` writes them (a BatchNorm's ``pmean`` over the mapped
axis), and the memory of the arrays made from them: ``x - mean`` is made again where it is
read, not held, and a move of several collectives holds its steps' buffers at once."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import shardwise
from shardwise._program.graph import build
from shardwise._program.memory import _live
from shardwise._versions import heap_release

PROFILE = "cpu-2core"
S = jax.ShapeDtypeStruct


def _normalised(x: jax.Array) -> jax.Array:
    """Each row less the batch's mean, over its deviation: batch statistics by ``pmean``."""

    def one(row: jax.Array) -> jax.Array:
        mean = jax.lax.pmean(row, "batch")
        var = jax.lax.pmean((row - mean) ** 2, "batch")
        return (row - mean) / jnp.sqrt(var + 1e-5)

    return jax.vmap(one, axis_name="batch")(x)


def _loss(params: dict[str, jax.Array], x: jax.Array, y: jax.Array) -> jax.Array:
    h = jax.nn.relu(_normalised(x @ params["w1"]) * params["g"] + params["b"])
    return jnp.mean((h @ params["w2"] - y) ** 2)


def test_a_psum_over_the_mapped_axis_is_the_sum_it_computes() -> None:
    """``vmap`` makes a ``psum`` over positional axes (and, in the backward pass, over none):
    a sum over the batch, split like any ``reduce_sum``, and its operand itself; not an op
    planned whole, its operands gathered."""
    graph = build(_normalised, [S((16, 8), "float32")])
    assert [s.prim for s in graph.steps if s.prim in ("psum", "reduce_sum")] == ["reduce_sum"] * 2
    assert graph.not_modelled == ()
    back = build(jax.grad(lambda x: _normalised(x).sum()), [S((16, 8), "float32")])
    assert "psum" not in {s.prim for s in back.steps} and back.not_modelled == ()


def test_x_less_the_mean_is_made_again_where_the_backward_pass_reads_it() -> None:
    """XLA fuses ``x - mean`` into each op that reads it, from ``x`` and the mean; the
    training step's backward pass reads it again, so ``x`` is held until then, and it is
    no buffer of its own."""
    graph = build(jax.grad(_loss), [{"b": S((8,), "f4"), "g": S((8,), "f4"),
                                     "w1": S((8, 8), "f4"), "w2": S((8, 4), "f4")},
                                    S((16, 8), "f4"), S((16, 4), "f4")])  # fmt: skip
    found = dict(graph.recomputed)
    subs = [v for v in found if graph.values[v].name.startswith("sub@")]
    assert subs
    lives = _live(graph)
    for v in subs:
        k = lives.arrays.index(v) if v in lives.arrays else None
        assert k is None or lives.first[k] > lives.last[k]  # (held nowhere)
        for a in found[v]:  # (what it is made from: held to its last reader)
            assert lives.last[lives.arrays.index(a)] >= graph.last[v]


def _step(params: dict[str, jax.Array], x: jax.Array, y: jax.Array) -> Any:
    value, grads = jax.value_and_grad(_loss)(params, x, y)
    return value, jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)


OFF = {
    (256, 128, "step"): (
        {"fsdp": 0.76, "data×tensor": 1.31} if heap_release() < (0, 12, 1) else {"fsdp": 0.69}
    ),
}
"""The plans whose memory is known to be off today (compiled over predicted, as measured; on
jaxlib 0.12.1 the data × tensor plan is within 20%, and the FSDP plan further off).
The loss's FSDP plan had been at 1.39: it moves the first dot's result, made split on the
batch, to its features through an all-gather and an all-to-all, and the gathered whole and
the all-to-all's pieces are held at once (:func:`~shardwise._program.copies.made_copy`)."""


@pytest.mark.parametrize(("batch", "width", "kind"),
                         [(32, 64, "step"), (32, 64, "loss"), (256, 128, "step"),
                          (256, 128, "loss")])  # fmt: skip
def test_every_plan_of_a_batch_norm_is_within_its_memory(batch: int, width: int, kind: str) -> None:
    """A BatchNorm written with ``vmap`` and ``pmean``, its loss and its training step: every
    plan runs equal to ``jax.jit``, its collectives are the compiled program's and its memory
    is within 20% but the plans of :data:`OFF`, exactly (0.67 to 0.80 of XLA's memory, every
    plan of the step at 256 × 128, when the sums were planned whole and ``x - mean`` held
    from the forward pass to the backward)."""
    keys = jax.random.split(jax.random.key(0), 4)
    params = {"w1": jax.random.normal(keys[0], (width, width)), "g": jnp.ones(width),
              "b": jnp.zeros(width), "w2": jax.random.normal(keys[1], (width, 10))}  # fmt: skip
    x, y = jax.random.normal(keys[2], (batch, width)), jax.random.normal(keys[3], (batch, 10))
    fn = _step if kind == "step" else _loss
    plan = shardwise.plan(fn, params, x, y, mesh="data=2,model=4", profile=PROFILE)
    want = jax.jit(fn)(params, x, y)
    got = plan.sharded()(params, x, y)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    off = {}
    for p in plan.verify(repeat=1).plans:
        assert p.verified is not None and p.verified.collectives_match, p.name
        ratio = p.verified.memory_bytes / p.predicted.memory_bytes
        if not 0.8 <= ratio <= 1.25:
            off[p.name] = ratio
    known = OFF.get((batch, width, kind), {})
    assert off.keys() == known.keys(), off
    for name, ratio in off.items():
        assert ratio == pytest.approx(known[name], abs=0.05), name


def test_a_gather_through_the_whole_array_holds_both_buffers() -> None:
    """An FSDP plan of Equinox's BatchNorm step reads its batch, held split on ``(data,
    model)``, split on ``model``: XLA gathers it on ``model``, then whole, then slices it,
    holding the whole batch beside the first gather (1.67x the prediction that held only
    the slice)."""
    pytest.importorskip("equinox")
    from library_models import eqx_batchnorm_step

    fn, (params, state, _, _) = eqx_batchnorm_step(width=256)
    x, y = jnp.ones((512, 256)), jnp.ones((512, 10))
    plan = shardwise.plan(fn, params, state, x, y, mesh="data=2,model=4", profile=PROFILE)
    fsdp = dataclasses.replace(plan, plans=(plan.get("fsdp"),))
    [checked] = fsdp.verify(repeat=1).plans
    assert checked.verified is not None and checked.verified.collectives_match
    assert 0.8 <= checked.verified.memory_bytes / checked.predicted.memory_bytes <= 1.25
