"""Device meshes: parse a description once into a :class:`MeshSpec`, then build a JAX ``Mesh``.

Descriptions: ``"devices=8"``, ``"x=2,y=4"``, a dict ``{"x": 2, "y": 4}``, or ``"auto"``
(every device on one axis named ``devices``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, TypeAlias

import jax
import numpy as np
from jax.sharding import AxisType, Mesh

from shardwise._errors import ArgumentTypeError, MeshError

AxisTypeName: TypeAlias = Literal["auto", "explicit"]
AXIS_TYPES: tuple[AxisTypeName, ...] = ("auto", "explicit")
AUTO_AXIS = "devices"
"""Name of the single axis of an ``"auto"`` mesh (the tutorial's name)."""

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True, slots=True)
class MeshSpec:
    """A device mesh as data: named axes with sizes, and the axes' type.

    >>> MeshSpec.parse("x=2,y=4")
    MeshSpec(axes=(('x', 2), ('y', 4)), axis_type='auto')
    >>> MeshSpec.parse("x=2,y=4").size
    8
    """

    axes: tuple[tuple[str, int], ...]
    axis_type: AxisTypeName = "auto"

    def __post_init__(self) -> None:
        if not self.axes:
            raise MeshError("a mesh needs at least one axis, e.g. 'devices=8' or 'x=2,y=4'.")
        seen: set[str] = set()
        for name, size in self.axes:
            if not _NAME.match(name):
                raise MeshError(
                    f"mesh axis name {name!r} is not a valid name; use letters, digits and "
                    "underscores, starting with a letter, e.g. 'x' or 'devices'."
                )
            if name in seen:
                raise MeshError(
                    f"mesh axis {name!r} appears twice in {self.describe()!r}; give each axis "
                    "a different name."
                )
            seen.add(name)
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise MeshError(
                    f"mesh axis {name!r} has size {size!r}; sizes must be whole numbers of at "
                    "least 1."
                )
        if self.axis_type not in AXIS_TYPES:
            raise MeshError(f"axis type {self.axis_type!r} is not one of {', '.join(AXIS_TYPES)}.")

    @property
    def names(self) -> tuple[str, ...]:
        """Axis names in mesh order."""
        return tuple(name for name, _ in self.axes)

    @property
    def shape(self) -> dict[str, int]:
        """Axis name → size, in mesh order."""
        return dict(self.axes)

    @property
    def splitting(self) -> tuple[tuple[str, int], ...]:
        """The axes (name, size) that split what they are put on: those of size above 1.

        >>> MeshSpec.parse("x=2,y=1,z=4").splitting
        (('x', 2), ('z', 4))
        """
        return tuple((name, size) for name, size in self.axes if size > 1)

    @property
    def size(self) -> int:
        """Number of devices in the mesh."""
        return math.prod(size for _, size in self.axes)

    def describe(self) -> str:
        """The canonical text form, e.g. ``'x=2,y=4'``."""
        return ",".join(f"{name}={size}" for name, size in self.axes)

    @classmethod
    def parse(
        cls,
        value: str | Mapping[str, int] | MeshSpec | Mesh,
        *,
        device_count: int | None = None,
        axis_type: AxisTypeName = "auto",
    ) -> MeshSpec:
        """Parse a mesh description.

        Args:
            value: ``"x=2,y=4"``, ``{"x": 2, "y": 4}``, ``"auto"``, a ``MeshSpec`` or a
                JAX ``Mesh``.
            device_count: the number of devices ``"auto"`` spreads over.
            axis_type: ``"auto"`` (the tutorial's pjit semantics) or ``"explicit"``.

        >>> MeshSpec.parse({"devices": 8})
        MeshSpec(axes=(('devices', 8),), axis_type='auto')
        >>> MeshSpec.parse("auto", device_count=4)
        MeshSpec(axes=(('devices', 4),), axis_type='auto')
        """
        if isinstance(value, MeshSpec):
            return value
        if isinstance(value, Mesh):
            explicit = any(t == AxisType.Explicit for t in value.axis_types)
            return cls(
                tuple((str(n), int(s)) for n, s in value.shape.items()),
                "explicit" if explicit else "auto",
            )
        if isinstance(value, Mapping):
            return cls(tuple((str(k), v) for k, v in value.items()), axis_type)
        if not isinstance(value, str):
            raise ArgumentTypeError(
                f"a mesh is described by a string like 'x=2,y=4', a dict or a jax Mesh; got "
                f"{type(value).__name__}."
            )
        text = value.strip()
        if text == "auto":
            if device_count is None:
                raise MeshError("mesh 'auto' needs the device count to spread over.")
            return cls(((AUTO_AXIS, device_count),), axis_type)
        axes: list[tuple[str, int]] = []
        for part in text.split(","):
            name, sep, size = part.partition("=")
            name, size = name.strip(), size.strip()
            if not sep or not name or not size:
                raise MeshError(
                    f"cannot read mesh {value!r}: each axis is written name=size, separated by "
                    "commas, e.g. 'devices=8' or 'x=2,y=4' (or 'auto' for all devices)."
                )
            try:
                count = int(size)
            except ValueError:
                raise MeshError(
                    f"cannot read mesh {value!r}: the size of axis {name!r} is {size!r}, not a "
                    "whole number."
                ) from None
            axes.append((name, count))
        return cls(tuple(axes), axis_type)


