"""The program planner's memory model against XLA's buffers (``memory_analysis()``) for the
buffers that real layers add on CPU: the partial sums of a dot contracted over split devices,
held beside their sum, and the loop that draws a dropout mask's random bits."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shardwise
from shardwise._program.bins import Temps
from shardwise._program.nodes import Step
from shardwise._program.sums import together

PROFILE = "cpu-2core"


def _verified(plan: shardwise.ProgramPlan) -> shardwise.ProgramPlan:
    """Every plan compiled and run once, not timed."""
    return plan.verify(repeat=1)


def _ratios(plan: shardwise.ProgramPlan) -> dict[str, float]:
    """Compiled over predicted memory per device, by plan; every plan's collectives checked."""
    out = {}
    for p in _verified(plan).plans:
        assert p.verified is not None and p.verified.collectives_match, p.name
        out[p.name] = p.verified.memory_bytes / p.predicted.memory_bytes
    return out


def _mlp(dropout: bool):  # type: ignore[no-untyped-def]
    """Three layers (``hk.nets.MLP([64, 64, 16])``'s), a dropout mask on the first's output."""

    def forward(params, x, key):  # type: ignore[no-untyped-def]
        h = jax.nn.relu(x @ params["w1"] + params["b1"])
        if dropout:
            keep = jax.random.bernoulli(key, 0.5, h.shape)
            h = jnp.where(keep, h / 0.5, 0.0)
        h = jax.nn.relu(h @ params["w2"] + params["b2"])
        return h @ params["w3"] + params["b3"]

    rng = np.random.default_rng(0)
    params = {
        "w1": rng.standard_normal((32, 64), np.float32),
        "b1": np.zeros(64, np.float32),
        "w2": rng.standard_normal((64, 64), np.float32),
        "b2": np.zeros(64, np.float32),
        "w3": rng.standard_normal((64, 16), np.float32),
        "b3": np.zeros(16, np.float32),
    }
    x = rng.standard_normal((64, 32), np.float32)
    return forward, (params, x, jax.random.key(1))


def test_a_row_parallel_dot_holds_its_partial_sums_beside_their_sum() -> None:
    """Megatron's second weight is split on its input rows: each device's dot makes a partial
    sum of the whole output, which the all-reduce sums into a new buffer, not over it (the
    model had counted one, and put Megatron 1.46× and data × tensor 1.28× low on an MLP of
    this size)."""
    fn, args = _mlp(dropout=False)
    plan = shardwise.plan(fn, *args, mesh="data=2,model=4", profile=PROFILE)
    ratios = _ratios(plan)
    assert {"megatron", "data×tensor"} <= set(ratios)
    for name, ratio in ratios.items():
        assert 0.85 <= ratio <= 1.15, (name, ratio)


def test_a_dropout_mask_holds_the_loop_that_draws_its_bits() -> None:
    """On CPU, XLA draws random bits in a loop over two counter arrays of the bits' shape,
    carried round and remade each turn: four blocks of the mask's layout, held while the
    activations it masks are made (the model had counted none, and put every plan of a
    dropout MLP 1.3–1.97× low)."""
    fn, args = _mlp(dropout=True)
    plan = shardwise.plan(fn, *args, mesh="data=2,model=4", profile=PROFILE)
    assert plan.graph.drawn and plan.graph.drawn[0][1] == (64, 64)
    ratios = _ratios(plan)
    assert len(ratios) >= 5
    for name, ratio in ratios.items():
        assert 0.8 <= ratio <= 1.25, (name, ratio)
    want = jax.jit(fn)(*args)
    got = plan.sharded()(*args)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


def test_the_draws_are_counted_only_on_cpu() -> None:
    """Elsewhere the hash is unrolled and fused into the ops that read the bits: a profile of
    another platform predicts no loop."""
    from shardwise._program.memory import peak_bytes

    fn, args = _mlp(dropout=True)
    plan = shardwise.plan(fn, *args, mesh="data=2,model=4", profile=PROFILE)
    chosen = plan.chosen
    on_cpu = peak_bytes(plan.graph, chosen.layouts, plan.mesh, "cpu")
    no_draws = dataclasses.replace(plan.graph, drawn=())
    assert on_cpu > peak_bytes(no_draws, chosen.layouts, plan.mesh, "cpu")
    assert peak_bytes(plan.graph, chosen.layouts, plan.mesh, "gpu") == peak_bytes(
        no_draws, chosen.layouts, plan.mesh, "gpu"
    )


