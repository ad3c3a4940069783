"""The native ``rowdot`` kernel: built, equal to NumPy, chosen where it should be (and only
there), visible in the compiled HLO, differentiable, and replaced by XLA's kernels when it
cannot be built."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

import shardwise
from helpers import assert_shards, tolerance
from shardwise import Op, Spec
from shardwise._planner.layout import plan_arrays
from shardwise._xla import kernels as _kernels
from shardwise._xla import native as _native
from shardwise._xla.kernels import native_kernel, row_dot
from shardwise._xla.lower import jitted

CALL = 'custom_call_target="shardwise_rowdot_'
MATMUL = 'custom_call_target="shardwise_matmul_'


@pytest.mark.parametrize("name", ["rowdot", "matmul"])
def test_the_kernels_build_on_this_machine(name):
    # CI runs where a C++ compiler is installed: a failed build here is a defect, not a skip
    assert _native.available(name), _native.why_unavailable(name)
    assert _native.library_path(_native.KERNELS[name], _native.compiler() or "").exists()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(5, 100), (1, 1), (7, 129), (3, 0), (0, 7), (2, 3, 65)])
def test_rowdot_equals_numpy(dtype, shape):
    rng = np.random.default_rng(0)
    x, y = (rng.standard_normal(shape).astype(dtype) for _ in range(2))
    with jax.enable_x64(dtype == np.float64):
        got = np.asarray(_native.rowdot(x, y))
    expected = np.einsum("...j,...j->...", x.astype(np.float64), y.astype(np.float64))
    assert got.dtype == dtype and got.shape == expected.shape
    np.testing.assert_allclose(got, expected, **tolerance(dtype, shape[-1]))


def test_choice():
    long = {"b": 2, "n": 16, "d": 100}
    assert row_dot(Op.parse("nd,nd->n")) and row_dot(Op.parse("bnd,bnd->bn"))
    assert row_dot(Op.parse("nd,nd->"))
    assert not row_dot(Op.parse("nd,dn->n"))  # the second array lies the other way
    assert not row_dot(Op.parse("nd,nd->d"))  # a leading index summed
    assert not row_dot(Op.parse("nd,nd->nd"))  # nothing summed
    assert native_kernel(Op.parse("nd,nd->n"), long, on_cpu=True) == "rowdot"
    assert native_kernel(Op.parse("nd,nd->n"), long, on_cpu=False) == "einsum"
    assert native_kernel(Op.parse("nd,nd->n"), {"n": 16, "d": 3}, on_cpu=True) == "unrolled"


@pytest.mark.parametrize("mode", ["auto", "manual"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    ("equation", "shape", "mesh", "specs", "out", "reduces"),
    [
        ("nd,nd->n", (64, 100), "devices=8", "devices", "devices", 0),  # S1 with long rows
        ("nd,nd->n", (64, 400), "devices=8", "-,devices", "", 1),  # S2: partial sums
        ("nd,nd->n", (40, 400), "x=2,y=4", "x,y", "x", 1),  # S4
        ("bnd,bnd->bn", (4, 6, 100), "x=2,y=4", "x,-,y", "x", 1),
        ("nd,nd->", (16, 100), "devices=8", "devices", "", 1),
    ],
)
def test_einsums_on_the_mesh_use_it_and_equal_numpy(
    mode, dtype, equation, shape, mesh, specs, out, reduces
):
    rng = np.random.default_rng(1)
    a, b = (rng.standard_normal(shape).astype(dtype) for _ in range(2))
    with jax.enable_x64(dtype == np.float64):
        plan, jmesh = plan_arrays(
            equation, a, b, mesh=mesh, in_specs=[specs] * 2, out_specs=out, mode=mode
        )
        got = shardwise.einsum(
            equation, a, b, mesh=mesh, in_specs=[specs] * 2, out_specs=out, mode=mode
        )
        hlo = jitted(plan, jmesh).lower(a, b).compile().as_text()
        explained = shardwise.explain(
            equation, a, b, mesh=mesh, in_specs=[specs] * 2, out_specs=out, mode=mode
        )
    expected = np.einsum(equation, a.astype(np.float64), b.astype(np.float64))
    assert_shards(got, expected, jmesh, Spec.parse(out), **tolerance(dtype, shape[-1]))
    assert CALL in hlo
    assert hlo.count(" all-reduce(") == reduces
    # XLA cannot count the native call; explain counts the local einsum instead
    assert explained.compute is not None and explained.compute.counted_by == "einsum"
    assert explained.compute.flops >= 2 * a.size / jmesh.size


def test_other_programs_keep_xlas_kernels_and_disagreeing_operands_are_resharded_first():
    rng = np.random.default_rng(2)
    a = rng.standard_normal((64, 100)).astype(np.float32)

    def hlo(*arrays, **options):
        plan, jmesh = plan_arrays("nd,nd->n", *arrays, mesh="x=2,y=4", **options)
        return jitted(plan, jmesh).lower(*arrays).compile().as_text()

    # auto mode scattering the sum onto the output: XLA fuses the scatter into its collective
    assert CALL not in hlo(a, a, in_specs=["x,y", "x,y"], out_specs="(x,y)")
    # operands that disagree on a layout are resharded to one layout first; then the kernel runs
    assert CALL in hlo(a, a, in_specs=["x,y", "y,x"], out_specs="x")
    out = shardwise.einsum("nd,nd->n", a, a, mesh="x=2,y=4", in_specs=["x,y", "y,x"], out_specs="x")
    np.testing.assert_allclose(np.asarray(out), np.einsum("nd,nd->n", a, a), rtol=1e-5)
    # float16 and mixed dtypes fall back to jnp.einsum inside the same program
    half = a.astype(np.float16)
    assert CALL not in hlo(half, half, in_specs=["x,y", "x,y"], out_specs="x", mode="manual")
    with jax.enable_x64(True):
        mixed = shardwise.einsum(
            "nd,nd->n", a, a.astype(np.float64), mesh="x=2,y=4", in_specs=["x,y"] * 2
        )
    np.testing.assert_allclose(np.asarray(mixed), np.einsum("nd,nd->n", a, a), rtol=1e-5)


def test_gradients_and_vmap_go_through_it():
    rng = np.random.default_rng(3)
    a, b = (rng.standard_normal((16, 100)).astype(np.float32) for _ in range(2))

    def loss(x, y):
        return (shardwise.einsum("nd,nd->n", x, y, mesh="devices=8", layout="n=devices") ** 2).sum()

    assert np.isclose(float(jax.jit(loss)(a, b)), float(loss(a, b)), rtol=1e-5)
    ga, gb = jax.grad(loss, argnums=(0, 1))(a, b)
    dots = np.einsum("nd,nd->n", a, b)[:, None]
    np.testing.assert_allclose(np.asarray(ga), 2 * dots * b, rtol=1e-4)
    np.testing.assert_allclose(np.asarray(gb), 2 * dots * a, rtol=1e-4)
    batched = jax.vmap(_native.rowdot)(np.stack([a, b]), np.stack([b, b]))
    np.testing.assert_allclose(
        np.asarray(batched),
        np.einsum("knd,knd->kn", np.stack([a, b]), np.stack([b, b])),
        **tolerance(np.float32, 100),
    )


def test_a_failed_build_says_why_and_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError, match="failed"):
        _native.build(_native.KERNELS["rowdot"], "false", tmp_path / "k.so")
    assert list(tmp_path.iterdir()) == []


def test_without_a_compiler_einsums_run_on_xlas_kernels(tmp_path):
    script = textwrap.dedent(
        """
        import numpy as np, jax
        jax.config.update("jax_num_cpu_devices", 8)
        import shardwise
        from shardwise._xla import native as _native
        from shardwise._planner.layout import plan_arrays
        from shardwise._xla.lower import jitted
        a = np.random.default_rng(0).standard_normal((64, 100)).astype(np.float32)
        got = shardwise.einsum("nd,nd->n", a, a, mesh="x=2,y=4", in_specs=["x,y"] * 2)
        np.testing.assert_allclose(np.asarray(got), np.einsum("nd,nd->n", a, a), rtol=1e-5)
        plan, m = plan_arrays("nd,nd->n", a, a, mesh="x=2,y=4", in_specs=["x,y"] * 2)
        assert "shardwise_rowdot" not in jitted(plan, m).lower(a, a).compile().as_text()
        print(_native.available(), _native.why_unavailable())
        """
    )
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path))
    for extra, why in [
        ({"CXX": str(tmp_path / "no-such-compiler")}, "no-such-compiler"),
        ({_native.ENV: "0"}, "SHARDWISE_NATIVE=0"),
    ]:
        done = subprocess.run(
            [sys.executable, "-c", script], env={**env, **extra}, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("False") and why in done.stdout
    assert not (tmp_path / "shardwise" / "native").exists() or not any(
        (tmp_path / "shardwise" / "native").glob("*.so")
    )


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    "shape", [(5, 7, 3), (1, 1, 1), (4, 0, 3), (0, 5, 2), (3, 2, 0), (64, 33, 17)]
)
def test_matmul_equals_numpy(dtype, shape):
    m, k, n = shape
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((m, k)).astype(dtype), rng.standard_normal((k, n)).astype(dtype)
    with jax.enable_x64(dtype == np.float64):
        got = np.asarray(_native.matmul(a, b))
    assert got.dtype == dtype and got.shape == (m, n)
    np.testing.assert_allclose(got, a.astype(np.float64) @ b, **tolerance(dtype, k))


@pytest.mark.parametrize("mode", ["auto", "manual"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    ("specs", "out", "reduces"),
    [
        (["x", "-,y"], "x,y", 0),  # W3's layout: each device one block of the product
        (["devices"] * 1 + ["-"], "devices", 0),  # rows split, b replicated
        (["-,y", "y"], "", 1),  # k split: partial products, summed
    ],
)
def test_matmuls_on_the_mesh_use_it_and_equal_numpy(mode, dtype, specs, out, reduces):
    mesh = "devices=8" if "devices" in specs[0] else "x=2,y=4"
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((64, 48)).astype(dtype), rng.standard_normal((48, 32)).astype(dtype)
    with jax.enable_x64(dtype == np.float64):
        plan, jmesh = plan_arrays(
            "mk,kn->mn", a, b, mesh=mesh, in_specs=specs, out_specs=out, mode=mode
        )
        got = shardwise.einsum(
            "mk,kn->mn", a, b, mesh=mesh, in_specs=specs, out_specs=out, mode=mode
        )
        hlo = jitted(plan, jmesh).lower(a, b).compile().as_text()
        g = jax.grad(
            lambda x: shardwise.einsum(
                "mk,kn->mn", x, b, mesh=mesh, in_specs=specs, out_specs=out
            ).sum()
        )(a)
    assert_shards(got, a.astype(np.float64) @ b, jmesh, Spec.parse(out), **tolerance(dtype, 48))
    assert MATMUL in hlo
    assert hlo.count(" all-reduce(") == reduces
    np.testing.assert_allclose(np.asarray(g), np.ones((64, 32)) @ b.T, **tolerance(dtype, 32))


def test_matmul_needs_a_device_per_core():
    big = {"m": 64, "k": 64, "n": 64}
    op = Op.parse("mk,kn->mn")
    assert native_kernel(op, big, on_cpu=True, devices=_kernels.cores()) == "matmul"
    assert native_kernel(op, big, on_cpu=True, devices=1) == "einsum"
    assert native_kernel(Op.parse("mk,nk->mn"), big, on_cpu=True, devices=8) == "einsum"
