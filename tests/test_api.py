"""The public API beyond the scenarios: shard (pjit today), Explicit meshes, explain."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

import shardwise
from helpers import assert_shards, tolerance
from shardwise import Spec


def test_mesh_forms():
    assert dict(shardwise.mesh("devices=8").shape) == {"devices": 8}
    assert dict(shardwise.mesh({"x": 2, "y": 4}).shape) == {"x": 2, "y": 4}
    assert dict(shardwise.mesh("auto").shape) == {"devices": 8}
    assert dict(shardwise.mesh("x=2").shape) == {"x": 2}  # a subset of the devices
    auto = shardwise.mesh("x=2,y=4")
    assert all(t == AxisType.Auto for t in auto.axis_types)
    explicit = shardwise.mesh("x=2,y=4", axis_types="explicit")
    assert all(t == AxisType.Explicit for t in explicit.axis_types)


def test_shard_is_the_tutorials_pjit():
    mesh = shardwise.mesh("devices=8")
    v1 = np.random.default_rng(0).random((800, 3), dtype=np.float32)
    v2 = np.random.default_rng(1).random((800, 3), dtype=np.float32)
    dot = shardwise.shard(
        jax.vmap(jnp.dot), mesh, in_specs=(P("devices"), None), out_specs=P("devices")
    )
    out = dot(v1, v2)
    expected = np.einsum("nd,nd->n", v1.astype(np.float64), v2.astype(np.float64))
    assert_shards(out, expected, mesh, Spec.parse("devices"), **tolerance(np.float32, 3))
    expl = dot.explain(v1, v2)
    assert [o.spec for o in expl.operands] == [Spec.parse("devices"), Spec.parse(None)]
    assert expl.operands[0].shard_shape == (100, 3)
    assert expl.outputs[0].shard_shape == (100,)
    assert expl.collectives == ()


def test_shard_with_text_specs_and_a_collective():
    mesh = shardwise.mesh("x=2,y=4")
    f = shardwise.shard(
        lambda a, b: (a * b).sum(axis=1), mesh, in_specs=("x,y", "x,y"), out_specs="x"
    )
    a = np.arange(64.0, dtype=np.float32).reshape(8, 8)
    out = f(a, a)
    assert_shards(out, (a.astype(np.float64) ** 2).sum(1), mesh, Spec.parse("x"), rtol=1e-6)
    kinds = [(c.kind, c.mesh_axes) for c in f.explain(a, a).collectives]
    assert kinds == [("all-reduce", ("y",))]


def test_shard_single_spec_applies_to_every_argument_and_pytrees():
    f = shardwise.shard(lambda t: t["a"] + t["b"], "devices=8", in_specs=P("devices"))
    t = {"a": np.ones((8, 2), np.float32), "b": np.ones((8, 2), np.float32)}
    out = f(t)
    assert out.sharding.spec == P("devices")
    np.testing.assert_array_equal(np.asarray(out), 2 * np.ones((8, 2)))


def test_explicit_mesh_runs_auto_and_manual():
    mesh = shardwise.mesh("x=2,y=4", axis_types="explicit")
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((8, 16)).astype(np.float32) for _ in range(2))
    expected = np.einsum("nd,nd->n", a.astype(np.float64), b.astype(np.float64))
    for mode in ("auto", "manual"):
        out = shardwise.einsum("nd,nd->n", a, b, mesh=mesh, layout="n=x,d=y", mode=mode)
        assert_shards(out, expected, mesh, Spec.parse("x"), **tolerance(np.float32, 16))


def test_jax_arrays_with_another_sharding_are_moved():
    mesh = shardwise.mesh("x=2,y=4")
    a = jax.device_put(np.ones((8, 8), np.float32), jax.sharding.NamedSharding(mesh, P("y")))
    out = shardwise.einsum("mk,kn->mn", a, a, mesh=mesh, in_specs=["x", None])
    assert_shards(out, np.full((8, 8), 8.0), mesh, Spec.parse("x"), rtol=0)


def test_64_bit_inputs_are_computed_in_64_bits_without_warnings():
    a = 1 + np.arange(16, dtype=np.float64).reshape(8, 2) * 1e-9  # steps float32 cannot hold
    out = shardwise.einsum("nd,nd->n", a, a, mesh="devices=8", in_specs=["devices"] * 2)
    assert out.dtype == np.float64
    np.testing.assert_allclose(np.asarray(out), np.einsum("nd,nd->n", a, a), rtol=1e-15)
    big = np.full((4, 4), 8 * 2**40, np.int64)  # int32 would wrap these to 0
    out = shardwise.einsum("ij,jk->ik", big, np.ones((4, 4), np.int64), mesh="x=2,y=4")
    assert out.dtype == np.int64
    np.testing.assert_array_equal(np.asarray(out), np.full((4, 4), 32 * 2**40))
    assert not jax.config.jax_enable_x64  # the 64-bit mode ends with shardwise's program
    e = shardwise.explain_einsum("nd,nd->n", [(8, 2)] * 2, mesh="devices=8", dtype="float64")
    assert e.operands[0].dtype == "float64"
    e = shardwise.explain_einsum("nd,nd->n", [(8, 2)] * 2, mesh="devices=8", dtype="bfloat16")
    assert e.operands[0].dtype == "bfloat16"


def test_default_output_keeps_the_inputs_axes():
    e = shardwise.explain_einsum(
        "mk,kn->mn", [(8, 8), (8, 8)], mesh="x=2,y=4", in_specs=["x,y", "y"]
    )
    assert e.output.spec == Spec.parse("x")
    assert ("all-reduce", ("y",)) in [(c.kind, c.mesh_axes) for c in e.collectives]


@pytest.mark.parametrize("mode", ["auto", "manual"])
def test_explain_contract_keys(mode):
    e = shardwise.explain_einsum(
        "nd,nd->n", [(16, 8)] * 2, mesh="x=2,y=4", in_specs=["x,y", "x,y"], out_specs="x", mode=mode
    )
    data = e.to_json()
    assert set(data) >= {"equation", "mesh", "mode", "operands", "output", "collectives"}
    assert data["mesh"] == {"x": 2, "y": 4} and data["mode"] == mode
    operand = data["operands"][0]
    assert {k: operand[k] for k in ("shape", "dtype", "spec", "shard_shape")} == {
        "shape": [16, 8],
        "dtype": "float32",
        "spec": ["x", "y"],
        "shard_shape": [8, 2],
    }
    assert data["output"]["spec"] == ["x"]
    (c,) = data["collectives"]
    assert {k: c[k] for k in ("kind", "mesh_axes", "bytes")} == {
        "kind": "all-reduce",
        "mesh_axes": ["y"],
        "bytes": 32,
    }
    assert "all-reduce" in str(e)


def test_explain_takes_a_python_number_inside_an_argument_as_a_scalar():
    """A ``TrainState``'s ``step=0``: ``explain`` had failed with a raw AttributeError
    ('int' object has no attribute 'shape') where ``jax.jit``, ``shard`` and ``plan`` take it."""
    state = {"step": 0, "w": jnp.ones((8, 4))}

    def step(state, x):
        return {"step": state["step"] + 1, "w": state["w"] * x.sum()}

    x = jax.ShapeDtypeStruct((16, 8), jnp.float32)
    e = shardwise.explain(step, state, x, mesh="x=8", in_specs=(None, "x"))
    named = {o.name: (o.shape, o.dtype) for o in e.operands}
    assert named["state['step']"] == ((), "int32") and named["x"] == ((16, 8), "float32")
