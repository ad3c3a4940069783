"""Limits instead of hangs, and clear errors for values that parse but mean nothing.

Device counts beyond what a host can simulate, planner enumerations past their bound, shapes
past what XLA can address, budgets of zero, dtypes JAX does not compute in, and operands that
are not arrays: each is a :class:`ShardwiseError` (exit 2 from the command) naming what was
given.
"""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from typer.testing import CliRunner

import shardwise
from shardwise import ArgumentError, ArgumentTypeError, MeshError, ShapeError, ShardwiseError
from shardwise._model.mesh import MeshSpec
from shardwise._model.op import MAX_DIMENSION, Op
from shardwise._model.plan import MAX_PROGRAM_BYTES, check_extent
from shardwise._model.profile import BUILTIN
from shardwise._model.strategy import MAX_LAYOUTS, layout_count, strategies
from shardwise._model.units import parse_bytes
from shardwise._planner import einsum as planner
from shardwise._runtime import devices
from shardwise.cli import app

runner = CliRunner()
A = np.ones((8, 4), np.float32)
HUGE = "1000000000000x1000000000000"


def cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run the command; its exit code and its output with the line breaks of rich undone."""
    result = runner.invoke(app, list(args), env=env)
    assert "Traceback" not in result.output
    return result.exit_code, " ".join(result.output.split())


# 10. limits instead of hangs


@pytest.mark.parametrize(
    ("args", "env"),
    [(["--devices", "100000"], None), ([], {"SHARDWISE_CPU_DEVICES": "100000"})],
)
def test_cli_refuses_more_devices_than_the_host_can_simulate(args, env):
    code, out = cli("explain", "nd,nd->n", "--shapes", "8x4,8x4", *args, env=env)
    assert code == 2, out
    assert "cannot simulate 100000 CPU devices" in out and "at most" in out


def test_device_limit_is_the_cap_or_the_process_limits(monkeypatch):
    assert 1 <= devices.cpu_device_limit()[0] <= devices.MAX_CPU_DEVICES == 4096
    with pytest.raises(MeshError, match=r"cannot simulate 4097 CPU devices.*at most"):
        shardwise.use_cpu_devices(devices.MAX_CPU_DEVICES + 1)
    with pytest.raises(MeshError, match="whole number"):
        shardwise.use_cpu_devices(0)
    import resource

    real = resource.getrlimit

    def capped(which: int) -> tuple[int, int]:  # as under `ulimit -v 3000000`
        return (3_000_000 * 1024, 3_000_000 * 1024) if which == resource.RLIMIT_AS else real(which)

    monkeypatch.setattr(resource, "getrlimit", capped)
    limit, why = devices.cpu_device_limit()
    assert limit < 64 and "ulimit -v" in why


def test_planner_stops_at_its_bound_and_says_so(monkeypatch):
    op, mesh = Op.parse("nd,nd->n"), MeshSpec.parse("a=2,b=2,c=2,d=2")
    assert layout_count(op, mesh) == 81 and MAX_LAYOUTS == 8**5
    twenty = MeshSpec.parse(",".join(f"a{i}=2" for i in range(20)))
    assert layout_count(op, twenty) == 3**20 > MAX_LAYOUTS
    considered, _ = strategies(op, {"n": 2**20, "d": 2**20}, twenty, limit=50)
    assert 50 <= considered <= 50 * 3  # (each layout has at most 3 output choices here)
    full = planner.rank(op, [(64, 64)] * 2, mesh, "float32", BUILTIN["h100"])
    assert full.complete and full.stopped_early is None and full.to_json()["complete"] is True
    monkeypatch.setattr(planner, "MAX_LAYOUTS", 20)
    cut = planner.rank(op, [(64, 64)] * 2, mesh, "float32", BUILTIN["h100"])
    assert not cut.complete and cut.considered < full.considered
    assert "after 20 of 81 index layouts" in (cut.stopped_early or "")
    data = cut.to_json()
    assert data["complete"] is False and "after 20 of 81" in data["stopped_early"]
    # the layouts kept are spread over all of them: every mesh axis splits some index
    split = {a for c in cut.strategies for _, axes in c.strategy.layout.assignment for a in axes}
    assert split == {"a", "b", "c", "d"}
    plan = ["plan", "nd,nd->n", "--shapes", "64x64,64x64", "--mesh", "a=2,b=2,c=2,d=2"]
    code, out = cli(*plan, "--profile", "h100")
    assert code == 0 and "incomplete: the planner stopped after 20 of 81" in out
    result = runner.invoke(app, [*plan, "--profile", "h100", "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["complete"] is False


def test_shapes_past_what_xla_can_address_are_refused_before_compiling():
    code, out = cli("explain", "nd,nd->n", "--shapes", f"{HUGE},{HUGE}", "--mesh", "x=2")
    assert code == 2 and "2**62" in out and "(1000000000000, 1000000000000)" in out, out
    code, out = cli("plan", "nd,nd->n", "--shapes", f"{HUGE},{HUGE}", "--profile", "h100")
    assert code == 2 and "2**62" in out, out
    wide = "1x" + "9" * 20  # (one dimension past 64 bits)
    code, out = cli("explain", "nd,nd->n", "--shapes", f"{wide},{wide}", "--mesh", "x=2")
    assert code == 2 and "the largest dimension XLA can represent" in out, out
    big = jax.ShapeDtypeStruct((10**12, 10**12), np.float32)
    with pytest.raises(ShapeError, match=r"2\*\*62"):
        shardwise.explain_einsum("nd,nd->n", [big.shape] * 2, mesh="x=2")
    with pytest.raises(ShapeError, match=r"2\*\*62"):
        shardwise.explain(lambda a: a.sum(), big, mesh="x=2", in_specs="x")
    with pytest.raises(ShapeError, match="2\\*\\*63 - 1"):
        shardwise.explain_einsum("nd,nd->n", [(0, MAX_DIMENSION + 1)] * 2, mesh="x=2")
    op = Op.parse("i->i")  # the bound itself is allowed: operand + output = 2**62 bytes
    check_extent(op, [(MAX_PROGRAM_BYTES // 2,)], "int8")
    with pytest.raises(ShapeError):
        check_extent(op, [(MAX_PROGRAM_BYTES // 2 + 1,)], "int8")


# 11. values that parse but mean nothing


@pytest.mark.parametrize("budget", ["0", "0GiB", "0.5", "-1", "-2GiB"])
def test_plan_refuses_a_budget_below_one_byte(budget):
    code, out = cli(
        "plan",
        "nd,nd->n",
        "--shapes",
        "8x4,8x4",
        "--mesh",
        "x=2",
        "--profile",
        "h100",
        "--device-memory",
        budget,
    )
    assert code == 2 and f"--device-memory '{budget}'" in out and "at least 1 byte" in out, out


def test_parse_bytes_refuses_sizes_below_one_byte_for_every_budget():
    assert parse_bytes("1") == 1 and parse_bytes(2048) == 2048
    for bad in (0, -5, 0.25, float("nan"), float("inf"), "0B", "-1MiB"):
        with pytest.raises(ArgumentError, match="the budget"):
            parse_bytes(bad, "the budget")
    with pytest.raises(ArgumentTypeError):
        parse_bytes(True)
    with pytest.raises(ArgumentError, match="at least 1 byte"):
        shardwise.plan_einsum("nd,nd->n", [(8, 4)] * 2, mesh="x=2", profile="h100", budget=0)
    with pytest.raises(ArgumentError, match="top=0"):
        shardwise.plan_einsum("nd,nd->n", [(8, 4)] * 2, mesh="x=2", profile="h100", top=0)
    code, out = cli("calibrate", "--size", "0")
    assert code == 2 and "--size '0'" in out, out


@pytest.mark.parametrize("dtype", ["float128", "complex256", "object", "U3"])
@pytest.mark.parametrize("command", ["explain", "plan"])
def test_dtypes_jax_does_not_compute_in(command, dtype):
    args = [command, "nd,nd->n", "--shapes", "8x4,8x4", "--mesh", "x=2", "--dtype", dtype]
    code, out = cli(*args, *(["--profile", "h100"] if command == "plan" else []))
    assert code == 2 and "dtype" in out, out
    assert repr(dtype) in out or np.dtype(dtype).name in out or np.dtype(dtype).str in out


# 12. the Python API: operands that are not arrays, in_specs and precision


NOT_ARRAYS = [
    ([[1.0] * 4] * 8, "a list"),
    (((1.0,) * 4,) * 8, "a tuple"),
    ("abc", "the string"),
    (None, "None"),
]


@pytest.mark.parametrize(("value", "said"), NOT_ARRAYS)
def test_operands_that_are_not_arrays(value, said):
    calls = [
        lambda: shardwise.einsum("nd,nd->n", value, A, mesh="x=2", in_specs=["x", "x"]),
        lambda: shardwise.explain("nd,nd->n", value, A, mesh="x=2", in_specs=["x", "x"]),
    ]
    for call in calls:
        with pytest.raises(ArgumentTypeError, match=f"operand 0 is {said}"):
            call()
    with pytest.raises(ArgumentTypeError, match=f"the array given to mean is {said}"):
        shardwise.mean(value, mesh="x=2")
    double = shardwise.shard(lambda a: a * 2, "x=2", in_specs=P("x"))
    with pytest.raises(ArgumentTypeError, match="argument 0 of <lambda>"):
        double(value)
    if isinstance(value, str):  # (pytrees of Python numbers and None are JAX's own)
        with pytest.raises(ArgumentTypeError, match="argument 0 of <lambda>"):
            shardwise.explain(lambda a: a.sum(), value, mesh="x=2", in_specs=None)


def test_pytrees_of_python_numbers_and_none_pass_as_in_jax():
    scale = shardwise.shard(lambda a, s, _: a * s[0] + s[1], "x=2", in_specs=(P("x"), None, None))
    np.testing.assert_allclose(np.asarray(scale(A, (2.0, 1.0), None)), A * 2.0 + 1.0)


def test_in_specs_shard_and_shapes_of_the_wrong_type():
    for in_specs, said in (
        (5, "int 5"),
        ("x", "the single spec 'x'"),
        (P("x", None), "the single spec P"),
    ):
        with pytest.raises(ArgumentTypeError, match=f"in_specs is {said}"):
            shardwise.einsum("nd,nd->n", A, A, mesh="x=2", in_specs=in_specs)
    with pytest.raises(ArgumentTypeError, match="in_specs is int 5"):
        shardwise.explain("nd,nd->n", A, A, mesh="x=2", in_specs=5)
    with pytest.raises(ArgumentTypeError, match="needs a function"):
        shardwise.shard(3, "x=2", in_specs=None)
    with pytest.raises(ArgumentTypeError, match="shape of operand 0 is 8"):
        shardwise.explain_einsum("nd,nd->n", [8, 4], mesh="x=2")
    with pytest.raises(ArgumentTypeError, match=r"4\.5, which is not a whole number"):
        shardwise.plan_einsum("nd,nd->n", [(8, 4.5)] * 2, mesh="x=2", profile="h100")
    with pytest.raises(ShapeError, match="has the size -4"):
        shardwise.explain_einsum("nd,nd->n", [(8, -4)] * 2, mesh="x=2")


def test_precision_is_checked_even_where_a_native_kernel_ignores_it():
    with pytest.raises(ArgumentError, match="precision 'ultra'"):
        shardwise.einsum("nd,nd->n", A, A, mesh="x=2", in_specs=["x", "x"], precision="ultra")
    with pytest.raises(ArgumentTypeError, match="precision 5"):
        shardwise.einsum("nd,nd->n", A, A, mesh="x=2", in_specs=["x", "x"], precision=5)
    for good in ("highest", jax.lax.Precision.HIGH, ("highest", "default")):
        out = shardwise.einsum("nd,nd->n", A, A, mesh="x=2", in_specs=["x", "x"], precision=good)
        assert np.allclose(out, 4.0)


def test_every_refusal_here_is_a_shardwise_error():
    for cls in (ArgumentError, ArgumentTypeError, MeshError, ShapeError):
        assert issubclass(cls, ShardwiseError)


def test_an_einsum_of_one_operand_takes_its_one_spec():
    for spec in (P("x"), "x"):
        out = shardwise.einsum("nd->n", A, mesh="x=2", in_specs=spec)
        np.testing.assert_allclose(np.asarray(out), A.sum(1))


# 13. budgets, timeouts and programs at their bounds


def test_parse_bytes_refuses_sizes_no_machine_holds_and_takes_numpy_integers():
    assert parse_bytes(np.int64(4096)) == 4096 and parse_bytes(2**63 - 1) == 2**63 - 1
    for bad in (2**63, 10**400, "1e19", "9EiB"):  # 10**400 raised a raw OverflowError
        with pytest.raises(ArgumentError, match="the budget"):
            parse_bytes(bad, "the budget")


def test_pinning_inputs_reads_their_variables_once_per_problem(monkeypatch):
    """10,000 inputs took 426 s: every baseline pins every input, and each pin read every
    input's variable again (quadratic)."""
    from shardwise._program import top
    from shardwise._program.baselines import NAMES

    calls = []
    real = top.input_vars
    monkeypatch.setattr(top, "input_vars", lambda *a: calls.append(1) or real(*a))
    S = jax.ShapeDtypeStruct
    args = {f"w{k}": S((8, 8), "float32") for k in range(40)}
    fixed = {f"params['w{k}']": "x" for k in range(40)}

    def f(params):
        return sum(w.sum() for w in params.values())

    shardwise.plan(f, args, mesh="x=8", profile="cpu-2core", top=1, fixed=fixed)
    # once per problem pinned (the search's and each baseline's), and once for the search
    assert len(calls) <= 2 + len(NAMES), len(calls)


