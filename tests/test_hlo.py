"""Reading collectives from compiled HLO: every replica-group form, mapped to the user's axes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import shardwise
from shardwise._xla.hlo import collectives, parse_groups

XY = {"x": 2, "y": 4}


@pytest.mark.parametrize(
    ("text", "groups"),
    [
        ("replica_groups={{0,1,2,3},{4,5,6,7}}", [[0, 1, 2, 3], [4, 5, 6, 7]]),
        ("replica_groups={}", [list(range(8))]),
        ("replica_groups=[2,4]<=[8]", [[0, 1, 2, 3], [4, 5, 6, 7]]),
        ("replica_groups=[4,2]<=[2,4]T(1,0)", [[0, 4], [1, 5], [2, 6], [3, 7]]),
        ("replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_1'}", [[0, 1, 2, 3], [4, 5, 6, 7]]),
        ("replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_0'}", [[0, 4], [1, 5], [2, 6], [3, 7]]),
        (
            "replica_groups=mesh['axis_0'=4,'axis_1'=1,'axis_2'=2], device_ids=([2,4]T(1,0)) "
            "{'axis_0'}",
            [[0, 1, 2, 3], [4, 5, 6, 7]],
        ),
    ],
)
def test_replica_group_forms(text, groups):
    assert sorted(map(sorted, parse_groups("%a = f32[4]{0} all-reduce(%b), " + text, 8))) == (
        groups
    )


def test_sub_axis_groups():
    line = (
        "%a = (f32[1,16,16]{2,1,0}, f32[1,16,16]{2,1,0}) all-to-all(%x, %y), "
        "replica_groups=mesh['axis_0'=4,'axis_1'=2], device_ids=([2,2,2]T(0,2,1)) "
        "{'axis_0':(2)2}"
    )
    (c,) = collectives(line, XY)
    assert c.kind == "all-to-all"
    assert c.bytes == 2 * 16 * 16 * 4
    assert c.mesh_axes == ("y",)


def test_collective_permute_axes_from_pairs():
    line = (
        "%cp = f32[16,32]{1,0} collective-permute(%x), "
        "source_target_pairs={{0,0},{1,4},{4,1},{5,5}}"
    )
    (c,) = collectives(line, XY)
    assert (c.kind, c.mesh_axes) == ("collective-permute", ("x", "y"))


def test_async_start_counts_the_result_only():
    line = (
        "%ag = (f32[4]{0}, f32[16]{0}) all-gather-start(%x), replica_groups=[2,4]<=[8], "
        "dimensions={0}"
    )
    (c,) = collectives(line, XY)
    assert (c.kind, c.bytes, c.mesh_axes) == ("all-gather", 64, ("y",))


def test_groups_are_mesh_positions_not_device_ids():
    """A mesh whose devices are shuffled still maps each collective to the right axis."""
    devices = np.array(jax.devices())[[3, 6, 0, 5, 2, 7, 1, 4]].reshape(2, 4)
    mesh = Mesh(devices, ("x", "y"))
    for spec, axis in (("x,y", "y"), ("y,x", "x")):
        expl = shardwise.explain_einsum(
            "nd,nd->n", [(16, 16)] * 2, mesh=mesh, in_specs=[spec, spec], out_specs=spec[0]
        )
        assert [(c.kind, c.mesh_axes) for c in expl.collectives] == [("all-reduce", (axis,))]


def test_compiled_reshard_is_found():
    mesh = shardwise.mesh("x=2,y=4")
    f = jax.jit(
        lambda a: a * 2,
        in_shardings=NamedSharding(mesh, P("x", "y")),
        out_shardings=NamedSharding(mesh, P(None, "x")),
    )
    text = f.lower(jax.ShapeDtypeStruct((64, 64), jnp.float32)).compile().as_text()
    found = collectives(text, XY)
    assert found, text
    assert all(c.kind in {"all-gather", "all-to-all", "collective-permute"} for c in found)


def test_a_function_named_in_unicode_is_named_so_not_in_octal_escapes(tmp_path, monkeypatch):
    """XLA's tables write non-ASCII names C's way (``f\\303\\274n``): every cause, table and
    picture had shown the escapes."""
    (tmp_path / "unicode_model.py").write_text(
        "def fün_名前(x, w):\n    return x @ w\n", encoding="utf-8"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    f = importlib.import_module("unicode_model").fün_名前
    S = jax.ShapeDtypeStruct
    e = shardwise.explain(f, S((16, 32), "float32"), S((32, 64), "float32"), mesh="x=2,y=4",
                          in_specs=("x,y", "y,-"))  # fmt: skip
    assert e.collectives, "the contraction over y should all-reduce"
    assert "(fün_名前)" in e.collectives[0].source, e.collectives[0].source