def _dropout_step(rows: int, features: int, units: int):  # type: ignore[no-untyped-def]
    """A training step with a key carried in its state: a dropout mask on ``relu(x @ w)``,
    an SGD update, and a metric that reads the mask (and the product) again."""

    def step(state, x):  # type: ignore[no-untyped-def]
        key, sub = jax.random.split(state["key"])
        mask = jax.random.bernoulli(sub, 0.7, (x.shape[0], units))
        masked = lambda w: jnp.where(mask, jax.nn.relu(x @ w), 0.0)  # noqa: E731
        loss, g = jax.value_and_grad(lambda w: jnp.mean(masked(w) ** 2))(state["w"])
        new = {"key": key, "w": state["w"] - 0.1 * g}
        return new, {"loss": loss, "h": (masked(state["w"]) / 0.7).mean()}

    rng = np.random.default_rng(0)
    state = {"key": jax.random.key(0), "w": rng.standard_normal((features, units), np.float32)}
    return step, (state, rng.standard_normal((rows, features), np.float32))


def _compiled_over_predicted(plan: shardwise.ProgramPlan, name: str, args) -> float:  # type: ignore[no-untyped-def]
    """Compiled over predicted memory per device of one plan, compiled (not run)."""
    m = plan.sharded(name).lower(*args).compile().memory_analysis()
    held = m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
    return (held - m.alias_size_in_bytes) / plan.get(name).predicted.memory_bytes


def test_the_draw_is_counted_where_xla_runs_it_after_the_gathered_weights_are_read() -> None:
    """The threefry loop needs only the key: XLA's scheduler runs it as late as its readers
    allow, after the dot that reads the gathered weights (FSDP), which are freed by then (the
    model had put the four blocks of the loop at the draw, beside the weights gathered at the
    program's start: 28936 bytes a device predicted, 20152 compiled)."""
    step, args = _dropout_step(16, 32, 64)
    plan = shardwise.plan(step, *args, mesh="data=2,model=4", profile=PROFILE, top=1)
    assert 0.8 <= _compiled_over_predicted(plan, "fsdp", args) <= 1.2


def test_gathers_along_one_dimension_are_copied_back_once() -> None:
    """The CPU backend gathers along a dimension but the first in a transposed layout and
    copies the result back: once after two gathers one after another along the same
    dimension (a CNN's channels gathered over ``data`` then ``model`` before its flatten; two
    copies had put the CNN's Megatron baseline at 0.78 of XLA's buffers), once per dimension
    where they gather along two."""
    from shardwise._model.mesh import MeshSpec
    from shardwise._model.spec import Spec
    from shardwise._program.moves import relayout_bytes, shard_bytes
    from shardwise._program.nodes import Value

    mesh = MeshSpec((("data", 2), ("model", 4)))
    image = Value((16, 8, 8, 8), "float32", "x", "")
    channels = Spec(((), (), (), ("data", "model")))
    assert relayout_bytes(image, channels, Spec(()), mesh) == image.nbytes
    both = Spec(((), ("data",), (), ("model",)))
    assert relayout_bytes(image, both, Spec(()), mesh) > image.nbytes
    rows = Spec((("data", "model"),))
    assert relayout_bytes(image, rows, Spec(()), mesh) == 0
    assert shard_bytes(image, channels, mesh) == image.nbytes // 8


@pytest.mark.parametrize("train", [True, False], ids=["SGD step", "value and grad"])
def test_a_training_steps_weights_and_gradients_are_held_as_xla_holds_them(train):
    """Two things XLA does in every training step: it folds a transposed weight (``x @ w.T``)
    into the matrix product, never making it (held from the forward pass to the backward, it
    had put the replicated baseline of this 4-layer MLP's SGD step at 0.73 of XLA's buffers);
    and it sums every weight gradient's partial sums in one all-reduce after the backward
    pass, holding them all until then (freed at once, they had put the data-parallel
    baseline 1.14× low)."""
    import itertools

    S = jax.ShapeDtypeStruct
    sizes = [32, 64, 64, 64, 16]
    params = [(S((b, a), "float32"), S((b,), "float32")) for a, b in itertools.pairwise(sizes)]

    def loss(params, x, y):  # type: ignore[no-untyped-def]
        for w, b in params[:-1]:
            x = jnp.tanh(x @ w.T + b)
        w, b = params[-1]
        return jnp.mean((x @ w.T + b - y) ** 2)

    fn = loss if train else (lambda *a: jax.value_and_grad(loss)(*a))
    x, y = S((64, 32), "float32"), S((64, 16), "float32")
    plan = shardwise.plan(fn, params, x, y, mesh="data=2,model=4", profile=PROFILE, train=train)
    ratios = _ratios(plan)
    assert {"replicated", "data-parallel"} <= set(ratios)
    for name, ratio in ratios.items():
        assert 0.85 <= ratio <= 1.15, (name, ratio)


