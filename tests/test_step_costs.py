"""One cost per step: the solver's matrices and a plan's explanation read the same step
costs (:mod:`shardwise._program.steps`), so a plan's predicted time adds up op by op, and
every op, modelled or not, costs something."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.core import Primitive
from jax.interpreters import mlir

import shardwise
from shardwise._model.profile import BUILTIN
from shardwise._program.models import model
from shardwise._program.pins import pinned
from shardwise._program.pricing import build_problem
from shardwise._program.problem import effective_mesh, total
from shardwise._program.search import solve
from shardwise._program.solution import predicted

S = jax.ShapeDtypeStruct
CPU = BUILTIN["cpu-2core"]
CASES = [
    (name, train, mesh)
    for name in ("mlp", "transformer")
    for train in (False, True)
    for mesh in ("data=2,model=4", "x=8")
]


def _plan(name: str, train: bool, mesh: str) -> shardwise.ProgramPlan:
    sizes = {"seq": 16, "layers": 2} if name == "transformer" else {}
    fn, args = model(name, batch=16, hidden=64, ffn=128, train=train, **sizes)
    return shardwise.plan(fn, *args, mesh=mesh, profile=CPU, train=train, top=3)


@pytest.mark.parametrize(("name", "train", "mesh"), CASES)
def test_a_plans_time_adds_up_op_by_op_from_the_costs_the_search_minimised(name, train, mesh):
    """Every plan's report adds up to its predicted seconds; and with each move counted for
    each of its readers, as the solver's matrices count them, the explanation's total is the
    solver's objective, for its solution and for other choices (each term of the matrices is
    read at some pair of layouts)."""
    _adds_up(_plan(name, train, mesh))


@pytest.mark.parametrize("train", [False, True], ids=["forward", "training step"])
@pytest.mark.parametrize("name", ["cnn", "embedding"])
def test_a_cnns_and_an_embeddings_time_adds_up_op_by_op(name, train):
    """The same for convolutions, poolings, and an embedding's lookup and scatter-add: read as
    einsums, they cost what the report says, and the solver's matrices alike."""
    from test_program_conv import _cnn, _embedding

    if name == "cnn":
        forward, loss, params, x, y = _cnn()
        args = (params, x, y) if train else (params, x)
    else:
        forward, loss, params, ids = _embedding()
        args = (params, ids)
    fn = loss if train else forward
    plan = shardwise.plan(fn, *args, mesh="data=2,model=4", profile=CPU, train=train, top=3)
    assert any(s.read_as_einsum for s in plan.graph.steps)
    _adds_up(plan)


def _adds_up(plan: shardwise.ProgramPlan) -> None:
    assert len(plan.plans) > 3  # the search's and the baselines
    for p in plan.plans:
        r = plan.report(p.name)
        added = sum(row.seconds for row in r.rows) + r.maps_seconds + r.elementwise_seconds
        assert added == pytest.approx(p.predicted.seconds, rel=1e-9, abs=0)
        assert sum(p.predicted.step_seconds) + p.predicted.elementwise_seconds == pytest.approx(
            p.predicted.seconds, rel=1e-9, abs=0
        )
        assert r.seconds == p.predicted.seconds and not r.not_modelled
    mesh_spec = effective_mesh(plan.mesh)
    problem = build_problem(plan.graph, mesh_spec, CPU)
    best = solve(problem)
    assert best is not None
    rng = np.random.default_rng(0)
    choices = [best.choice] + [
        tuple(int(rng.integers(len(c))) for c in problem.choices) for _ in range(2)
    ]
    for choice in choices:
        _, each = predicted(plan.graph, problem, choice, mesh_spec, CPU, shared=False)
        assert each.seconds == pytest.approx(total(problem, choice), rel=1e-9, abs=0)
        _, once = predicted(plan.graph, problem, choice, mesh_spec, CPU)
        assert once.seconds <= each.seconds * (1 + 1e-12)
        assert set(once.collectives) <= set(each.collectives)


