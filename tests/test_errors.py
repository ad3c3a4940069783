"""Every bad input gets a message that says what was given, what is wrong, and the fix."""

from __future__ import annotations

import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from typer.testing import CliRunner

import shardwise
from shardwise import (
    ArgumentError,
    EquationError,
    IndivisibleError,
    MeshError,
    ShapeError,
    ShardwiseError,
    SpecError,
)
from shardwise.cli import app

A = np.ones((16, 8), np.float32)


def test_error_family():
    bad_values = (MeshError, SpecError, IndivisibleError, EquationError, ShapeError, ArgumentError)
    for cls in bad_values:
        assert issubclass(cls, ShardwiseError) and issubclass(cls, ValueError)
    assert issubclass(shardwise.ArgumentTypeError, ArgumentError)
    assert issubclass(shardwise.ArgumentTypeError, TypeError)
    assert issubclass(shardwise.DistributedError, ShardwiseError)
    assert issubclass(shardwise.DistributedError, RuntimeError)


def test_bad_values_are_value_errors_and_bad_types_type_errors():
    with pytest.raises(ValueError, match="not both"):
        shardwise.einsum("nd,nd->n", A, A, mesh="x=8", layout="auto", in_specs=["x", "x"])
    with pytest.raises(TypeError, match="2 operands but 1 in_specs"):
        shardwise.einsum("nd,nd->n", A, A, mesh="x=8", in_specs=["x"])
    with pytest.raises(TypeError, match="strings"):
        shardwise.einsum("i->", np.array(["a", "b"]), mesh="x=2")
    with pytest.raises(TypeError, match="a mesh is described by"):
        shardwise.einsum("nd,nd->n", A, A, mesh=3)
    with pytest.raises(TypeError, match="expected a PartitionSpec"):
        shardwise.einsum("nd,nd->n", A, A, mesh="x=8", in_specs=[3.5, None])
    with pytest.raises(ValueError, match="no profile named"):
        shardwise.plan_einsum("ij->", [(8, 8)], mesh="x=8", profile="no-such-profile")


def test_unknown_mesh_axis_lists_the_axes_and_suggests():
    with pytest.raises(SpecError) as info:
        shardwise.einsum("nd,nd->n", A, A, mesh="x=2,y=4", in_specs=["x,yy", None])
    msg = str(info.value)
    assert "'yy'" in msg and "did you mean `y`" in msg and "only axes x, y" in msg


def test_axis_used_twice_in_a_spec():
    with pytest.raises(SpecError, match="uses mesh axis 'x' twice"):
        shardwise.einsum("nd,nd->n", A, A, mesh="x=2,y=4", in_specs=["x,x", None])


def test_axis_used_twice_in_a_layout():
    with pytest.raises(SpecError, match="gives mesh axis 'x' to both index"):
        shardwise.einsum("nd,nd->n", A, A, mesh="x=2,y=4", layout="n=x,d=x")


def test_spec_longer_than_rank():
    with pytest.raises(SpecError, match=r"has 2 dimensions.*3 entries"):
        shardwise.einsum("nd,nd->n", A, A, mesh="x=2,y=4", in_specs=["x,y,-", None])


def test_indivisible_names_dimension_size_shards_and_fixes():
    b = np.ones((10, 8), np.float32)
    with pytest.raises(IndivisibleError) as info:
        shardwise.einsum("nd,nd->n", b, b, mesh="devices=8", in_specs=[P("devices"), None])
    msg = str(info.value)
    assert "dimension 0 of operand 0" in msg
    assert "size 10" in msg and "8 shards" in msg
    assert "Pad it to 16" in msg and "or leave it unsharded" in msg  # (no axis splits 10)
    with pytest.raises(IndivisibleError, match=r"Pad it to 16, or split it over x \(2 shards\)"):
        shardwise.einsum("nd,nd->n", b, b, mesh="x=2,y=4", in_specs=[P(("x", "y")), None])


def test_more_devices_than_exist():
    with pytest.raises(MeshError) as info:
        shardwise.mesh("x=4,y=4")
    msg, shell = str(info.value), info.value.shell
    assert "needs 16 devices" in msg and "only 8" in msg
    # Python code is told the Python call, the shardwise command the flag
    assert "shardwise.use_cpu_devices(16)" in msg and "--devices 16" not in msg
    assert "needs 16 devices" in shell and "--devices 16" in shell and "use_cpu" not in shell


def test_simulated_devices_after_start():
    with pytest.raises(MeshError, match="already started with 8"):
        shardwise.use_cpu_devices(4)
    shardwise.use_cpu_devices(8)  # asking for what is there is fine


@pytest.mark.parametrize(
    ("equation", "match"),
    [("nd,nd->q", "appears in no input"), ("n d,nd->n!", "letters only")],
)
def test_malformed_equation(equation, match):
    with pytest.raises(EquationError, match=match):
        shardwise.einsum(equation, A, A, mesh="devices=8")


@pytest.mark.parametrize("equation", [None, b"nd,nd->n", 3, ["nd,nd->n"]])
def test_an_equation_that_is_not_a_str(equation):
    with pytest.raises(shardwise.ArgumentTypeError, match="an einsum equation is a str like"):
        shardwise.einsum(equation, A, A, mesh="devices=8")
    with pytest.raises(shardwise.ArgumentTypeError, match=f"but {type(equation).__name__} "):
        shardwise.plan_einsum(equation, [(16, 8)] * 2, mesh="x=2,y=4", profile="h100")
    if isinstance(equation, bytes):  # (explain takes a function too: bytes are an equation)
        with pytest.raises(shardwise.ArgumentTypeError, match="decode it"):
            shardwise.explain(equation, A, A, mesh="devices=8")