def test_a_gradient_moved_by_an_all_to_all_holds_its_slices_and_pieces():
    """On CPU an all-to-all sends each device's slices of its block and brings the others'
    pieces, one buffer per device: both are held beside each other in the heap, never in
    the new weight's buffer. The built-in MLP's training step has runners-up that move a
    weight's gradient so (the model held one block and put them at 1.19× and 1.31×); every
    plan is within 10% of XLA's memory."""
    from shardwise._program.models import model

    fn, args = model("mlp", batch=16, hidden=256, ffn=1024, train=True)
    plan = shardwise.plan(fn, *args, mesh="data=2,model=4", profile=PROFILE, train=True)
    moved = [
        p.name
        for p in plan.plans
        if any(c.kind == "all-to-all" and c.bytes == 128 * 1024 for c in p.predicted.collectives)
    ]
    assert moved  # (a plan that moves a 128 KiB gradient block by an all-to-all)
    for name, ratio in _ratios(plan).items():
        assert 0.9 <= ratio <= 1.1, (name, ratio)


def test_a_plan_on_one_device_holds_what_xla_holds():
    """On a one-device mesh every layout gives the device the whole array, whatever axis it
    names: no copy between two of them is counted (each had been, and this 4-layer MLP's
    training step was predicted at 1.27× XLA's buffers)."""
    S = jax.ShapeDtypeStruct

    def loss(ws, x):  # type: ignore[no-untyped-def]
        for w in ws[:-1]:
            x = jnp.tanh(x @ w)
        return jnp.mean((x @ ws[-1]) ** 2)

    ws = [S((256, 256), "float32") for _ in range(4)]
    plan = shardwise.plan(jax.value_and_grad(loss), ws, S((256, 256), "float32"), mesh="x=1",
                          profile=PROFILE)  # fmt: skip
    ratios = _ratios(plan)
    assert ratios
    for name, ratio in ratios.items():
        assert 0.95 <= ratio <= 1.05, (name, ratio)


def test_a_plan_on_one_device_takes_layouts_that_name_its_axis():
    """A layout that names the one device's axis is the whole array: a fixed input, a
    constraint in the code and a baseline's batch split all plan (each had been refused, as
    a layout the array's shape does not divide)."""
    from jax.sharding import PartitionSpec as P

    S = jax.ShapeDtypeStruct

    def f(w, x):  # type: ignore[no-untyped-def]
        x = jax.lax.with_sharding_constraint(x, P("x"))
        return jnp.tanh(x @ w).sum()

    w, x = S((64, 64), "float32"), S((64, 64), "float32")
    fixed = shardwise.plan(f, w, x, mesh="x=1", fixed={"x": "x"}, profile=PROFILE)
    held = shardwise.plan(f, w, x, mesh="x=1", respect="constraints", profile=PROFILE)
    for plan in (fixed, held):
        assert all(s.describe() == "replicated" for s in plan.chosen.in_specs)
        assert {"data-parallel", "fsdp"} <= {p.name for p in plan.plans}, plan.skipped


def _bfloat16_forward():  # type: ignore[no-untyped-def]
    """Two bfloat16 layers on a float32 batch, the result back in float32."""

    def forward(w1, w2, x):  # type: ignore[no-untyped-def]
        h = jax.nn.relu(x.astype(jnp.bfloat16) @ w1)
        return (h @ w2).astype(jnp.float32)

    rng = np.random.default_rng(0)
    w1 = jnp.asarray(rng.standard_normal((64, 256)), jnp.bfloat16)
    w2 = jnp.asarray(rng.standard_normal((256, 64)), jnp.bfloat16)
    return forward, (w1, w2, rng.standard_normal((64, 64), np.float32))


def test_bfloat16_is_held_as_float32_on_cpu() -> None:
    """XLA's CPU backend computes bfloat16 in float32 up to jaxlib 0.11: each bfloat16 weight
    is converted to a float32 copy as the program starts, and every bfloat16 array the
    program makes is a float32 buffer (the model had counted them at 2 bytes, and put every
    plan of this program 1.6-2.8x low). From jaxlib 0.12 it computes them as they are and
    moves them in float32: a gathered weight's float32 all-gather, converted back for its dot
    (counted at float32 throughout, every plan had been 1.15-2.8x high)."""
    fn, args = _bfloat16_forward()
    plan = shardwise.plan(fn, *args, mesh="data=2,model=4", profile=PROFILE)
    ratios = _ratios(plan)
    for name in ("search", "replicated", "data-parallel", "data×tensor"):
        assert 0.85 <= ratios[name] <= 1.15, (name, ratios[name])