def _plan_function(tmp_path, *args):
    src = tmp_path / "prog.py"
    src.write_text("def f(x):\n    return x\n")
    return cli("plan", "--function", f"{src}:f", *args, "--mesh", "x=8", "--profile", "cpu-2core")


@pytest.mark.parametrize("size", [str(2**63), str(2**64), "9" * 5000])
def test_args_dimensions_past_what_xla_represents(tmp_path, size):
    code, out = _plan_function(tmp_path, "--args", f"x=f32[{size}]")
    assert code == 2 and "2**63 - 1" in out and "--args x" in out, out


def test_args_nested_deeper_than_a_program_can_be_traced(tmp_path):
    deep = ".".join(["a"] * 3000)  # a RecursionError in tracing, said as a bug
    code, out = _plan_function(tmp_path, "--args", f"{deep}=f32[4]")
    assert code == 2 and "nests deeper than 100 levels" in out, out
    (tmp_path / "deep.json").write_text('{"x": ' + '{"a": ' * 3000 + '"f32[4]"' + "}" * 3001)
    code, out = _plan_function(tmp_path, "--args", str(tmp_path / "deep.json"))
    assert code == 2 and "nests deeper than 100 levels" in out, out
    code, out = _plan_function(
        tmp_path, "--args", ".".join(["x"] + ["a"] * 99) + "=f32[8]", "--top", "1"
    )
    assert code == 0, out


