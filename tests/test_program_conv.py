"""Convolutions, poolings and embedding lookups planned like dots and maps: a CNN's plans split
its batch through the convolutions, an embedding table splits on its embedding or vocabulary
dimension, and every plan's collectives are the compiled HLO's, its memory within 20% of XLA's
buffers, and its results those of ``jax.jit``."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import shardwise
from shardwise._model.profile import BUILTIN
from shardwise._program.program import train_step

CPU = BUILTIN["cpu-2core"]
MESH = "data=2,model=4"


def _cnn(pool: str = "avg"):  # type: ignore[no-untyped-def]
    """A Linen CNN: two 3x3 convolutions, each pooled 2x2, then a dense head. The relu comes
    after the pooling: before it, XLA's CPU backend makes the relu's zeros an array of the
    convolution's shape, read by its pooling fusion, which the planner does not count (a
    training step's plans are then 0.6-0.7 of XLA's memory)."""
    import flax.linen as nn

    pooled = nn.avg_pool if pool == "avg" else nn.max_pool

    class CNN(nn.Module):
        @nn.compact
        def __call__(self, x):  # type: ignore[no-untyped-def]
            x = nn.relu(pooled(nn.Conv(4, (3, 3))(x), (2, 2), (2, 2)))
            x = nn.relu(pooled(nn.Conv(8, (3, 3))(x), (2, 2), (2, 2)))
            return nn.Dense(10)(x.reshape(x.shape[0], -1))

    model = CNN()
    x = jax.ShapeDtypeStruct((16, 12, 12, 1), jnp.float32)
    params = jax.eval_shape(model.init, jax.random.key(0), x)  # shapes: planning needs no more

    def forward(params, x):  # type: ignore[no-untyped-def]
        return model.apply(params, x)

    def loss(params, x, y):  # type: ignore[no-untyped-def]
        logp = jax.nn.log_softmax(model.apply(params, x))
        return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))

    return forward, loss, params, x, jax.ShapeDtypeStruct((16,), jnp.int32)


def _embedding():  # type: ignore[no-untyped-def]
    """An NNX embedding table (vocabulary 2048, 32 wide) and a dense head."""
    from flax import nnx

    class Model(nnx.Module):
        def __init__(self, rngs):  # type: ignore[no-untyped-def]
            self.embed = nnx.Embed(2048, 32, rngs=rngs)
            self.head = nnx.Linear(32, 16, rngs=rngs)

        def __call__(self, ids):  # type: ignore[no-untyped-def]
            return self.head(self.embed(ids))

    graphdef, state = nnx.split(nnx.eval_shape(lambda: Model(nnx.Rngs(0))))

    def forward(state, ids):  # type: ignore[no-untyped-def]
        return nnx.merge(graphdef, state)(ids)

    def loss(state, ids):  # type: ignore[no-untyped-def]
        return jnp.mean(forward(state, ids) ** 2)

    return forward, loss, state, jax.ShapeDtypeStruct((16, 8), jnp.int32)


def _real(args, high: int):  # type: ignore[no-untyped-def]
    """Arrays of ``args``' shapes: floats from a normal distribution, ints from 0 to ``high``."""
    rng = np.random.default_rng(1)
    leaves = [
        rng.integers(0, high, a.shape).astype(a.dtype)
        if jnp.issubdtype(a.dtype, jnp.integer)
        else rng.standard_normal(a.shape).astype(a.dtype)
        for a in jax.tree.leaves(args)
    ]
    return jax.tree.unflatten(jax.tree.structure(args), leaves)


def _verified(plan: shardwise.ProgramPlan, *names: str) -> shardwise.ProgramPlan:
    """``plan`` verified here (only the plans ``names``, if given), each plan compiled and run
    once, not timed."""

    if names:
        plan = dataclasses.replace(plan, plans=tuple(plan.get(n) for n in names))
    return plan.verify(repeat=1)


def _check(plan, fn, args, high, names=None, off=()):  # type: ignore[no-untyped-def]
    """Every plan's collectives are the HLO's and its memory within 20% of XLA's (but the
    plans ``off``, known to be further, and checked to be); the plans ``names`` (all, if
    none) give ``jax.jit(fn)``'s results."""
    for p in _verified(plan).plans:
        assert p.verified is not None and p.verified.collectives_match, p.name
        ratio = p.predicted.memory_bytes / p.verified.memory_bytes
        assert (0.8 <= ratio <= 1.2) != (p.name in off), (p.name, ratio)
    real = _real(args, high)
    want = jax.jit(fn)(*real)
    for name in names or [p.name for p in plan.plans]:
        got = plan.sharded(name)(*real)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=2e-5)


