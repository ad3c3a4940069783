"""Run a program plan on the devices at hand and check it against the prediction: the compiled
program's collectives (kind, mesh axes, bytes), its memory, and its measured time."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
import numpy as np
from jax.sharding import NamedSharding

from shardwise._planner.apply import constrained
from shardwise._planner.einsum import spearman
from shardwise._planner.evaluate import ProgramVerified
from shardwise._runtime.timing import alternate
from shardwise._xla.hlo import collectives
from shardwise._xla.lower import jax_mesh

if TYPE_CHECKING:
    from shardwise._planner.program import PlannedLayout, ProgramPlan


def _mesh(plan: ProgramPlan, mesh: Any) -> Any:
    return jax_mesh(mesh if mesh is not None else plan.mesh)


def sharded(plan: ProgramPlan, chosen: PlannedLayout, mesh: Any = None) -> Callable[..., Any]:
    """The program, jitted to follow ``chosen`` on ``mesh``."""
    m = _mesh(plan, mesh)
    program = constrained(plan.graph, m, chosen.layouts)
    leaves = [NamedSharding(m, s.to_partition_spec()) for s in chosen.in_specs]
    in_shardings = tuple(jax.tree.unflatten(plan.graph.tree, leaves))
    return jax.jit(program, in_shardings=in_shardings)


def by_kind(found: Any) -> dict[tuple[str, tuple[str, ...]], int]:
    """Bytes per (kind, mesh axes): XLA may combine or split collectives of one kind."""
    out: dict[tuple[str, tuple[str, ...]], int] = {}
    for kind, axes, nbytes in found:
        out[(kind, tuple(axes))] = out.get((kind, tuple(axes)), 0) + nbytes
    return out


def _arrays(plan: ProgramPlan) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    out = []
    for v in plan.graph.inputs:
        value = plan.graph.values[v]
        data = rng.standard_normal(value.shape) * 0.1
        out.append(data.astype(value.dtype))
    return out


TURN_SECONDS = 0.2
"""Each plan's turn at the devices lasts this long at least (several calls of a small
program, their mean counted): single calls of tens of milliseconds ranked ten plans of an MLP
differently from one round to the next on a 2-core machine."""


def verify(
    plan: ProgramPlan, repeat: int = 5, mesh: Any = None, on_step: Any = None
) -> ProgramPlan:
    """Compile and compare every plan of ``plan`` on ``mesh``, then time them all taking turns
    (median of ``repeat`` turns each, a turn at least :data:`TURN_SECONDS` long), so that the
    machine's drift falls on all alike."""
    m = _mesh(plan, mesh)
    leaves = _arrays(plan)
    checked = []
    runners = {}
    for k, item in enumerate(plan.plans):
        if on_step is not None:
            on_step(k, len(plan.plans))
        placed = [
            jax.device_put(x, NamedSharding(m, s.to_partition_spec()))
            for x, s in zip(leaves, item.in_specs, strict=True)
        ]
        args = jax.tree.unflatten(plan.graph.tree, placed)
        compiled = sharded(plan, item, m).lower(*args).compile()  # type: ignore[attr-defined]
        found = collectives(compiled.as_text() or "", plan.mesh.shape)
        got = tuple((c.kind, c.mesh_axes, c.bytes) for c in found)
        want = [(c.kind, c.mesh_axes, c.bytes) for c in item.predicted.collectives]
        memory = compiled.memory_analysis()
        held = None
        if memory is not None:
            held = int(memory.argument_size_in_bytes + memory.output_size_in_bytes
                       + memory.temp_size_in_bytes - memory.alias_size_in_bytes)  # fmt: skip
        checked.append((item, by_kind(got) == by_kind(want), held, got))
        runners[item.name] = functools.partial(compiled, *args)
    seconds = alternate(runners, repeat, at_least=TURN_SECONDS)
    done = [
        dataclasses.replace(item, verified=ProgramVerified(match, seconds[item.name], held, got))
        for item, match, held, got in checked
    ]
    rho = spearman(
        [p.predicted.seconds for p in done], [p.verified.seconds for p in done if p.verified]
    )
    return dataclasses.replace(plan, plans=tuple(done), spearman=rho)