def test_bfloat16_is_held_as_itself_elsewhere() -> None:
    """On GPUs and TPUs bfloat16 is computed as it is: the same plan holds half as much as on
    a CPU that computes it in float32 (jaxlib up to 0.11), and as much as on one that
    computes it as it is (jaxlib 0.12: the replicated plan moves nothing in float32)."""
    from shardwise._program.memory import peak_bytes
    from shardwise._versions import halves_cpu_computes_in_float32

    fn, args = _bfloat16_forward()
    plan = shardwise.plan(fn, *args, mesh="data=2,model=4", profile=PROFILE)
    lay = plan.get("replicated").layouts
    w, x = 64 * 256, 64 * 64  # elements of each weight, of the batch
    on_cpu = peak_bytes(plan.graph, lay, plan.mesh, "cpu")
    on_gpu = peak_bytes(plan.graph, lay, plan.mesh, "gpu")
    if "bfloat16" in halves_cpu_computes_in_float32():
        assert on_cpu - on_gpu >= 2 * w * 2  # (the weights' float32 copies, at least)
    else:
        assert on_cpu == on_gpu
    assert on_gpu <= 2 * w * 2 + 4 * x * 2 + 2 * x + 2 * 64 * 256 * 2  # (all held at 2 bytes)


def test_a_dot_to_float32_reads_bfloat16_as_it_is_on_cpu() -> None:
    """A dot of bfloat16 operands that makes float32 (``preferred_element_type``) is one
    fused dot on CPU, with no float32 copies of its operands (the model had counted them,
    and put its plans 2.5x over the compiled memory)."""
    x = jnp.ones((16, 32), jnp.bfloat16)
    w = jnp.ones((32, 64), jnp.bfloat16)

    def f(x, w):  # type: ignore[no-untyped-def]
        return jax.lax.dot(x, w, preferred_element_type=jnp.float32)

    ratios = _ratios(shardwise.plan(f, x, w, mesh="data=2,model=4", profile=PROFILE))
    for name in ("search", "replicated", "data-parallel", "megatron"):
        assert 0.85 <= ratios[name] <= 1.15, (name, ratios[name])


def test_an_argument_updated_and_returned_is_updated_in_the_results_buffer() -> None:
    """A KV cache written at a position and returned: XLA copies the argument into the
    result's buffer and writes the update there, with no temporary (the model had counted a
    copy beside the result, and put every split plan 1.5x over the compiled memory)."""
    cache = jnp.zeros((8, 16, 4, 8))
    new = jnp.ones((8, 1, 4, 8))

    def write(cache, new, pos):  # type: ignore[no-untyped-def]
        return jax.lax.dynamic_update_slice(cache, new, (0, pos, 0, 0))

    plan = shardwise.plan(write, cache, new, jnp.int32(3), mesh="data=2,model=4", profile=PROFILE)
    ratios = _ratios(plan)
    assert len(ratios) >= 3
    for name, ratio in ratios.items():
        assert 0.85 <= ratio <= 1.15, (name, ratio)


def test_a_relus_input_is_held_until_the_backward_pass_reads_its_mask():
    """``relu``'s gradient reads its mask ``x > 0``, an elementwise value no step reads: XLA
    computes it there from ``x``, which it keeps from the forward pass (seen in the compiled
    HLO: the backward fusion reads the convolution's output), so the model holds ``x`` until
    then; it had ``x`` freed after the forward pass and predicted a CNN's batch-split training
    step at 0.77 of XLA's memory."""
    from shardwise._program.graph import build

    def loss(w, x):  # type: ignore[no-untyped-def]
        return jnp.sum(jnp.tanh(jax.nn.relu(x @ w)))

    S = jax.ShapeDtypeStruct
    w, x = S((32, 64), "float32"), S((16, 32), "float32")
    graph = build(lambda w, x: jax.grad(loss)(w, x), [w, x])
    [pre] = [v for s in graph.steps if s.kind == "dot" and not s.backward for v in [s.output]]
    [mask] = [v for v, value in enumerate(graph.values) if value.name.startswith("gt@")]
    selects = [v for v, value in enumerate(graph.values) if value.name.startswith("select_n@")]
    assert mask not in graph.fed and selects  # (fused: made inside the select that reads it)
    assert graph.last[pre] == graph.last[mask] >= max(graph.born[s] for s in selects)