def test_a_move_two_readers_share_is_counted_once():
    """FSDP on the MLP's training step gathers each weight once for the forward pass and the
    backward pass alike: the matrices count the gather for both readers, the prediction once,
    and the difference is the time of the gathers not listed twice."""
    plan = _plan("mlp", True, "x=8")
    mesh_spec = effective_mesh(plan.mesh)
    fsdp = plan.get("fsdp")
    # the baseline: its inputs pinned, the rest laid out by the search
    full = build_problem(plan.graph, mesh_spec, CPU)
    problem = pinned(plan.graph, full, dict(enumerate(fsdp.in_specs)), mesh_spec)
    sol = solve(problem)
    assert sol is not None
    _, once = predicted(plan.graph, problem, sol.choice, mesh_spec, CPU)
    _, each = predicted(plan.graph, problem, sol.choice, mesh_spec, CPU, shared=False)
    assert each.seconds == pytest.approx(sol.seconds, rel=1e-9)
    dropped = len(each.collectives) - len(once.collectives)
    assert dropped > 0 and once.seconds < each.seconds
    assert once.seconds == pytest.approx(fsdp.predicted.seconds, rel=1e-9)


def _unknown() -> Primitive:
    """A primitive shardwise has no rule for: it doubles its operand."""
    p = Primitive("doubled_by_a_custom_kernel")
    p.def_impl(lambda x: 2 * x)
    p.def_abstract_eval(lambda x: jax.core.ShapedArray(x.shape, x.dtype))
    mlir.register_lowering(p, mlir.lower_fun(lambda x: 2 * x, multiple_results=False))
    return p