def mesh(
    value: str | Mapping[str, int] | MeshSpec | Mesh = "auto",
    *,
    axis_types: AxisTypeName | None = None,
    devices: list[jax.Device] | None = None,
) -> Mesh:
    """Build a JAX ``Mesh`` with named axes from a description.

    Uses the first ``size`` devices of the default platform (the real GPUs or
    TPUs where there are some, else CPU devices, simulated with
    :func:`use_cpu_devices`). Axis types are Auto by default, the semantics of
    the tutorial's ``pjit``; pass ``axis_types="explicit"`` for Explicit axes.

    Args:
        value: ``"x=2,y=4"``, ``{"x": 2, "y": 4}``, ``"auto"``, a ``MeshSpec`` or a JAX ``Mesh``.
        axis_types: ``"auto"`` or ``"explicit"``; by default the spec's own (Auto).
        devices: the devices to place on the mesh, by default ``jax.devices()``.

    >>> m = mesh("x=2,y=4")
    >>> dict(m.shape)
    {'x': 2, 'y': 4}
    """
    if isinstance(value, Mesh) and axis_types is None:
        return value
    pool = list(devices) if devices is not None else jax.devices()
    spec = MeshSpec.parse(value, device_count=len(pool), axis_type=axis_types or "auto")
    if axis_types is not None and spec.axis_type != axis_types:
        spec = MeshSpec(spec.axes, axis_types)
    return build_mesh(spec, pool)


def build_mesh(spec: MeshSpec, pool: list[jax.Device] | None = None) -> Mesh:
    """Place the first ``spec.size`` devices of ``pool`` on a mesh of ``spec``'s shape."""
    pool = list(pool) if pool is not None else jax.devices()
    if spec.size > len(pool):
        platform = pool[0].platform if pool else "cpu"
        launch = f"shardwise launch -n N --devices-per-process K with N × K = {spec.size}"
        python, shell = (
            (
                f" Simulate more CPU devices: shardwise.use_cpu_devices({spec.size}) before "
                f"any JAX computation, or run under {launch}.",
                f" Simulate more CPU devices: --devices {spec.size}, or run under {launch}.",
            )
            if platform == "cpu"
            else (" Use a mesh whose axis sizes multiply to at most the device count.",) * 2
        )
        fact = (
            f"mesh {spec.describe()!r} needs {spec.size} devices, but only {len(pool)} "
            f"{platform} device{'s are' if len(pool) != 1 else ' is'} available."
        )
        raise MeshError(fact + python, shell=fact + shell)
    grid = np.array(pool[: spec.size], dtype=object).reshape([s for _, s in spec.axes])
    kind = AxisType.Explicit if spec.axis_type == "explicit" else AxisType.Auto
    return Mesh(grid, spec.names, axis_types=(kind,) * len(spec.axes))
