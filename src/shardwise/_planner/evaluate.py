"""What one solution of a program's planning problem means: each array's layout, each dot's
strategy, and the prediction (time, collectives with the op and source line behind each,
FLOPs, per-device memory at its peak).

Memory is counted in program order: an array is held from the op that makes it to its last
reader (arguments for the whole program); an elementwise result that only elementwise ops read
is fused away, as XLA does. The peak is the largest sum of held blocks at one point.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardwise._model.mesh import MeshSpec
from shardwise._model.profile import Profile
from shardwise._model.spec import Spec
from shardwise._model.strategy import Strategy
from shardwise._planner.costs import (
    Problem,
    dot_cost,
    map_cost,
    map_specs,
    reshard,
    shard_bytes,
)
from shardwise._planner.graph import Graph
from shardwise._planner.nodes import Step
from shardwise._planner.search import Constraint, total

MEMORY_POINTS = 16
"""How many program points, the fullest first, a memory budget is checked at."""


@dataclass(frozen=True, slots=True)
class ProgramCollective:
    """A collective a plan implies: kind, mesh axes, bytes per device, the op and source line
    it belongs to, and how many times it runs (a scan's length)."""

    kind: str
    mesh_axes: tuple[str, ...]
    bytes: int
    op: str
    source: str
    repeat: int = 1

    def to_json(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "mesh_axes": list(self.mesh_axes),
            "bytes": self.bytes,
            "op": self.op,
            "source": self.source,
            "repeat": self.repeat,
        }


@dataclass(frozen=True, slots=True)
class Predicted:
    """A plan's predicted cost per device."""

    seconds: float
    memory_bytes: int
    flops: float
    collectives: tuple[ProgramCollective, ...]

    def to_json(self) -> dict[str, object]:
        return {
            "seconds": self.seconds,
            "memory_bytes": self.memory_bytes,
            "flops": self.flops,
            "collectives": [c.to_json() for c in self.collectives],
        }


@dataclass(frozen=True, slots=True)
class ProgramVerified:
    """What the devices at hand did with one plan."""

    collectives_match: bool
    seconds: float
    memory_bytes: int | None
    collectives: tuple[tuple[str, tuple[str, ...], int], ...]

    def to_json(self) -> dict[str, object]:
        return {
            "collectives_match": self.collectives_match,
            "seconds": self.seconds,
            "memory_bytes": self.memory_bytes,
            "collectives": [
                {"kind": k, "mesh_axes": list(a), "bytes": b} for k, a, b in self.collectives
            ],
        }


@dataclass(frozen=True, slots=True)
class Layouts:
    """A solution read back: each array's spec, and by each step's place in the jaxpr the
    layouts its operands are read in and its result is made in (a dot's strategy; a map's
    operand with the dimensions it needs whole, and its result; whole for an opaque op)."""

    specs: dict[int, Spec]
    steps: dict[tuple[int, ...], tuple[tuple[Spec, ...], Spec]]


def read(graph: Graph, problem: Problem, choice: Sequence[int], mesh: MeshSpec) -> Layouts:
    by_class = {
        label[1]: problem.choices[k][c]
        for k, (label, c) in enumerate(zip(problem.labels, choice, strict=True))
        if label[0] == "class"
    }
    specs: dict[int, Spec] = {v: by_class[root] for v, root in enumerate(graph.classes)}
    steps: dict[tuple[int, ...], tuple[tuple[Spec, ...], Spec]] = {}
    for k, (label, c) in enumerate(zip(problem.labels, choice, strict=True)):
        if label[0] == "dot":
            step = graph.steps[label[1]]
            strategy = problem.choices[k][c]
            assert isinstance(strategy, Strategy) and step.op is not None
            steps[step.key] = (strategy.in_specs(step.op), strategy.out_spec)
    for step in graph.steps:
        if step.kind == "map" and not step.prim.startswith("scan") and not step.implicit:
            whole, mapped, _ = map_specs(graph, step, specs[step.inputs[0]], mesh)
            steps[step.key] = ((whole,), mapped)
        elif step.kind == "opaque":
            steps[step.key] = ((Spec(),) * len(step.inputs), Spec())
    return Layouts(specs, steps)


def predicted(
    graph: Graph,
    problem: Problem,
    choice: Sequence[int],
    mesh: MeshSpec,
    profile: Profile,
) -> tuple[Layouts, Predicted]:
    """The layouts of a solution and their predicted cost."""
    lay = read(graph, problem, choice, mesh)
    var_of = {label: k for k, label in enumerate(problem.labels)}
    found: list[tuple[Any, Any]] = []
    flops = 0.0
    moved: set[tuple[int, Spec, Spec, tuple[int, ...]]] = set()

    def once(a: int, src: Spec, dst: Spec, step: Step) -> tuple[Any, ...]:
        """An array's resharding; the same one again in the same scope is the same ops,
        which XLA computes once."""
        key = (a, src, dst, step.key[:-1])
        if key in moved:
            return ()
        moved.add(key)
        return reshard(graph.values[a], src, dst, mesh, profile, step, 1).collectives

    for k, step in enumerate(graph.steps):
        if step.kind == "dot":
            assert step.op is not None
            label = var_of[("dot", k)]
            strategy = problem.choices[label][choice[label]]
            assert isinstance(strategy, Strategy)
            own = dot_cost(graph, step, strategy, mesh, profile)
            flops += own.flops
            found += own.collectives
            for a, s in zip(step.inputs, strategy.in_specs(step.op), strict=True):
                found += once(a, lay.specs[a], s, step)
            out = graph.values[step.output]
            spec = lay.specs[step.output]
            found += reshard(out, strategy.out_spec, spec, mesh, profile, step, 1).collectives
        elif step.kind == "map":
            src, dst = lay.specs[step.inputs[0]], lay.specs[step.output]
            found += map_cost(graph, step, src, dst, mesh, profile).collectives
        else:
            for a in step.inputs:
                found += once(a, lay.specs[a], Spec(), step)
    collectives = tuple(
        ProgramCollective(
            c.kind,
            c.mesh_axes,
            c.bytes,
            s.prim if s else "",
            s.source if s else "",
            s.repeat if s else 1,
        )
        for c, s in found
        if c.bytes
    )
    memory = int(peak_bytes(graph, lay.specs, mesh))
    return lay, Predicted(total(problem, choice), memory, flops, collectives)


def held(graph: Graph) -> list[int]:
    """The arrays that take memory: arguments, results, and whatever a non-elementwise op
    makes or reads."""
    made = {s.output for s in graph.steps}
    return sorted(set(graph.inputs) | graph.fed | made)


def _live(graph: Graph) -> tuple[list[int], np.ndarray]:
    arrays = held(graph)
    points = graph.clock + 1
    live = np.zeros((points, len(arrays)), dtype=bool)
    for k, v in enumerate(arrays):
        live[graph.born[v] : graph.last[v] + 1, k] = True
    return arrays, live


def peak_bytes(graph: Graph, specs: dict[int, Spec], mesh: MeshSpec) -> int:
    """Per-device bytes held at the fullest point of the program."""
    arrays, live = _live(graph)
    if not arrays:
        return 0
    sizes = np.array([shard_bytes(graph.values[v], specs[v], mesh) for v in arrays], dtype=float)
    return int((live @ sizes).max())


def memory_constraints(
    graph: Graph, problem: Problem, budget: int, mesh: MeshSpec
) -> list[Constraint]:
    """``budget`` as linear constraints at the :data:`MEMORY_POINTS` fullest program points."""
    arrays, live = _live(graph)
    if not arrays:
        return []
    var_of = {label[1]: k for k, label in enumerate(problem.labels) if label[0] == "class"}
    whole = np.array([graph.values[v].nbytes for v in arrays], dtype=float)
    order = np.argsort(-(live @ whole), kind="stable")
    out, seen = [], set()
    for t in order:
        members = tuple(np.flatnonzero(live[t]))
        if members in seen:
            continue
        seen.add(members)
        terms: dict[tuple[int, int], float] = {}
        for k in members:
            v = arrays[k]
            var = var_of[graph.find(v)]
            for c, spec in enumerate(problem.choices[var]):
                assert isinstance(spec, Spec)
                key = (var, c)
                terms[key] = terms.get(key, 0.0) + shard_bytes(graph.values[v], spec, mesh)
        out.append(Constraint(tuple((v, c, b) for (v, c), b in terms.items()), float(budget)))
        if len(out) == MEMORY_POINTS:
            break
    return out
