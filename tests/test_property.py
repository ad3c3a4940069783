"""Property tests against NumPy: every enumerated layout of a few equations, and random
sharded einsums of every kind (see ``property_cases``; ``benchmarks/property_sweep.py`` runs
thousands of the same cases)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

import shardwise
from helpers import assert_shards, tolerance
from property_cases import Case, Raw, cases, run_case
from shardwise import MeshSpec, Op
from shardwise._model.mesh import build_mesh
from shardwise._model.strategy import layouts
from shardwise._xla.hlo import KINDS

EQUATIONS = [
    "nd,nd->n",  # batched dot
    "mk,kn->mn",  # matmul
    "bmk,bkn->bmn",  # batched matmul
    "i,j->ij",  # outer product
    "md,nd->mn",  # pairwise similarity
    "ij->i",  # sum reductions
    "ij->j",
    "ijk->",
]
MESHES = ["devices=1", "devices=2", "devices=4", "devices=8", "x=2,y=2", "x=2,y=4", "x=4,y=2"]
SIZES = [1, 2, 3, 4, 6, 8, 12]


@st.composite
def enumerated(draw):
    op = Op.parse(draw(st.sampled_from(EQUATIONS)))
    sizes = {i: draw(st.sampled_from(SIZES), label=f"size of {i}") for i in op.indices}
    mesh = MeshSpec.parse(draw(st.sampled_from(MESHES)))
    return op, sizes, mesh, np.float32


@pytest.mark.slow
@settings(
    max_examples=30,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(enumerated())
def test_every_layout_and_mode_matches_numpy(case):
    op, sizes, mesh_spec, dtype = case
    mesh = build_mesh(mesh_spec)
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal([sizes[i] for i in t]).astype(dtype) for t in op.inputs]
    expected = np.einsum(op.equation, *(a.astype(np.float64) for a in arrays))
    terms = int(np.prod([sizes[i] for i in op.contracted]))
    found = list(layouts(op.indices, sizes, mesh_spec))
    assert found[0].describe() == "replicated"  # replicated is always valid
    for layout in found:
        plan_spec = layout.spec_for(op.output)
        for mode in ("auto", "manual"):
            out = shardwise.einsum(op.equation, *arrays, mesh=mesh, layout=layout, mode=mode)
            assert out.dtype == dtype
            assert_shards(out, expected, mesh, plan_spec, **tolerance(dtype, terms))


def _check_collectives(case: Case, expl: Any, raw: Raw | None) -> None:
    """Every collective of shardwise's program (``expl``) and of plain ``jax.jit(jnp.einsum)``
    with the same shardings (``raw``) was read: a known kind, axes of this mesh, a size. (The
    comparisons between the programs are :func:`property_cases.run_case`'s.)"""
    names = set(MeshSpec.parse(case.mesh).names)
    found = [
        *(expl.collectives if expl is not None else ()),
        *(raw.collectives if raw is not None else ()),
    ]
    for c in found:
        assert c.kind in KINDS, c
        assert set(c.mesh_axes) <= names, c
        assert c.bytes >= 0, c
    assert raw is None or not raw.unparsed, raw.unparsed


@pytest.mark.slow
@settings(
    max_examples=110,
    deadline=None,
    derandomize=True,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
    ],
)
@given(cases())
def test_random_einsums_match_numpy(case: Case) -> None:
    """Any layout jax.jit accepts runs (manual mode refuses operands that disagree, saying
    so), keeps the inputs' dtype, and equals NumPy within rounding; shardwise's program passes
    the contraction check and a kernel adds no collective to the plain einsum's; a wrong raw
    jit program is flagged by the check. See ``run_case`` for each check and
    ``property_cases.PROBLEMS`` for what a failure class means."""
    note(case.describe())
    outcome = run_case(case)
    _check_collectives(case, outcome.explanation, outcome.raw)
    assert outcome.ok, outcome.report()