def _splits_batch(plan: shardwise.ProgramPlan, p: shardwise.PlannedLayout) -> bool:
    """Whether plan ``p`` reads the image of every forward convolution split on its batch."""
    convs = [s for s in plan.graph.steps if s.prim == "conv_general_dilated" and not s.backward]
    return bool(convs) and all(p.layouts.steps[s.key][0][0].padded(4)[0] for s in convs)


@pytest.mark.parametrize("train", [False, True], ids=["forward", "training step"])
def test_a_cnns_plans_split_its_batch_through_the_convolutions_and_match_xla(train):
    forward, loss, params, x, y = _cnn()
    fn, args = (train_step(loss), (params, x, y)) if train else (forward, (params, x))
    plan = shardwise.plan(loss if train else forward, *args, mesh=MESH, profile=CPU,
                          train=train, top=1)  # fmt: skip
    convs = [s for s in plan.graph.steps if s.prim == "conv_general_dilated"]
    assert len(convs) == (5 if train else 2) and all(s.kind == "dot" for s in convs)
    assert not plan.graph.not_modelled
    assert any(s.prim == "reduce_window_sum" and s.kind == "map" for s in plan.graph.steps)
    split = [p.name for p in plan.plans if _splits_batch(plan, p)]
    assert "data-parallel" in split, split
    _check(plan, fn, args, 10, names=["search", "data-parallel"])


def test_a_max_pool_and_its_gradient_keep_the_batch_split():
    """``select_and_scatter_add`` (a max pool's gradient) carries the batch's layout."""
    _, loss, params, x, y = _cnn("max")
    plan = shardwise.plan(loss, params, x, y, mesh=MESH, profile=CPU, train=True, top=1)
    steps = [s for s in plan.graph.steps if s.prim == "select_and_scatter_add"]
    assert steps and all(s.kind == "dot" and s.op is not None for s in steps)
    assert all(s.op.inputs[0][0] == s.op.output[0] for s in steps)  # the batch carried
    dp = plan.get("data-parallel")
    assert all(dp.layouts.steps[s.key][1].padded(4)[0] for s in steps)
    for p in _verified(plan, "search", "data-parallel").plans:
        assert p.verified is not None and p.verified.collectives_match, p.name
    real = _real((params, x, y), 10)
    got = plan.sharded("data-parallel")(*real)
    want = jax.jit(train_step(loss))(*real)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=2e-5)