def test_temporaries_before_a_result_is_made_are_kept_in_its_buffer(monkeypatch) -> None:
    """XLA gives each result a buffer for the whole program and keeps temporaries in it until
    the result is made (seen in the buffer assignment of this FSDP step: the partial sums, the
    gathered gradient of the output and the weight gradients in the new weights' buffers, 2.1
    MB left in the heap): the prediction is within 10% of XLA's memory, where holding every
    temporary in the heap put it 1.2× over."""
    from shardwise._program import memory

    fn, args = shardwise.model("mlp", batch=256, hidden=1024, ffn=4096, train=True)
    plan = shardwise.plan(fn, *args, mesh="data=2,model=4", profile=PROFILE, train=True)
    fsdp = dataclasses.replace(plan, plans=(plan.get("fsdp"),))
    [ratio] = _ratios(fsdp).values()
    assert 0.9 <= ratio <= 1.1, ratio
    monkeypatch.setattr(memory, "placed", lambda temps, *_: np.full(len(temps.size), -1))
    apart = shardwise.plan(fn, *args, mesh="data=2,model=4", profile=PROFILE, train=True)
    held_apart = apart.get("fsdp").predicted.memory_bytes
    assert held_apart > 1.15 * plan.get("fsdp").predicted.memory_bytes


def test_a_result_buffer_takes_one_temporary_at_a_time_the_largest_first() -> None:
    """The temporaries go, largest first, each to the smallest result buffer it fits in, one
    at a time in each, never while the result or a loop is alive."""
    from shardwise._program.bins import Temps, placed

    t = Temps()
    for start, end, size in [(0, 3, 8), (1, 2, 4), (2, 5, 4), (6, 7, 4), (9, 9, 4)]:
        t.add(start, end, size)
    # the 8-byte one takes the big buffer; the first 4-byte one the small; the next overlaps
    # both; the fourth is in a loop; the last comes once both results are made
    assert placed(t, [(8, 8), (4, 8)], loops=[(6, 7)]).tolist() == [0, 1, -1, -1, -1]
    assert placed(t, [(2, 9)]).tolist() == [-1] * 5  # (none fits)
    assert not placed(Temps(), [(4, 4)]).size


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 30), st.integers(0, 12), st.integers(1, 64)), max_size=40),
    st.lists(st.tuples(st.integers(1, 64), st.integers(0, 45)), max_size=6),
    st.lists(st.tuples(st.integers(0, 40), st.integers(0, 6)), max_size=2),
)
def test_temporaries_placed_in_results_buffers_never_overlap_and_none_is_left_that_fits(
    lives, buffers, loops
) -> None:
    """Whatever the temporaries and buffers: each placed temporary fits its buffer, ends
    before the result is written there, shares it with no other at the same time and runs
    in no loop; each one left in the heap found every buffer it fits in taken, while it lives,
    by a temporary placed before it (as large or larger)."""
    from shardwise._program.bins import Temps, placed

    temps = Temps()
    for start, length, size in lives:
        temps.add(start, start + length, size)
    spans = [(first, first + length) for first, length in loops]
    homes = placed(temps, buffers, spans).tolist()
    order = sorted(range(len(homes)), key=lambda t: (-temps.size[t], temps.start[t]))
    rank = {t: k for k, t in enumerate(order)}

    def overlap(a: int, b: int) -> bool:
        return temps.start[a] <= temps.end[b] and temps.start[b] <= temps.end[a]

    def in_loop(t: int) -> bool:
        return any(temps.start[t] <= last and first <= temps.end[t] for first, last in spans)

    for t, b in enumerate(homes):
        if b >= 0:
            assert temps.size[t] <= buffers[b][0] and temps.end[t] < buffers[b][1]
            assert not in_loop(t)
            assert not [u for u, c in enumerate(homes) if c == b and u != t and overlap(t, u)]
        elif not in_loop(t):
            for b, (size, until) in enumerate(buffers):
                if temps.size[t] <= size and temps.end[t] < until:
                    taken = [u for u, c in enumerate(homes) if c == b and overlap(t, u)]
                    assert any(rank[u] < rank[t] for u in taken), (t, b)


def _dot(inputs: tuple[int, ...], output: int, repeat: int = 1) -> Step:
    return Step(kind="dot", prim="dot_general", inputs=inputs, output=output, source="",
                repeat=repeat, key=(output,))  # fmt: skip


def test_partial_sums_of_dots_that_read_one_activation_are_held_until_the_last_is_made():
    """XLA sums the partial sums of a layer's query, key and value projections (three dots
    that read one activation, ``0``) with one all-reduce after the last: each is held from
    its dot to there, and a scattered result's whole sum is made there (the model had held
    each at its dot alone, and a 2-block GPT's FSDP plan compiled to 1.30x its prediction).
    Summed apart: a dot that reads what elementwise ops make of a group's result (``9``, in
    the class of the query's ``4``), a dot summed over other mesh axes, one in a loop's body
    (run four times), and a dot that reads none of the group's operands."""
    import types

    graph = types.SimpleNamespace(find=lambda v: 4 if v == 9 else v)
    q, k, v = _dot((0, 1), 4), _dot((0, 2), 5), _dot((0, 3), 6)
    x = frozenset({"x"})
    summed = [(10, 64, 1, q, x), (12, 64, 2, k, x), (14, 64, 1, v, x)]  # (k scattered)
    summed.append((16, 32, 1, _dot((0, 9), 7), x))  # reads the scaled query
    summed.append((17, 32, 1, _dot((0, 8), 10), frozenset({"y"})))  # over y
    summed.append((18, 32, 1, _dot((0, 8), 11, repeat=4), frozenset({"y"})))  # in a loop
    summed.append((20, 8, 1, _dot((12, 13), 14), frozenset({"y"})))
    temps = Temps()
    together(graph, summed, temps)  # type: ignore[arg-type]
    held = list(zip(temps.start, temps.end, temps.size, strict=True))
    assert held == [(10, 14, 64), (12, 14, 64), (14, 14, 64), (14, 14, 64), (16, 16, 32),
                    (17, 17, 32), (18, 18, 32), (20, 20, 8)]  # fmt: skip


