"""JAX meshes as shardwise runs on them: a mesh from a description or the one
``jax.set_mesh`` set, the mesh a call runs under, and Explicit axes (an array's layout part of
its type) run as Auto ones inside a program.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
from jax.sharding import AxisType, Mesh, NamedSharding

from shardwise._errors import ArgumentError, SpecError
from shardwise._model.mesh import MeshSpec
from shardwise._model.mesh import mesh as make_mesh
from shardwise._model.spec import Spec
from shardwise._versions import context_mesh

MeshLike = Mesh | MeshSpec | str | Mapping[str, int]
"""A JAX ``Mesh``, or a description of one (``"x=2,y=4"``, ``{"x": 2}``, a ``MeshSpec``)."""


def jax_mesh(value: MeshLike) -> Mesh:
    """``value`` as a JAX ``Mesh``: itself if it is one; the mesh set with ``jax.set_mesh``
    for ``"auto"`` or a description of that mesh's shape; else one built on the devices at
    hand."""
    if isinstance(value, Mesh):
        manual = [n for n, t in zip(value.axis_names, value.axis_types, strict=True)
                  if t == AxisType.Manual]  # fmt: skip
        if manual:
            raise ArgumentError(
                f"mesh axes {', '.join(manual)} are Manual (the axes inside jax.shard_map, "
                "where each device runs its own block): shardwise lays out arrays on Auto or "
                "Explicit axes; pass the mesh as jax.make_mesh gives it."
            )
        return value
    context = context_mesh()
    if context is not None and (
        value == "auto" or MeshSpec.parse(value).axes == MeshSpec.parse(context).axes
    ):
        return context
    return make_mesh(value)


def on_mesh(mesh: Mesh, values: Sequence[Any] = ()) -> contextlib.AbstractContextManager[Any]:
    """Where a program on ``mesh`` is built and run: under ``jax.set_mesh(mesh)`` where
    another mesh is set around the call (JAX refuses a program whose mesh is not the one set),
    but inside a trace (any of ``values`` traced), which runs where its ``jax.jit`` does."""
    context = context_mesh()
    if context is None or context == mesh or any(isinstance(v, jax.core.Tracer) for v in values):
        return contextlib.nullcontext()
    return jax.set_mesh(mesh)


def named(mesh: Mesh, spec: Spec) -> NamedSharding:
    """The ``NamedSharding`` of ``spec`` on ``mesh``."""
    return NamedSharding(mesh, spec.to_partition_spec())


def is_explicit(mesh: Mesh) -> bool:
    """True when the mesh's axes are Explicit (sharding is part of each array's type)."""
    return any(t == AxisType.Explicit for t in mesh.axis_types)


def auto_twin(mesh: Mesh) -> Mesh:
    """``mesh`` with every axis Auto: the same devices, in the same order, under the same
    names. An array placed on one is placed on the other without a copy.

    >>> import numpy as np
    >>> m = Mesh(np.array(jax.devices()[:1]), ("x",), axis_types=(AxisType.Explicit,))
    >>> auto_twin(m).axis_types
    (Auto,)
    """
    if not is_explicit(mesh):
        return mesh
    return Mesh(mesh.devices, mesh.axis_names, axis_types=(AxisType.Auto,) * len(mesh.axis_names))


def with_auto_axes(fn: Callable[..., Any], out_shardings: Any) -> Callable[..., Any]:
    """``fn`` run with every mesh axis Auto, its results then laid out as ``out_shardings``
    (a pytree of ``NamedSharding`` on a mesh with Explicit axes): how a program whose every
    layout is already chosen runs on an Explicit mesh, where each op would otherwise have to
    be told the sharding of its result."""
    return jax.sharding.auto_axes(fn, out_sharding=out_shardings)  # type: ignore[no-any-return]


def platform(mesh: Mesh) -> str:
    """The platform of the mesh's devices: ``"cpu"``, ``"gpu"`` or ``"tpu"``."""
    return str(mesh.devices.flat[0].platform)


def on_cpu(mesh: Mesh) -> bool:
    """Whether the mesh's devices are CPU devices."""
    return platform(mesh) == "cpu"


def local_devices(mesh: Mesh) -> int:
    """How many of the mesh's devices this process drives (they share its cores)."""
    me = jax.process_index()
    return sum(1 for d in mesh.devices.flat if d.process_index == me)


def explicit_part(mesh: Mesh, spec: Spec) -> Spec:
    """``spec`` with only ``mesh``'s Explicit axes: what an array laid out so has for its type
    (on a mixed mesh the Auto axes are not part of it).

    >>> m = jax.make_mesh((1, 1), ("x", "y"), axis_types=(AxisType.Explicit, AxisType.Auto))
    >>> explicit_part(m, Spec.parse("x,y"))
    Spec(entries=(('x',), ()))
    """
    kept = {n for n, t in zip(mesh.axis_names, mesh.axis_types, strict=True)
            if t == AxisType.Explicit}  # fmt: skip
    return Spec(tuple(tuple(a for a in e if a in kept) for e in spec.entries))


def typed_on(mesh: Mesh, out: Any) -> Any:
    """Results computed on ``mesh``'s Auto twin (the same devices), typed by ``mesh``'s axes."""

    def retyped(x: Any) -> Any:
        sharding = getattr(x, "sharding", None)
        if not isinstance(sharding, NamedSharding) or sharding.mesh == mesh:
            return x
        return jax.device_put(x, NamedSharding(mesh, sharding.spec))

    return jax.tree.map(retyped, out)


@contextlib.contextmanager
def explicit_hints() -> Iterator[None]:
    """Turn JAX's Explicit-mode error for a sharded contraction into one that lists the fixes."""
    try:
        yield
    except Exception as e:
        message = str(e)
        if "Contracting dimensions are sharded" not in message:
            raise
        axes = re.findall(r"'(\w+)'", message.split("lhs_contracting_spec=")[-1])
        names = ", ".join(dict.fromkeys(axes)) or "a mesh axis"
        raise SpecError(
            f"a contraction inside the function sums over an index that is sharded on "
            f"`{names}`, and with Explicit mesh axes JAX will not guess the output's layout. "
            f"Any of these resolves it: (1) pass out_sharding=P(...) without `{names}` to that "
            f"einsum/matmul, so the partial sums are all-reduced and the result is replicated "
            f"on `{names}`; (2) pass out_sharding=P(...) that puts `{names}` on one output "
            f"dimension, so the partial sums are reduce-scattered; (3) build the mesh with "
            f"axis_types='auto' and let XLA choose; (4) use shardwise.einsum(..., out_specs=...), "
            f"which passes the output layout for you."
        ) from None