def test_programs_past_what_xla_can_address_are_refused_before_planning(tmp_path):
    S = jax.ShapeDtypeStruct
    half = S((2**61,), "float32")  # 2**63 bytes each: the memory curve overflowed int64
    with pytest.raises(ShapeError, match=r"2\*\*62"):
        shardwise.plan(lambda a, b: a * b, half, half, mesh="x=8", profile="cpu-2core", top=1)
    for shape in [(2**63,), (-1,)]:
        with pytest.raises(ShapeError, match=r"2\*\*63 - 1"):
            shardwise.plan(lambda a: a * 2, S(shape, "float32"), mesh="x=8", profile="cpu-2core")
    code, out = _plan_function(tmp_path, "--args", f"x=f32[{2**62},4]")
    assert code == 2 and "more than one program can address" in out, out


@pytest.mark.parametrize("timeout", ["inf", "nan", "-1", "0", "1e9"])
def test_launch_refuses_timeouts_that_are_not_seconds(timeout):
    code, out = cli("launch", "--timeout", timeout, "-n", "2", "--", "true")
    assert code == 2 and "--timeout" in out, out


def test_launch_checks_its_timeout_in_python_too():
    from shardwise._runtime.launch import launch
    from shardwise._runtime.timing import check_seconds

    assert check_seconds(1, "t", 1, 86_400) == 1.0 and check_seconds(86_400, "t", 1, 86_400)
    for bad in (float("inf"), float("nan"), -1.0, 0.5, 86_401):
        with pytest.raises(ArgumentError, match="from 1 to 86400"):
            launch(["true"], 2, timeout=bad)  # inf raised a raw OverflowError
    with pytest.raises(ArgumentTypeError):
        launch(["true"], 2, timeout=True)  # type: ignore[arg-type]


def test_memory_over_a_program_is_counted_from_intervals_not_a_table():
    """10,000 arguments make 30,000 arrays over 30,000 program points: the point × array
    table of who is alive took 3.7 GB; one interval per array holds the same."""
    from shardwise._program.graph import build
    from shardwise._program.memory import _live
    from shardwise._program.models import model

    fn, args = model("transformer", batch=4, seq=16, hidden=32, ffn=64, heads=4, layers=2)
    graph = build(fn, args)
    lives = _live(graph)
    assert lives.first.shape == lives.last.shape == (len(lives.arrays),)
    table = np.array([lives.alive(t) for t in range(lives.points)])  # the table, built here
    sizes = np.arange(1, len(lives.arrays) + 1, dtype=np.int64)
    np.testing.assert_array_equal(lives.totals(sizes), table.astype(np.int64) @ sizes)
    assert table.any() and not table.all()