W_CLOSED = np.full((256, 256), 0.01, np.float32)
"""A weight closed over by the function below (defined at a module's top level)."""


@pytest.mark.parametrize("made", ["mask", "closed over"])
def test_an_array_the_program_makes_or_closes_over_is_held_whole(made):
    """A causal mask made inside the function, and a weight it closes over, each 256 KiB:
    every plan holds it whole on each device, as XLA does (left out, every plan was predicted
    at a tenth of its memory, and a 64 KiB budget was taken for met)."""

    def forward(x):  # type: ignore[no-untyped-def]
        m = jnp.tril(jnp.ones((256, 256))) if made == "mask" else jnp.asarray(W_CLOSED)
        return jnp.tanh(x @ m)

    x = jax.ShapeDtypeStruct((8, 256), "float32")
    plan = shardwise.plan(forward, x, mesh="data=2,model=4", profile=PROFILE, budget=None)
    for name, ratio in _ratios(plan).items():
        assert 0.9 <= ratio <= 1.1, (name, ratio)
    with pytest.raises(shardwise.ArgumentError, match="needs 2"):  # (KiB: the mask's 256)
        shardwise.plan(forward, x, mesh="data=2,model=4", profile=PROFILE, budget="64KiB")


def test_a_bfloat16_weights_float32_copy_is_freed_after_its_last_dot() -> None:
    """A bfloat16 training step on CPU: each weight's float32 copy (XLA's CPU dots compute in
    float32) is freed after the last dot that reads it, not held to the update that reads the
    weight itself. Held to the update, every plan was predicted at 1.3-1.8x its compiled
    memory; the data-parallel plan is now exact, and the median plan at 1.26x (the replicated
    plan stays at 1.66x: XLA updates each weight as soon as its gradient is whole, where the
    model keeps the program's order). With jaxlib 0.12, whose dots compute bfloat16 as it is
    (no float32 copies), the data-parallel plan is exact through its gradients' float32
    all-reduce (counted at 2 bytes, it had been at 0.67x), the median plan at 0.98x and the
    replicated at 1.37x."""

    def loss(params, x):  # type: ignore[no-untyped-def]
        h = jnp.tanh(x @ params["w1"])
        return jnp.mean((h @ params["w2"]).astype(jnp.float32) ** 2)

    bf16 = jnp.bfloat16
    params = {"w1": jax.ShapeDtypeStruct((64, 256), bf16),
              "w2": jax.ShapeDtypeStruct((256, 64), bf16)}  # fmt: skip
    plan = shardwise.plan(loss, params, jax.ShapeDtypeStruct((16, 64), bf16),
                          mesh="data=2,model=4", profile=PROFILE, train=True)  # fmt: skip
    over = {name: 1 / ratio for name, ratio in _ratios(plan).items()}  # predicted / compiled
    assert 0.95 <= over["data-parallel"] <= 1.05, over
    assert float(np.median(list(over.values()))) <= 1.3, over


def test_an_arguments_conversion_is_made_as_the_program_starts() -> None:
    """A float32 stack over bfloat16 weights (a Flax model with bfloat16 parameters computes
    in float32): XLA converts every weight, or the slice of it a dot reads, before the first
    layer, and holds each until its dot. Counted at each layer's own point, six of the ten
    plans were at 1.39-1.59x their compiled memory (a 2-block NNX GPT at 1.94x); every plan
    is within 20% (the slices at 0.88-1.0x)."""

    def stack(x, ws):  # type: ignore[no-untyped-def]
        for w in ws:
            x = jnp.tanh(x @ w.astype(jnp.float32))
        return x

    ws = [jax.ShapeDtypeStruct((128, 128), jnp.bfloat16) for _ in range(4)]
    plan = shardwise.plan(stack, jax.ShapeDtypeStruct((32, 128), jnp.float32), ws,
                          mesh="data=2,model=4", profile=PROFILE)  # fmt: skip
    ratios = _ratios(plan)
    assert len(ratios) == len(plan.plans)
    assert all(0.8 <= r <= 1.25 for r in ratios.values()), ratios


