"""Kernel choice: every path equals NumPy, and the choice follows the shapes and layout."""

from __future__ import annotations

import numpy as np
import pytest

import shardwise
from shardwise import Op
from shardwise._kernels import UNROLL_MAX, choose_kernel, unrolled_einsum


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
