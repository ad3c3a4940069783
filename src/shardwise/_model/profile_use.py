"""Checks of a profile against where it is used: the platform that compiles the plans it
predicts, and the mesh a calibrated profile's links were measured on."""

from __future__ import annotations

import re
import warnings

from shardwise._errors import ArgumentError, ShardwiseError, ShardwiseWarning
from shardwise._model.mesh import MeshSpec
from shardwise._model.profile import Profile

_SAID = re.compile(r"\bmesh ([A-Za-z_][\w]*=\d+(?:,[A-Za-z_][\w]*=\d+)*)")
"""How ``shardwise calibrate`` named the mesh in a profile's ``sources`` before profiles
recorded it in a field of their own (``"... mesh data=2,model=4, 2026-11-30; ..."``)."""


def check_platform(profile: Profile, platform: str, what: str) -> None:
    """Refuse to check ``profile``'s predictions against programs compiled for ``platform``
    (``what`` says who checks) when the profile is for another platform: it predicts the
    collectives XLA emits there, which differ (a TPU's reduce-scatter is a CPU's all-reduce
    and slice), so every comparison would be wrong.

    Raises:
        ArgumentError: when the platforms differ.
    """
    if profile.platform != platform:
        raise ArgumentError(
            f"{what} compiles and runs the plans on the {platform} devices here, but profile "
            f"{profile.name!r} is for {profile.platform} devices: its predictions are of what "
            f"XLA does on {profile.platform}, so they cannot be checked here. Plan with a "
            f"{platform} profile (or none: the devices' own) to verify, or plan for "
            f"{profile.platform} without verifying."
        )


def measured_mesh(profile: Profile) -> MeshSpec | None:
    """The mesh ``profile``'s per-axis links were measured on: its ``mesh``, or for a profile
    calibrated before it had one, the mesh its sources name; ``None`` where neither says.

    >>> from shardwise._model.profile import BUILTIN
    >>> measured_mesh(BUILTIN["cpu-2core"]).describe()
    'data=2,model=4'
    >>> measured_mesh(BUILTIN["h100"]) is None
    True
    """
    said = profile.mesh
    if said is None:
        found = _SAID.search(profile.sources.get("all", ""))
        said = found.group(1) if found else None
    if said is None:
        return None
    try:
        return MeshSpec.parse(said)
    except ShardwiseError:
        return None


def mesh_mismatch(profile: Profile, mesh: MeshSpec) -> str | None:
    """Why ``profile``'s measured links do not fit ``mesh``, or ``None`` where they do: an
    axis it measured has another size in ``mesh`` (its ring has another number of steps, and
    on simulated CPU devices another rate), so the collectives along it are predicted from a
    ring it never ran.

    >>> from shardwise._model.profile import Link
    >>> p = Profile("local-cpu-8", "cpu", {"float32": 1e10}, 1e9, None, Link(1e-4, 1e9),
    ...             axis_links={"model": Link(1e-4, 1e9)}, mesh="data=2,model=4")
    >>> mesh_mismatch(p, MeshSpec.parse("data=4,model=2")).split(", where")[0]
    "profile 'local-cpu-8' measured its links on mesh data=2,model=4"
    >>> mesh_mismatch(p, MeshSpec.parse("x=8")) is None  # (the general link applies)
    True
    """
    measured = measured_mesh(profile)
    if measured is None:
        return None
    sizes = dict(measured.axes)
    linked = {*profile.axis_links, *profile.gather_links}
    for axis, size in mesh.axes:
        if axis in linked and axis in sizes and sizes[axis] != size:
            return (
                f"profile {profile.name!r} measured its links on mesh {measured.describe()}, "
                f"where axis {axis!r} has {sizes[axis]} devices; on mesh {mesh.describe()} it "
                f"has {size}, so collectives along {axis!r} are predicted from a ring of "
                f"another size. Measure this mesh with shardwise calibrate --mesh "
                f"{mesh.describe()} (--out FILE keeps the other), or plan with a profile "
                "measured on it."
            )
    return None


def check_mesh(profile: Profile, mesh: MeshSpec) -> None:
    """Warn (:class:`~shardwise.ShardwiseWarning`) where :func:`mesh_mismatch` finds one."""
    why = mesh_mismatch(profile, mesh)
    if why is not None:
        warnings.warn(why, ShardwiseWarning, stacklevel=3)