def test_operand_count():
    with pytest.raises(ShapeError, match="takes 2 operands, but 1 was given"):
        shardwise.einsum("nd,nd->n", A, mesh="devices=8")


def test_operand_rank():
    with pytest.raises(ShapeError, match=r"needs 2 dimensions, but its shape is \(16,\)"):
        shardwise.einsum("nd,nd->n", A, A[:, 0], mesh="devices=8")


def test_shape_mismatch():
    with pytest.raises(ShapeError, match="index 'd' has size 8 in operand 0 but 4 in operand 1"):
        shardwise.einsum("nd,nd->n", A, A[:, :4], mesh="devices=8")


def test_wrong_number_of_in_specs():
    with pytest.raises(ArgumentError, match="2 operands but 3 in_specs"):
        shardwise.einsum("nd,nd->n", A, A, mesh="devices=8", in_specs=[None, None, None])


def test_layout_and_in_specs_together():
    with pytest.raises(ArgumentError, match="not both"):
        shardwise.einsum(
            "nd,nd->n", A, A, mesh="devices=8", layout="n=devices", in_specs=[None] * 2
        )


def test_layout_names_an_unknown_index():
    with pytest.raises(SpecError, match="index 'q', which is not in"):
        shardwise.einsum("nd,nd->n", A, A, mesh="devices=8", layout="q=devices")


def test_manual_mode_needs_agreeing_specs():
    with pytest.raises(SpecError, match="split over mesh axes devices in operand 0"):
        shardwise.einsum(
            "nd,nd->n", A, A, mesh="devices=8", in_specs=["devices", None], mode="manual"
        )


def test_unknown_mode():
    with pytest.raises(ArgumentError, match="not one of auto, manual"):
        shardwise.einsum("nd,nd->n", A, A, mesh="devices=8", mode="fast")


def test_shard_wrong_argument_count_and_indivisible():
    f = shardwise.shard(lambda a, b: a + b, "devices=8", in_specs=(P("devices"), None))
    with pytest.raises(ArgumentError, match="given 1 argument but in_specs has 2"):
        f(A)
    with pytest.raises(IndivisibleError, match="argument 0"):
        f(np.ones((6, 2)), np.ones((6, 2)))


runner = CliRunner()


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--mesh", "x=2,y=4", "--in", "x,q", "--in", "x,y"], "names mesh axis 'q'"),
        (["--mesh", "x=3,y=3"], "needs 9 devices"),
        (["--mesh", "x=2", "--in", "x", "--in", "-", "--shapes", "3x4,3x4"], "split evenly"),
        (["--shapes", "4000xten"], "cannot read shapes"),
        (["--mode", "fast"], "not one of auto, manual"),
    ],
)
def test_cli_prints_the_message_and_exits_2(args, match):
    base = {"--shapes": "16x8,16x8"}
    argv = ["explain", "nd,nd->n"]
    if "--shapes" not in args:
        argv += ["--shapes", base["--shapes"]]
    result = runner.invoke(app, argv + args)
    assert result.exit_code == 2, result.output
    assert "error:" in result.output
    assert match in " ".join(result.output.split())
    assert "Traceback" not in result.output


def test_shard_says_what_is_wrong_with_a_spec_before_jax_does():
    def layer(x, w):
        return x @ w

    x, w = np.ones((8, 16), np.float32), np.ones((16, 32), np.float32)
    with pytest.raises(SpecError, match=r"names mesh axis 'yy' \(did you mean `y`\?\)"):
        shardwise.shard(layer, "x=2,y=4", in_specs=(P("x"), "-,yy"))
    with pytest.raises(SpecError, match="uses mesh axis 'x' twice"):
        shardwise.shard(layer, "x=2,y=4", in_specs=("x,y,x", None))
    with pytest.raises(SpecError, match="uses mesh axis 'x' twice"):
        shardwise.shard(layer, "x=2,y=4", in_specs=None, out_specs="x,x")
    bad_out = shardwise.shard(layer, "x=2,y=4", in_specs=(P("x"), "-,y"), out_specs=P("x", "y"))
    with pytest.raises(SpecError, match=r"of shape \(32,\): a spec has more entries"):
        bad_out(x[0], w)
    np.testing.assert_allclose(bad_out(x, w), x @ w)  # the same specs fit a 2-D result


@pytest.mark.parametrize("function", ["einsum", "explain", "explain_einsum", "Plan.make"])
def test_out_spec_is_a_deprecated_alias_of_out_specs(function):
    """Every public function names the output's spec out_specs, as shardwise.shard and
    jax.shard_map do; the old out_spec= still works, with a DeprecationWarning, and giving
    both is an error."""
    a = np.ones((16, 8), np.float32)
    call = {
        "einsum": lambda **kw: shardwise.einsum("nd,nd->n", a, a, **kw).sharding.spec,
        "explain": lambda **kw: shardwise.explain("nd,nd->n", a, a, **kw).output.spec,
        "explain_einsum": lambda **kw: (
            shardwise.explain_einsum("nd,nd->n", [a.shape] * 2, **kw).output.spec
        ),
        "Plan.make": lambda **kw: shardwise.Plan.make("nd,nd->n", [a.shape] * 2, **kw).out_spec,
    }[function]
    given = {"mesh": "x=2,y=4", "in_specs": ["x,y", "x,y"]}
    new = call(out_specs="x", **given)
    with pytest.warns(DeprecationWarning, match=r"out_spec=\.\.\.\) is deprecated; use out_specs="):
        old = call(out_spec="x", **given)
    assert str(old) == str(new) and "y" not in str(new)
    with pytest.raises(shardwise.ArgumentTypeError, match="give out_specs= only"):
        call(out_spec="x", out_specs="x", **given)
