"""The plan of one einsum call: its layout as given, or the planner's best for the devices."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
from jax.sharding import Mesh

from shardwise._caches import cached
from shardwise._errors import ArgumentError
from shardwise._model.mesh import MeshSpec
from shardwise._model.op import Op
from shardwise._model.plan import Plan
from shardwise._model.profile import Profile
from shardwise._model.profile_files import default_profile
from shardwise._model.spec import LayoutLike, Spec, SpecLike
from shardwise._planner.einsum import rank
from shardwise._xla.dtypes import result_dtype
from shardwise._xla.meshes import MeshLike, jax_mesh, platform

log = logging.getLogger("shardwise")


def auto_layout(
    equation: str, shapes: Sequence[Sequence[int]], dtype: Any, mesh: Mesh
) -> tuple[list[Spec], Spec, str]:
    """The planner's best strategy for these shapes on ``mesh``: in_specs, out_spec, and why.

    Uses the calibrated profile of these devices if ``shardwise calibrate`` stored one, else a
    built-in profile for the platform.
    """
    spec = MeshSpec.parse(mesh)
    in_specs, out_spec, why = _auto_layout(
        equation,
        tuple(tuple(int(n) for n in s) for s in shapes),
        np.dtype(dtype).name,
        spec,
        default_profile(platform(mesh), spec.size),
    )
    log.info("auto layout for %s on mesh %s: %s", equation, spec.describe(), why)
    return list(in_specs), out_spec, why


@cached(maxsize=256)
def _auto_layout(
    equation: str,
    shapes: tuple[tuple[int, ...], ...],
    dtype: str,
    spec: MeshSpec,
    profile: Profile,
) -> tuple[tuple[Spec, ...], Spec, str]:
    op = Op.parse(equation)
    report = rank(op, shapes, spec, dtype, profile)
    best = report.best.strategy
    return tuple(best.in_specs(op)), best.out_spec, report.why()


def make_plan(
    equation: str,
    shapes: Sequence[Sequence[int]],
    dtype: Any,
    jmesh: Mesh,
    layout: LayoutLike | Literal["auto"] | None = None,
    in_specs: Sequence[SpecLike] | None = None,
    out_specs: SpecLike | Literal["infer"] = "infer",
    mode: str = "auto",
) -> tuple[Plan, str | None]:
    """The validated plan of an einsum call, and why the planner chose its layout (``None``
    unless ``layout="auto"``)."""
    why = None
    if isinstance(layout, str) and layout == "auto":
        if in_specs is not None:
            raise ArgumentError("give layout='auto' or in_specs=, not both.")
        in_specs, out_specs, why = auto_layout(equation, shapes, dtype, jmesh)
        layout = None
    plan = Plan.make(
        equation,
        shapes,
        mesh=MeshSpec.parse(jmesh),
        dtype=dtype,
        layout=layout,
        in_specs=in_specs,
        out_specs=out_specs,
        mode=mode,
    )
    return plan, why


def plan_arrays(
    equation: str,
    *arrays: Any,
    mesh: MeshLike,
    layout: LayoutLike | Literal["auto"] | None = None,
    in_specs: Sequence[SpecLike] | None = None,
    out_specs: SpecLike | Literal["infer"] = "infer",
    mode: str = "auto",
) -> tuple[Plan, Mesh]:
    """The validated plan of a sharded einsum over ``arrays`` (anything with ``.shape`` and
    ``.dtype``), and the JAX mesh it runs on.

    >>> import numpy as np
    >>> plan, _ = plan_arrays("nd,nd->n", np.ones((8, 3)), np.ones((8, 3)), mesh="x=8",
    ...                       in_specs=["x", "x"])
    >>> plan.out_spec.describe(), plan.dtype
    ('x', 'float64')
    """
    jmesh = jax_mesh(mesh)
    plan, _ = make_plan(
        equation,
        [tuple(a.shape) for a in arrays],
        result_dtype(arrays) if arrays else np.dtype("float32"),
        jmesh,
        layout,
        in_specs,
        out_specs,
        mode,
    )
    return plan, jmesh