def test_float16_is_moved_and_summed_at_float16() -> None:
    """A float16 MLP: the CPU backend computes its dots in float32, but converts what a
    collective moves to float16 first (a dot's partial sums, all-reduced, then sliced to the
    device's block of a scattered result; a gathered weight, converted again for the dot
    that reads it). Counted at float32, the whole sums had put the FSDP and data-parallel
    plans at 0.76x and 0.78x XLA's memory; every plan is within 20% (0.97-1.06x)."""

    def forward(x, w1, w2):  # type: ignore[no-untyped-def]
        return jnp.tanh(x @ w1) @ w2

    S = jax.ShapeDtypeStruct
    args = (S((64, 512), jnp.float16), S((512, 512), jnp.float16), S((512, 256), jnp.float16))
    plan = shardwise.plan(forward, *args, mesh="data=2,model=4", profile=PROFILE)
    ratios = _ratios(plan)
    assert len(ratios) == len(plan.plans)
    assert all(0.8 <= r <= 1.25 for r in ratios.values()), ratios


def _stacked_layers(ws, x):  # type: ignore[no-untyped-def]
    def layer(h, w):  # type: ignore[no-untyped-def]
        return jnp.tanh(h @ w), None

    h, _ = jax.lax.scan(layer, x, ws)
    return h.sum()


@pytest.mark.parametrize(
    ("name", "layers", "dtype"),
    [("data×tensor", 4, "float32"), ("data×tensor", 4, "bfloat16"), ("fsdp", 8, "float32")],
    ids=["layers over one axis", "bfloat16", "layers over two axes"],
)
def test_a_stack_split_along_its_layers_is_gathered_whole_before_the_loop(name, layers, dtype):
    """A scan's stack split along the dimension it scans over is gathered whole before the
    while loop, which slices a layer of the gathered stack in each iteration: XLA holds the
    gathered stack while the loop runs (counting one layer's slice had put these plans at
    0.43x, 0.46x and 0.18x XLA's memory), and, gathered over two axes, the first gather
    beside the second."""
    S = jax.ShapeDtypeStruct
    args = (S((layers, 256, 256), dtype), S((128, 256), dtype))
    p = shardwise.plan(_stacked_layers, *args, mesh="data=2,model=4", profile=PROFILE, top=1)
    q = p.get(name)
    assert q.layouts.specs[p.graph.inputs[0]].padded(3)[0]  # (split along its layers)
    mesh = jax.make_mesh((2, 4), ("data", "model"))
    stats = p.sharded(name, mesh=mesh).lower(*args).compile().memory_analysis()
    xla = stats.argument_size_in_bytes + stats.output_size_in_bytes + stats.temp_size_in_bytes
    assert 0.8 <= q.predicted.memory_bytes / xla <= 1.2


def test_an_argument_nothing_reads_takes_no_memory() -> None:
    """``jax.jit`` drops an argument the program never reads (here, one read only by dead
    code), so the compiled program holds no buffer for it: counted whole on every device, it
    had put every plan at 5x XLA's memory, and the search had kept it whole."""

    def fn(x, w):  # type: ignore[no-untyped-def]
        jnp.sum(jnp.einsum("ab,bc->abc", x, w), axis=2)  # (dead: nothing reads it)
        return jnp.tanh(x)

    S = jax.ShapeDtypeStruct
    args = S((64, 64), "float32"), S((64, 64), "float32")
    p = shardwise.plan(fn, *args, mesh="x=8", profile=PROFILE, top=2)
    for ratio in _ratios(p).values():
        assert 0.8 <= ratio <= 1.2


def _embed(tokens, table, w):  # type: ignore[no-untyped-def]
    return (table[tokens] @ w).sum(-1)


_EMBED = (
    jax.ShapeDtypeStruct((64, 128), "int32"),
    jax.ShapeDtypeStruct((8192, 512), "float32"),
    jax.ShapeDtypeStruct((512, 1024), "float32"),
)


@pytest.fixture(scope="module")
def embed_ratios() -> dict[str, float]:
    """An embedding looked up, projected and summed: predicted over compiled memory, by plan."""
    p = shardwise.plan(_embed, *_EMBED, mesh="data=2,model=4", profile=PROFILE, top=1)
    return {name: 1 / ratio for name, ratio in _ratios(p).items()}