def test_a_primitive_with_no_rule_is_planned_whole_costed_and_named():
    kernel = _unknown()

    def f(x, w):
        return jnp.tanh(kernel.bind(x @ w)) @ w.T

    args = (S((64, 32), "float32"), S((32, 32), "float32"))
    plan = shardwise.plan(f, *args, mesh="x=4", profile=CPU, top=1)
    (step,) = [s for s in plan.graph.steps if s.kind == "opaque"]
    assert not step.modelled and plan.graph.not_modelled == ("doubled_by_a_custom_kernel",)
    k = plan.graph.steps.index(step)
    read_and_written = 2 * 64 * 32 * 4 / CPU.memory_Bps
    for p in plan.plans:
        assert p.predicted.step_seconds[k] >= read_and_written  # never free
        assert p.layouts.steps[step.key] == ((shardwise.Spec(),), shardwise.Spec())
    r = plan.report()
    assert r.not_modelled == ("doubled_by_a_custom_kernel",)
    (row,) = [row for row in r.rows if row.step == k]
    assert "not modelled" in row.op and row.seconds > 0
    assert "not modelled" in str(r)
    x = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
    w = np.random.default_rng(1).standard_normal((32, 32)).astype(np.float32)
    got = np.asarray(plan.sharded()(x, w))
    np.testing.assert_allclose(got, np.tanh(2 * (x @ w)) @ w.T, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize(
    ("padding", "strides", "dilation"),
    [("SAME", (1, 1), (1, 1)), ("VALID", (2, 2), (1, 1)), (((2, 1), (0, 3)), (1, 2), (2, 1))],
)
def test_a_convolution_is_planned_as_a_dot_with_the_flops_xla_counts(padding, strides, dilation):
    """A convolution's FLOPs are XLA's (taps that fall on padding left out), and each device of
    a split does its share of them: the batch split two ways halves them."""

    def f(x, k):
        return jax.lax.conv_general_dilated(x, k, strides, padding, rhs_dilation=dilation)

    x, k = S((8, 4, 16, 16), "float32"), S((6, 4, 3, 3), "float32")
    plan = shardwise.plan(f, x, k, mesh="x=2", profile=CPU, top=1)
    (step,) = plan.graph.steps
    assert step.kind == "dot" and step.read_as_einsum and step.op is not None
    assert step.op.equation == "nchw,ocij->nohw" and step.whole == "hwij"
    xla = jax.jit(f).lower(x, k).compile().cost_analysis()["flops"]
    assert step.flops == xla
    split = plan.get("data-parallel")  # x split on its batch
    assert split.in_specs[0].describe() == "x" and split.predicted.flops == xla / 2
    assert split.predicted.seconds >= xla / 2 / CPU.flops("float32")


def test_a_search_that_kept_only_some_layouts_says_so(monkeypatch):
    from shardwise._program import pricing

    fn, args = model("mlp", batch=16, hidden=64, ffn=128)
    whole = shardwise.plan(fn, *args, mesh="data=2,model=4", profile=CPU, top=1)
    assert whole.complete and whole.stopped_early is None
    monkeypatch.setattr(pricing, "MAX_CHOICES", 2)
    plan = shardwise.plan(fn, *args, mesh="data=2,model=4", profile=CPU, top=1)
    assert not plan.complete and plan.to_json()["complete"] is False
    assert "spread evenly" in plan.stopped_early and "incomplete" in str(plan)
    # a baseline whose layouts were not kept is skipped, and says why
    assert any("not among the layouts the search kept" in why for _, why in plan.skipped)


@pytest.mark.parametrize(
    "op",
    [lambda x: x[:, 4:], lambda x: jnp.pad(x, ((0, 0), (0, 8))), lambda x: jnp.cumsum(x, 1)],
    ids=["slice", "pad", "cumsum"],
)
def test_a_map_reads_whole_the_dimension_it_slices_pads_or_scans(op):
    """A slice of a split dimension is not local (the elements a device keeps are on
    another): the map reads the dimension whole, and the move is the gather XLA makes (it had
    been carried split, and XLA's collective-permutes were not predicted)."""
    import shardwise

    x0 = jax.ShapeDtypeStruct((16, 32), jnp.float32)
    p = shardwise.plan(lambda x: jnp.tanh(op(x)) * 2.0, x0, mesh="data=2,model=4",
                       profile="cpu-2core", fixed={"x": "-,model"}, top=1)  # fmt: skip
    chosen = p.chosen
    (step,) = [s for s in p.graph.steps if s.kind == "map"]
    assert chosen.layouts.steps[step.key][0][0].padded(2)[1] == ()
    checked = p.verify(repeat=1)
    for q in checked.plans:
        assert q.verified is not None and q.verified.collectives_match, q.name


def test_a_cpu_convolution_takes_a_time_per_position_and_tap_whatever_its_features():
    """On a CPU a convolution takes ``conv_tap_s`` per output position and kernel tap on top
    of its FLOPs and bytes, whatever its features: split on its output features, each device
    still makes every position; split on its batch, each makes its share. A kernel's gradient
    is a convolution whose positions are the kernel's taps (times the image's features) and
    whose taps are the image's pixels, its images the features it sums: split on the images'
    batch, each device keeps every pair."""
    from shardwise._model.mesh import MeshSpec
    from shardwise._program.graph import build
    from shardwise._program.steps import StepCosts, dot_strategies

    def conv(x, k):  # type: ignore[no-untyped-def]
        return jax.lax.conv_general_dilated(x, k, (1, 1), "SAME",
                                            dimension_numbers=("NHWC", "HWIO", "NHWC"))  # fmt: skip

    def kernel_gradient(x, k, g):  # type: ignore[no-untyped-def]
        return jax.vjp(lambda k: conv(x, k), k)[1](g)[0]

    x, k, g = (
        S((32, 28, 28, 1), "float32"),
        S((3, 3, 1, 8), "float32"),
        S((32, 28, 28, 8), "float32"),
    )
    mesh = MeshSpec.parse("x=8")
    no_taps = dataclasses.replace(CPU, conv_tap_s=None)
    on_image = (3 * 28 - 2) ** 2  # an image's (position, tap) pairs that fall on it
    # the images are the forward convolution's batch n, its kernel gradient's features c
    for fn, args, image_batch in ((conv, (x, k), "n"), (kernel_gradient, (x, k, g), "c")):
        pairs = 32 * on_image if fn is conv else on_image  # (the images summed, one feature)
        graph = build(fn, args)
        [step] = [s for s in graph.steps if s.prim == "conv_general_dilated"]
        assert step.op is not None
        _, found = dot_strategies(graph, step, mesh, 10_000)
        with_taps, without = StepCosts(graph, mesh, CPU), StepCosts(graph, mesh, no_taps)
        seen = set()
        for strategy in found:
            split = {i for i, axes in strategy.layout.assignment if axes}
            extra = with_taps.dot(step, strategy).seconds - without.dot(step, strategy).seconds
            if split == {image_batch}:  # the images split 8 ways
                seen.add("batch")
                want = pairs if fn is kernel_gradient else pairs / 8
                assert extra == pytest.approx(want * CPU.conv_tap_s), strategy
            if split == {"o"}:  # the output features split 8 ways: every pair on each device
                seen.add("features")
                assert extra == pytest.approx(pairs * CPU.conv_tap_s), strategy
        assert seen == {"batch", "features"}, (fn.__name__, [s.layout for s in found])


def test_each_group_of_a_grouped_cpu_convolution_adds_to_its_time_per_tap():
    """XLA's CPU backend runs a depthwise convolution about group by group: each group past
    the first adds ``GROUP_TAP`` of its time per (position, tap), and one group is a plain
    convolution's time."""
    from shardwise._model.mesh import MeshSpec
    from shardwise._program.cpu_convs import GROUP_TAP
    from shardwise._program.graph import build
    from shardwise._program.steps import StepCosts, dot_strategies

    mesh = MeshSpec.parse("x=8")
    no_taps = dataclasses.replace(CPU, conv_tap_s=None)
    extra = {}
    for groups in (1, 32):

        def conv(x, k, groups=groups):  # type: ignore[no-untyped-def]
            return jax.lax.conv_general_dilated(
                x, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
                feature_group_count=groups,
            )  # fmt: skip

        images, kernel = S((16, 28, 28, 32), "float32"), S((3, 3, 32 // groups, 32), "float32")
        graph = build(conv, (images, kernel))
        [step] = [s for s in graph.steps if s.prim == "conv_general_dilated"]
        _, found = dot_strategies(graph, step, mesh, 10_000)
        [batch] = [s for s in found if {i for i, a in s.layout.assignment if a} == {"n"}]
        with_taps, without = StepCosts(graph, mesh, CPU), StepCosts(graph, mesh, no_taps)
        extra[groups] = with_taps.dot(step, batch).seconds - without.dot(step, batch).seconds
    pairs = 2 * (3 * 28 - 2) ** 2  # two images a device, the pairs that fall on them
    assert extra[1] == pytest.approx(pairs * CPU.conv_tap_s)
    assert extra[32] == pytest.approx(pairs * (1 + GROUP_TAP * 31) * CPU.conv_tap_s)


def test_steps_alike_share_one_read_only_cost_matrix_per_edge(monkeypatch):
    """Each layer of a Python loop of layers gets the same cost matrices: an edge first added
    is its step's matrix itself, shared with every step alike and never written (a copy of
    each had taken a tenth of the pricing on a mesh of four axes). The costs are those of a
    problem that copies each matrix."""
    import shardwise._program.pricing as problem_module

    w = jax.ShapeDtypeStruct((64, 64), jnp.float32)

    def layers(x, ws):
        for k in range(3):
            x = jnp.tanh(x @ ws[k])
        return x

    plan = shardwise.plan(
        layers, jax.ShapeDtypeStruct((32, 64), jnp.float32), [w] * 3, mesh="data=2,model=4",
        profile=CPU, top=1,
    )  # fmt: skip
    mesh_spec = effective_mesh(plan.mesh)
    problem = build_problem(plan.graph, mesh_spec, CPU)
    matrices = list(problem.edges.values())
    times = {id(m): sum(m is n for n in matrices) for m in matrices}
    shared = [m for m in matrices if times[id(m)] > 1]
    assert shared  # (the layers' dots share theirs)
    assert all(not m.flags.writeable for m in shared)
    with pytest.raises(ValueError, match="read-only"):
        shared[0][0, 0] = 1.0

    def copied(edges, u, v, matrix):  # (each edge a copy of its own, as before)
        if (v, u) in edges:
            edges[(v, u)] = edges[(v, u)] + matrix.T
        else:
            edges[(u, v)] = edges.get((u, v), 0) + matrix

    monkeypatch.setattr(problem_module, "add_edge", copied)
    again = build_problem(plan.graph, mesh_spec, CPU)
    assert again.edges.keys() == problem.edges.keys()
    assert all(np.array_equal(again.edges[k], m) for k, m in problem.edges.items())
    assert all(np.array_equal(a, b) for a, b in zip(again.unary, problem.unary, strict=True))
