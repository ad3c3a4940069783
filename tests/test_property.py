"""Property test: equations × shapes × meshes × every valid layout × both modes, against NumPy."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shardwise
from helpers import assert_shards, tolerance
from shardwise import MeshSpec, Op
from shardwise._mesh import build_mesh
from shardwise._strategy import layouts

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
def cases(draw):
    op = Op.parse(draw(st.sampled_from(EQUATIONS)))
    sizes = {i: draw(st.sampled_from(SIZES), label=f"size of {i}") for i in op.indices}
    mesh = MeshSpec.parse(draw(st.sampled_from(MESHES)))
    return op, sizes, mesh, np.float32


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(cases())
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