@pytest.mark.parametrize("name", ["data-parallel", "data×tensor", "megatron"])
def test_a_dot_that_only_a_sum_reads_is_fused_into_it(embed_ratios, name) -> None:  # type: ignore[no-untyped-def]
    """``(e @ w).sum(-1)`` on CPU: XLA fuses the dot into the sum and never stores its
    ``(64,128,1024)`` result; counted, every plan was at 1.18-1.2x XLA's memory."""
    assert 0.95 <= embed_ratios[name] <= 1.05, embed_ratios


def test_a_moved_results_operand_copies_and_a_relayout_are_freed_early(embed_ratios) -> None:  # type: ignore[no-untyped-def]
    """The FSDP plan of the embedding: the lookup reads the table split along its columns
    (a 4 MiB copy) and makes its result split another way, then moves it by an all-to-all; XLA
    frees the table's copy before it moves the result (counted together, they had put the plan
    at 1.58x), and frees the transposed buffer the weight ``w`` is gathered in along its
    columns once it is copied back (held to the dot, it had left the plan at 1.39x)."""
    assert 0.95 <= embed_ratios["fsdp"] <= 1.05, embed_ratios


@pytest.mark.parametrize(
    ("fn", "dtype", "rows"),
    [
        (lambda x, w: (x @ w).max(-1), "float32", (2048, 512)),
        (lambda x, w: jnp.tanh(x @ w + 1.0).mean(-1), "float32", (2048, 512)),
        (lambda x, w: (x @ w).sum(-1), "bfloat16", (2048, 512)),
        (lambda x, w: (x @ w).sum(-1), "float16", (2048, 512)),
        (lambda x, w: (x.T @ w).sum(-1), "float32", (512, 2048)),
    ],
    ids=["max", "elementwise ops between", "bfloat16", "float16: stored", "x.T @ w: stored"],
)
def test_which_dots_the_cpu_backend_fuses_into_a_reduction(fn, dtype, rows) -> None:  # type: ignore[no-untyped-def]
    """XLA's CPU backend fuses a float32 dot, contracted over its left operand's last
    dimension, into the one reduction that reads it (counted, the replicated plan of the
    maximum was at 1.15x); a float16 dot, and one whose transposed operand XLA folds into it,
    are stored (left uncounted, the replicated plan of ``x.T @ w`` was at 0.87x), the latter
    only before jaxlib 0.12.1, which fuses it too (still counted there, the replicated plan
    was predicted at 1.15x XLA's memory)."""
    S = jax.ShapeDtypeStruct
    p = shardwise.plan(fn, S(rows, dtype), S((512, 1024), dtype), mesh="data=2,model=4",
                       profile=PROFILE, top=1)  # fmt: skip
    over = {name: 1 / ratio for name, ratio in _ratios(p).items()}
    assert 0.95 <= over["replicated"] <= 1.05, over


def test_a_gathered_right_operand_contracted_on_its_last_dimension_is_stored() -> None:
    """``einsum("nd,kd->nk", x, w).sum(-1)``'s FSDP plan gathers ``w``, contracted on its last
    dimension: XLA stores the product there (counted as fused, the plan had been predicted at
    0.73x XLA's memory), and fuses it where ``w`` is read as it is held."""
    S = jax.ShapeDtypeStruct
    fn = lambda x, w: jnp.einsum("nd,kd->nk", x, w).sum(-1)  # noqa: E731
    p = shardwise.plan(fn, S((2048, 512), "float32"), S((1024, 512), "float32"),
                       mesh="data=2,model=4", profile=PROFILE, top=1)  # fmt: skip
    over = {name: 1 / ratio for name, ratio in _ratios(p).items()}
    assert 0.95 <= over["fsdp"] <= 1.05 and 0.95 <= over["replicated"] <= 1.05, over


def test_a_transpose_gathered_before_its_product_is_made_and_held() -> None:
    """``x.T @ w``: XLA folds the transpose into the product's dimensions, unless a gather
    stands between them. A plan that makes ``x.T`` split on every device and keeps it split
    on ``data`` alone makes it, gathers it and holds it until the product; the model, which
    folded it, had put that plan at 1.36x."""
    from shardwise._program.buffers import gathered_transposes
    from shardwise._program.memory import _fixed

    S = jax.ShapeDtypeStruct
    plan = shardwise.plan(lambda x, w: x.T @ w, S((512, 256), "float32"),
                          S((512, 1024), "float32"), mesh="data=2,model=4",
                          profile=PROFILE)  # fmt: skip
    folded = _fixed(plan.graph).folded
    gathered = [p.name for p in plan.plans
                if gathered_transposes(plan.graph, p.layouts, plan.mesh, folded)]  # fmt: skip
    assert gathered, "no plan gathers the transpose: the rule is not tried"
    for name, ratio in _ratios(plan).items():
        assert 0.8 <= ratio <= 1.25, (name, ratio)
        if name in gathered:
            assert 0.95 <= ratio <= 1.05, (name, ratio)