def test_a_pooled_relu_of_a_biased_convolution_holds_the_convolution_beside_its_sum():
    """``avg_pool(relu(conv(x, w) + b))`` in a training step, on CPU: with the convolution
    made and held with its batch split, XLA fuses relu into its YNNPACK pooling
    (``ynn_fusion``), which reads the sum from a ``broadcast_add_fusion`` of its own and
    relu's zero made whole, while the convolution's output is kept for the backward's relu
    mask, which adds the bias again: three images where the model had two (XLA at 1.40x the
    prediction). Made with its batch split and held with its channels split (an
    ``all-to-all``), the convolution reaches the pooling through the copy that transposes it,
    which XLA fuses the sum and relu into: two images, as the model has them."""
    from shardwise._program.buffers import pooled_sums

    def loss(p, x):  # type: ignore[no-untyped-def]
        y = jax.lax.conv_general_dilated(x, p[0], (1, 1), "SAME",
                                         dimension_numbers=("NHWC", "HWIO", "NHWC"))  # fmt: skip
        y = jax.nn.relu(y + p[1])
        pooled = jax.lax.reduce_window(y, 0.0, jax.lax.add, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
        return jnp.sum((pooled / 4) ** 2)

    S = jax.ShapeDtypeStruct
    params, x = (
        (S((3, 3, 1, 8), jnp.float32), S((8,), jnp.float32)),
        S((16, 16, 16, 1), jnp.float32),
    )
    plan = shardwise.plan(jax.value_and_grad(loss), params, x, mesh="data=8", profile=CPU)
    [(_, conv, _)] = pooled_sums(plan.graph)
    [made] = [s for s in plan.graph.steps if s.output == conv]
    split = plan.get("data-parallel").layouts
    moved = plan.get("replicated").layouts
    assert split.steps[made.key][1] == split.specs[conv] and split.specs[conv].padded(4)[0]
    assert moved.steps[made.key][1] != moved.specs[conv]  # (made batch-split, then moved)
    ratios = {}
    for p in _verified(plan, "data-parallel", "replicated").plans:
        assert p.verified is not None and p.verified.collectives_match, p.name
        ratios[p.name] = p.verified.memory_bytes / p.predicted.memory_bytes
    assert 0.95 <= ratios["data-parallel"] <= 1.05, ratios
    assert 0.85 <= ratios["replicated"] <= 1.15, ratios


@pytest.mark.parametrize("train", [False, True], ids=["forward", "training step"])
def test_an_embedding_table_splits_on_its_width_or_its_vocabulary_and_matches_xla(train):
    forward, loss, state, ids = _embedding()
    fn, args = (train_step(loss), (state, ids)) if train else (forward, (state, ids))
    plan = shardwise.plan(loss if train else forward, state, ids, mesh=MESH, profile=CPU,
                          train=train, top=3)  # fmt: skip
    lookups = [s for s in plan.graph.steps if s.prim in ("gather", "scatter-add")]
    assert len(lookups) == (2 if train else 1) and all(s.kind == "dot" for s in lookups)
    _check(plan, fn, args, 2048)
    # the embedding dimension split (Megatron leaves a looked-up table whole; pinned here)
    wide = shardwise.plan(loss if train else forward, state, ids, mesh=MESH, profile=CPU,
                          train=train, top=1, fixed={plan.graph.names[0]: "-,model"})  # fmt: skip
    assert wide.chosen.in_specs[0].describe().startswith("-,")
    _check(dataclasses.replace(wide, plans=(wide.chosen,)), fn, args, 2048)


def test_a_vocabulary_split_lookup_sums_masked_rows_and_matches_xla():
    """The table split on its vocabulary: each device looks up the rows it holds (zeros for
    the others) and an all-reduce adds them up, as XLA compiles it."""
    _, _, state, ids = _embedding()
    table = jax.tree.leaves(state)[0]
    assert table.shape == (2048, 32)

    def lookup(table, ids):  # type: ignore[no-untyped-def]
        return jnp.take(table, ids, axis=0)

    plan = shardwise.plan(lookup, table, ids, mesh=MESH, profile=CPU, fixed={"table": "model"},
                          top=1)  # fmt: skip
    (step,) = [s for s in plan.graph.steps if s.prim == "gather"]
    assert step.op is not None and step.op.equation == "ve,nsz->nse"
    sums = [c for c in plan.chosen.predicted.collectives if c.kind == "all-reduce"]
    assert sums and all("model" in c.mesh_axes for c in sums)
    _check(plan, lookup, (table, ids), 2048, names=["search"])


@pytest.mark.parametrize("train", [False, True], ids=["loss", "training step"])
def test_a_gather_at_a_constant_index_keeps_its_layout(train):
    """``jnp.take(x, 0, axis=-1)`` (optax's integer-label cross-entropy picks its result
    so) is a gather whose index is a constant made on each device: read as an einsum of its
    one array, its kept dimensions carry their layout, where it had been planned whole (every
    plan gathered the per-token losses)."""
    x0 = jax.ShapeDtypeStruct((16, 8, 3), jnp.float32)
    w0 = jax.ShapeDtypeStruct((8, 4), jnp.float32)

    def loss(w, x, labels):  # type: ignore[no-untyped-def]
        return jnp.mean((jnp.tanh(jnp.take(x, 0, axis=-1) @ w) - labels) ** 2)

    y0 = jax.ShapeDtypeStruct((16, 4), jnp.float32)
    fn, args = (train_step(loss), (w0, x0, y0)) if train else (loss, (w0, x0, y0))
    plan = shardwise.plan(loss, w0, x0, y0, mesh=MESH, profile=CPU, train=train, top=3)
    picks = [s for s in plan.graph.steps if s.prim == "gather"]
    assert picks and all(s.kind == "dot" and s.op is not None for s in picks)
    assert picks[0].op.equation == "efv->ef"
    dp = plan.get("data-parallel")
    assert dp.layouts.steps[picks[0].key][0][0].padded(3)[0]  # read with its batch split
    assert not [c for c in dp.predicted.collectives if c.kind == "all-gather"]
    _check(plan, fn, args, 1)


@pytest.mark.parametrize("train", [False, True], ids=["forward", "training step"])
def test_a_concatenation_keeps_the_layout_of_the_dimensions_it_does_not_join(train):
    """Rotary embeddings rotate each head's halves with ``jnp.concatenate([-x2, x1], -1)``
    (Llama's ``rotate_half``): read as an einsum whose joined dimension is whole, the batch and
    the heads keep their split through it, where it had been planned whole (every plan then
    gathered the queries)."""
    b, t, h, d = 16, 8, 4, 8
    x0 = jax.ShapeDtypeStruct((b, t, 32), jnp.float32)
    w0 = jax.ShapeDtypeStruct((32, h, d), jnp.float32)

    def loss(x, w):  # type: ignore[no-untyped-def]
        q = jnp.einsum("btc,chd->bthd", x, w)
        half = jnp.concatenate([-q[..., d // 2 :], q[..., : d // 2]], axis=-1)
        angle = jnp.arange(t, dtype=jnp.float32)[:, None, None] / 10.0
        roped = q * jnp.cos(angle) + half * jnp.sin(angle)
        return jnp.mean(jnp.einsum("bthd,bshd->bhts", roped, roped) ** 2)

    fn, args = (train_step(loss), (x0, w0)) if train else (loss, (x0, w0))
    plan = shardwise.plan(loss, x0, w0, mesh=MESH, profile=CPU, train=train, top=3)
    joins = [s for s in plan.graph.steps if s.prim == "concatenate"]
    assert joins and all(s.kind == "dot" and s.op is not None for s in joins)
    assert joins[0].op.equation == "abcd,abce->abcf"
    assert not [s for s in plan.graph.steps if s.kind == "opaque"]
    dp = plan.get("data-parallel")
    assert all(dp.layouts.steps[s.key][1].padded(4)[0] for s in joins)  # the batch split
    assert not [c for c in dp.predicted.collectives if c.kind == "all-gather"]
    # (known off in the training step, 0.78 of XLA's 18 KB: the model's temporaries are
    # shorter-lived than XLA's fusions, so six of them fit in the result's buffer where XLA
    # puts three, and XLA's heap holds a 4 KB copy of w the model does not count)
    _check(plan, fn, args, 1, off=("search", "data-parallel") if train else ())


def test_a_cache_written_at_a_position_keeps_its_batch_and_heads_split():
    """A KV cache written one step at a time (``lax.dynamic_update_slice`` at a position
    known only when it runs): read as an einsum whose written dimension is whole, the batch
    and heads keep their split through the update, where it had been planned whole."""
    b, t, h, d = 16, 8, 4, 8
    cache0 = jax.ShapeDtypeStruct((b, t, h, d), jnp.float32)
    new0 = jax.ShapeDtypeStruct((b, 1, h, d), jnp.float32)
    pos0 = jax.ShapeDtypeStruct((), jnp.int32)

    def step(cache, new, pos):  # type: ignore[no-untyped-def]
        cache = jax.lax.dynamic_update_slice(cache, new, (0, pos, 0, 0))
        scores = jnp.einsum("bqhd,bkhd->bhqk", new, cache)
        return cache, jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores), cache)

    plan = shardwise.plan(step, cache0, new0, pos0, mesh=MESH, profile=CPU, top=3)
    (update,) = [s for s in plan.graph.steps if s.prim == "dynamic_update_slice"]
    assert update.kind == "dot" and update.op is not None
    assert not [s for s in plan.graph.steps if s.kind == "opaque"]
    dp = plan.get("data-parallel")
    assert dp.layouts.steps[update.key][1].padded(4)[0]  # the batch split
    assert not dp.predicted.collectives
    _check(plan, step, (cache0, new0, pos0), t)


def test_rows_overwritten_at_positions_keep_the_width_split():
    """``x.at[ids].set(rows)`` (a scatter that overwrites whole rows): read as an einsum whose
    ids' dimensions stay whole, the rows' width keeps its split through it, where it had
    been planned whole; the update of an argument is made in a copy of it. The FSDP plan's
    memory is off (0.76 of XLA's): XLA gathers the result over two axes in two steps and
    holds the first's result beside the second's, which the model does not count."""
    table0 = jax.ShapeDtypeStruct((64, 32), jnp.float32)
    ids0 = jax.ShapeDtypeStruct((8,), jnp.int32)
    rows0 = jax.ShapeDtypeStruct((8, 32), jnp.float32)

    def write(table, ids, rows):  # type: ignore[no-untyped-def]
        return jnp.tanh(table.at[ids].set(rows * 2.0)) @ jnp.ones((32, 4), jnp.float32)

    plan = shardwise.plan(write, table0, ids0, rows0, mesh=MESH, profile=CPU, top=3,
                          fixed={"table": "-,model"})  # fmt: skip
    (step,) = [s for s in plan.graph.steps if s.prim == "scatter"]
    assert step.kind == "dot" and step.op is not None
    assert plan.chosen.layouts.steps[step.key][1].padded(2)[1] == ("model",)
    _check(plan, write, (table0, ids0, rows0), 64, off=("fsdp",))
