"""Compile a plan (or any sharded function) and read back what XLA did: shards and collectives."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from shardwise._hlo import Collective, collectives
from shardwise._lower import lower, named
from shardwise._mesh import MeshSpec
from shardwise._plan import ArrayInfo, Plan
from shardwise._spec import Spec


@dataclass(frozen=True, slots=True)
class Explanation:
    """What a compiled sharded computation does on each device.

    Attributes:
        equation: the einsum equation, or ``None`` for an arbitrary function.
        mesh: the mesh it ran on.
        mode: ``"auto"`` (XLA inserts collectives) or ``"manual"`` (shard_map + psum).
        operands: each input's shape, dtype, spec and shard shape.
        outputs: the same for each output (one for an einsum).
        collectives: every collective in the compiled HLO, in program order.
    """

    equation: str | None
    mesh: MeshSpec
    mode: str
    operands: tuple[ArrayInfo, ...]
    outputs: tuple[ArrayInfo, ...]
    collectives: tuple[Collective, ...]

    @property
    def output(self) -> ArrayInfo:
        """The single output (einsums have exactly one)."""
        return self.outputs[0]

    def to_json(self) -> dict[str, Any]:
        """The ``shardwise explain --json`` contract (later work adds keys, never removes them)."""
        data: dict[str, Any] = {
            "equation": self.equation,
            "mesh": self.mesh.shape,
            "mode": self.mode,
            "operands": [o.to_json() for o in self.operands],
            "output": self.outputs[0].to_json() if len(self.outputs) == 1 else None,
            "collectives": [c.to_json() for c in self.collectives],
        }
        if len(self.outputs) != 1:
            data["outputs"] = [o.to_json() for o in self.outputs]
        return data

    def __rich__(self) -> Any:
        from shardwise._render import explanation_panel

        return explanation_panel(self)

    def __str__(self) -> str:
        from shardwise._render import to_text

        return to_text(self)


def mesh_matches(plan: Plan, mesh: Mesh) -> None:
    """Guard against running a plan on a mesh of another shape."""
    have = MeshSpec.parse(mesh)
    if have.axes != plan.mesh.axes:
        raise ValueError(f"plan is for mesh {plan.mesh.describe()}, got {have.describe()}")


@functools.lru_cache(maxsize=128)
def compile_plan(plan: Plan, mesh: Mesh, precision: Any = None) -> jax.stages.Compiled:
    """Lower and compile ``plan`` on ``mesh`` from shapes alone (no data needed)."""
    mesh_matches(plan, mesh)
    fn = lower(plan, mesh, precision)
    args = [
        jax.ShapeDtypeStruct(info.shape, np.dtype(plan.dtype), sharding=named(mesh, info.spec))
        for info in plan.operands
    ]
    return fn.lower(*args).compile()  # type: ignore[attr-defined,no-any-return]


def explain_compiled(plan: Plan, compiled: jax.stages.Compiled) -> Explanation:
    """The explanation of a compiled plan."""
    return Explanation(
        equation=plan.op.equation,
        mesh=plan.mesh,
        mode=plan.mode,
        operands=plan.operands,
        outputs=(plan.output,),
        collectives=tuple(collectives(compiled.as_text() or "", plan.mesh.shape)),
    )


def array_info(shape: Sequence[int], dtype: Any, sharding: Any, mesh: MeshSpec) -> ArrayInfo:
    """Describe one array of a compiled function from its sharding."""
    shape_t = tuple(int(n) for n in shape)
    if isinstance(sharding, NamedSharding):
        spec = Spec.parse(sharding.spec)
        shard = spec.shard_shape(mesh, shape_t)
    else:
        spec = Spec(())
        shard = tuple(sharding.shard_shape(shape_t)) if sharding is not None else shape_t
    return ArrayInfo(shape_t, np.dtype(dtype).name, spec, shard)
