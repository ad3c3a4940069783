"""Build the JAX program for a :class:`Plan`.

- ``auto``: ``jax.jit`` with a ``NamedSharding`` per operand and for the output; XLA's SPMD
  partitioner inserts whatever collectives the layouts need (the tutorial's ``pjit``).
- ``manual``: ``jax.shard_map`` around a local einsum on each device's block, then an explicit
  ``psum`` over the mesh axes that split a contracted index — "partial dot products, then
  aggregate", written out.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import AxisType, Mesh, NamedSharding

from shardwise._plan import Plan
from shardwise._spec import Spec


def named(mesh: Mesh, spec: Spec) -> NamedSharding:
    """The ``NamedSharding`` of ``spec`` on ``mesh``."""
    return NamedSharding(mesh, spec.to_partition_spec())


def is_explicit(mesh: Mesh) -> bool:
    """True when the mesh's axes are Explicit (sharding is part of each array's type)."""
    return any(t == AxisType.Explicit for t in mesh.axis_types)


def lower(plan: Plan, mesh: Mesh, precision: Any = None) -> Callable[..., jax.Array]:
    """The jitted function that computes ``plan`` on ``mesh``.

    Args:
        plan: a validated plan; ``mesh`` must have the plan's axes and sizes.
        mesh: the JAX mesh to run on.
        precision: passed to ``jnp.einsum`` (e.g. ``"highest"``).
    """
    equation = plan.op.equation
    in_shardings = tuple(named(mesh, s) for s in plan.in_specs)
    out_sharding = named(mesh, plan.out_spec)
    if plan.mode == "auto":
        explicit_out = out_sharding if is_explicit(mesh) else None

        def sharded_einsum(*xs: jax.Array) -> jax.Array:
            return jnp.einsum(equation, *xs, precision=precision, out_sharding=explicit_out)

        return jax.jit(sharded_einsum, in_shardings=in_shardings, out_shardings=out_sharding)

    layout = plan.layout
    local_in = tuple(layout.spec_for(t).to_partition_spec() for t in plan.op.inputs)
    local_out = layout.spec_for(plan.op.output).to_partition_spec()
    reduce_axes = plan.reduce_axes

    def local_einsum(*blocks: jax.Array) -> jax.Array:
        partial = jnp.einsum(equation, *blocks, precision=precision)
        return jax.lax.psum(partial, reduce_axes) if reduce_axes else partial

    mapped = jax.shard_map(local_einsum, mesh=mesh, in_specs=local_in, out_specs=local_out)
    return jax.jit(mapped, in_shardings=in_shardings, out_shardings=out_sharding)
