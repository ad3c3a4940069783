"""What differs between the JAX releases shardwise supports, handled in one place.

shardwise is tested on the oldest and the newest JAX that pip serves here (see the README) and
supports, by reading their changelogs and sources, the releases up to the newest it names.
Every difference it must bridge between them is a function here; the rest of the code calls
these and never asks for a version itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from jax.sharding import AxisType, Mesh


def context_mesh() -> Mesh | None:
    """The mesh set by ``jax.set_mesh`` (as a context or for the whole process), or ``None``.

    >>> context_mesh() is None
    True
    """
    found = jax.sharding.get_mesh()
    return found if isinstance(found, Mesh) and not found.empty else None


def has_explicit_axes(mesh: Mesh) -> bool:
    """Whether any of ``mesh``'s axes is Explicit (a mixed mesh has some)."""
    return any(t == AxisType.Explicit for t in mesh.axis_types)


def auto_twin(mesh: Mesh) -> Mesh:
    """``mesh`` with every axis Auto: the same devices, in the same order, under the same
    names. An array placed on one is placed on the other without a copy.

    >>> import numpy as np
    >>> m = Mesh(np.array(jax.devices()[:1]), ("x",), axis_types=(AxisType.Explicit,))
    >>> auto_twin(m).axis_types
    (Auto,)
    """
    if not has_explicit_axes(mesh):
        return mesh
    return Mesh(mesh.devices, mesh.axis_names, axis_types=(AxisType.Auto,) * len(mesh.axis_names))


def with_auto_axes(fn: Callable[..., Any], out_shardings: Any) -> Callable[..., Any]:
    """``fn`` run with every mesh axis Auto, its results then laid out as ``out_shardings``
    (a pytree of ``NamedSharding`` on a mesh with Explicit axes): how a program whose every
    layout is already chosen runs on an Explicit mesh, where each op would otherwise have to
    be told the sharding of its result."""
    return jax.sharding.auto_axes(fn, out_sharding=out_shardings)  # type: ignore[no-any-return]
