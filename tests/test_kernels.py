"""Kernel choice: every path equals NumPy, and the choice follows the shapes and layout."""

from __future__ import annotations

import numpy as np
import pytest

import shardwise
from shardwise import Op
from shardwise._xla.kernels import UNROLL_MAX, choose_kernel, unrolled_einsum


@pytest.mark.parametrize(
    ("equation", "shapes"),
    [
        ("nd,nd->n", [(10, 3), (10, 3)]),
        ("mk,kn->mn", [(4, 2), (2, 5)]),
        ("bmk,bkn->bmn", [(3, 4, 2), (3, 2, 4)]),
        ("ij->i", [(5, 4)]),
        ("ijk->", [(2, 2, 2)]),
        ("nd,dn->", [(3, 2), (2, 3)]),
        ("md,nd->nm", [(4, 3), (5, 3)]),
        ("abd,d->ba", [(2, 3, 2), (2,)]),
    ],
)
def test_unrolled_equals_numpy(equation, shapes):
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s) for s in shapes]
    got = np.asarray(unrolled_einsum(Op.parse(equation), *arrays))
    np.testing.assert_allclose(got, np.einsum(equation, *arrays), rtol=1e-5, atol=1e-5)


def test_choice_follows_the_number_of_terms():
    op = Op.parse("mk,kn->mn")
    assert choose_kernel(op, {"m": 8, "k": UNROLL_MAX, "n": 8}) == "unrolled"
    assert choose_kernel(op, {"m": 8, "k": UNROLL_MAX + 1, "n": 8}) == "einsum"
    assert choose_kernel(Op.parse("i,j->ij"), {"i": 2, "j": 2}) == "einsum"


@pytest.mark.parametrize("mode", ["auto", "manual"])
@pytest.mark.parametrize("layout", ["n=devices", "d=devices", ""])
def test_small_contractions_are_right_on_every_layout(mode, layout):
    rng = np.random.default_rng(1)
    a, b = (rng.random((16, 8), dtype=np.float32) for _ in range(2))
    out = shardwise.einsum("nd,nd->n", a, b, mesh="devices=8", layout=layout, mode=mode)
    np.testing.assert_allclose(np.asarray(out), np.einsum("nd,nd->n", a, b), rtol=1e-5)


def test_unrolled_program_has_no_dot():
    e = shardwise.explain_einsum(
        "nd,nd->n", [(80, 3)] * 2, mesh="devices=8", in_specs=["devices", "devices"]
    )
    assert e.collectives == ()
    # a sharded contracted index keeps dot_general and its all-reduce
    e = shardwise.explain_einsum(
        "nd,nd->n", [(8, 8)] * 2, mesh="devices=8", in_specs=["-,devices", "-,devices"]
    )
    assert [c.kind for c in e.collectives] == ["all-reduce"]


def test_long_sums_over_trailing_indices_are_products_with_ones():
    big = {"i": 64, "j": 64, "k": 64}
    assert choose_kernel(Op.parse("ij->"), big) == "ones"
    assert choose_kernel(Op.parse("ijk->i"), big) == "ones"
    assert choose_kernel(Op.parse("ijk->ij"), big) == "ones"
    assert choose_kernel(Op.parse("ij->j"), big) == "einsum"  # a leading index summed
    assert choose_kernel(Op.parse("ijk->ik"), big) == "einsum"
    assert choose_kernel(Op.parse("i->"), big) == "einsum"
    assert choose_kernel(Op.parse("ij->"), {"i": 2, "j": 3}) == "unrolled"


@pytest.mark.parametrize("mode", ["auto", "manual"])
@pytest.mark.parametrize(
    ("equation", "shape", "layout"),
    [
        ("ij->", (64, 40), "i=devices"),  # the tutorial's data.mean()
        ("ij->", (64, 40), "j=devices"),  # the summed trailing index split too
        ("ij->", (32, 40), "i=x,j=y"),
        ("ijk->i", (16, 8, 12), "i=x,k=y"),
        ("ijk->ij", (16, 8, 10), "j=devices"),
    ],
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_products_with_ones_equal_numpy(mode, equation, shape, layout, dtype):
    import jax

    from shardwise._planner.layout import plan_arrays
    from shardwise._xla.lower import jitted

    mesh = "x=2,y=4" if "x" in layout else "devices=8"
    x = np.random.default_rng(2).standard_normal(shape).astype(dtype)
    with jax.enable_x64(dtype == np.float64):
        got = shardwise.einsum(equation, x, mesh=mesh, layout=layout, mode=mode)
        plan, jmesh = plan_arrays(equation, x, mesh=mesh, layout=layout, mode=mode)
        hlo = jitted(plan, jmesh).lower(x).compile().as_text()
    expected = np.einsum(equation, x.astype(np.float64))
    tol = {np.float16: 1e-2, np.float32: 1e-5, np.float64: 1e-12}[dtype]
    np.testing.assert_allclose(np.asarray(got, np.float64), expected, rtol=tol, atol=tol * 10)
    assert (" dot(" in hlo) == (dtype != np.float16)  # float16 sums stay jnp.einsum's
