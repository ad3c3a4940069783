"""Build the JAX program for a :class:`Plan`.

- ``auto``: ``jax.jit`` with a ``NamedSharding`` per operand and for the output; XLA's SPMD
  partitioner inserts whatever collectives the layouts need (the tutorial's ``pjit``).
- ``manual``: ``jax.shard_map`` around a local einsum on each device's block, then an explicit
  ``psum`` over the mesh axes that split a contracted index — "partial dot products, then
  aggregate", written out.

On CPU devices an auto-mode einsum whose local step is a native kernel (``rowdot`` or
``matmul``, see :mod:`shardwise._kernels`) is built the manual way: XLA cannot partition
a call into native code, and the collectives it would have inserted are the same ``psum``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import AxisType, Mesh, NamedSharding

from shardwise._errors import SpecError
from shardwise._kernels import choose_kernel, local_einsum, native_kernel
from shardwise._plan import Plan
from shardwise._spec import Layout, Spec


def named(mesh: Mesh, spec: Spec) -> NamedSharding:
    """The ``NamedSharding`` of ``spec`` on ``mesh``."""
    return NamedSharding(mesh, spec.to_partition_spec())


def is_explicit(mesh: Mesh) -> bool:
    """True when the mesh's axes are Explicit (sharding is part of each array's type)."""
    return any(t == AxisType.Explicit for t in mesh.axis_types)


def on_cpu(mesh: Mesh) -> bool:
    """Whether the mesh's devices are CPU devices."""
    return bool(mesh.devices.flat[0].platform == "cpu")


def local_devices(mesh: Mesh) -> int:
    """How many of the mesh's devices this process drives (they share its cores)."""
    me = jax.process_index()
    return sum(1 for d in mesh.devices.flat if d.process_index == me)


def _agree(plan: Plan) -> bool:
    """The operands' splits merge into one layout (a replicated operand agrees with any)."""
    merged: dict[str, tuple[str, ...]] = {}
    for term, spec in zip(plan.op.inputs, plan.in_specs, strict=True):
        for index, entry in zip(term, spec.padded(len(term)), strict=True):
            if entry and merged.setdefault(index, entry) != entry:
                return False
    try:
        Layout(tuple(sorted(merged.items())))
    except SpecError:
        return False
    return True


def _keeps_output(plan: Plan) -> bool:
    """Whether the output stays laid out as the operands' layout leaves it (no scatter or
    gather after the sum, which XLA may fuse into its collectives)."""
    n = len(plan.op.output)
    return plan.out_spec.padded(n) == plan.layout.spec_for(plan.op.output).padded(n)


@functools.lru_cache(maxsize=128)
def jitted(plan: Plan, mesh: Mesh, precision: Any = None) -> Callable[..., jax.Array]:
    """The jitted program of ``plan``, built once per plan, mesh and precision: calls take
    JAX's fast dispatch path, and explaining or compiling it reuses the same program."""
    return lower(plan, mesh, precision)


@functools.lru_cache(maxsize=32)
def divided(plan: Plan, mesh: Mesh, divisor: int) -> Callable[..., jax.Array]:
    """``plan``'s program with its result divided by ``divisor``, as one program: a mean is
    one dispatch, not an einsum and then a division on every device (on the 8 simulated
    devices of the 2-core CI machine kind, the second dispatch alone took 0.4–0.8 ms)."""
    program = jitted(plan, mesh)
    return jax.jit(lambda *arrays: program(*arrays) / divisor)


def lower(plan: Plan, mesh: Mesh, precision: Any = None) -> Callable[..., jax.Array]:
    """The jitted function that computes ``plan`` on ``mesh``.

    Args:
        plan: a validated plan; ``mesh`` must have the plan's axes and sizes.
        mesh: the JAX mesh to run on.
        precision: passed to ``jnp.einsum`` (e.g. ``"highest"``).
    """
    op = plan.op
    equation = op.equation
    in_shardings = tuple(named(mesh, s) for s in plan.in_specs)
    out_sharding = named(mesh, plan.out_spec)
    sizes = op.sizes(plan.shapes)
    if plan.mode == "auto":
        explicit_out = out_sharding if is_explicit(mesh) else None
        # unrolling slices the contracted indices: only where no device boundary cuts them,
        # and where the operands agree on a layout (else XLA reshards one dot more cheaply
        # than many slices); a product with ones is one dot, whatever the layout
        split = {
            i
            for t, s in zip(op.inputs, plan.in_specs, strict=True)
            for i, e in zip(t, s.padded(len(t)), strict=True)
            if e
        }
        kernel = choose_kernel(op, sizes)
        if (
            kernel == "einsum"
            and explicit_out is None
            and _agree(plan)
            and _keeps_output(plan)
            and native_kernel(op, _local_sizes(plan), on_cpu(mesh), local_devices(mesh))
            in ("rowdot", "matmul")
        ):
            return _shard_mapped(plan, mesh, precision)
        if explicit_out is not None or (
            kernel == "unrolled" and (split & set(op.contracted) or not _agree(plan))
        ):
            kernel = "einsum"

        def sharded_einsum(*xs: jax.Array) -> jax.Array:
            if kernel != "einsum":
                return local_einsum(op, kernel, *xs, precision=precision)
            return jnp.einsum(equation, *xs, precision=precision, out_sharding=explicit_out)

        return jax.jit(sharded_einsum, in_shardings=in_shardings, out_shardings=out_sharding)
    return _shard_mapped(plan, mesh, precision)


def _local_sizes(plan: Plan) -> dict[str, int]:
    """Each index's size in one device's block, under the operands' common layout."""
    op, layout = plan.op, plan.layout
    sizes = op.sizes(plan.shapes)
    local = dict(
        zip(
            op.output,
            layout.spec_for(op.output).shard_shape(plan.mesh, tuple(sizes[i] for i in op.output)),
            strict=True,
        )
    )
    for term in op.inputs:
        shape = tuple(sizes[i] for i in term)
        local.update(zip(term, layout.spec_for(term).shard_shape(plan.mesh, shape), strict=True))
    return local


def _shard_mapped(plan: Plan, mesh: Mesh, precision: Any) -> Callable[..., jax.Array]:
    """``jax.shard_map`` of the local einsum on each device's block, then ``psum``."""
    op = plan.op
    in_shardings = tuple(named(mesh, s) for s in plan.in_specs)
    out_sharding = named(mesh, plan.out_spec)
    layout = plan.layout
    local_in = tuple(layout.spec_for(t).to_partition_spec() for t in plan.op.inputs)
    local_out = layout.spec_for(plan.op.output).to_partition_spec()
    reduce_axes = plan.reduce_axes
    kernel = native_kernel(op, _local_sizes(plan), on_cpu(mesh), local_devices(mesh))

    def per_device(*blocks: jax.Array) -> jax.Array:
        partial = local_einsum(op, kernel, *blocks, precision=precision)
        return jax.lax.psum(partial, reduce_axes) if reduce_axes else partial

    mapped = jax.shard_map(per_device, mesh=mesh, in_specs=local_in, out_specs=local_out)
    return jax.jit(mapped, in_shardings=in_shardings, out_shardings=out_sharding)
