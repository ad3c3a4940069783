"""When XLA runs the steps of a rematerialised function's backward pass (``jax.checkpoint``,
``eqx.filter_checkpoint``: a ``remat2`` call, which the graph builder inlines), where that is
not program order, and so how long the arrays they read are held.

A differentiated checkpoint's body reads the forward pass's saved arrays (its inputs, the
"residuals") and the gradient flowing back. The steps of the body that read saved arrays only
(the recomputed forward ops) depend on nothing the backward pass makes, and XLA's scheduler,
which orders ops to keep memory low, runs them as soon as their operands exist, in the
forward pass, and holds their (sharded, smaller) results instead of the saved array; it makes
the copy of a saved array that a backward step reads in another layout (a weight gradient
reading a replicated activation split over the batch) as soon as the array is made, too; and
a step whose result is the program's (a weight's gradient, whose buffer is held from the
start anyway) it runs as soon as its operands exist, so that they are freed. Seen in the
compiled schedules of an Equinox MLP with checkpointed layers on a 2×4 mesh
(``eqx-checkpoint`` in tests/library_models.py): the recomputed layer's ``f32[64,16]`` dot
scheduled right after the forward ``tanh``, the activation's ``f32[64,32]`` slice for the
weight gradient right after it, the ``f32[64,64]`` activation freed there, not at the end of
the backward pass; and a layer's weight gradient run before its input gradient. With or
without the optimisation barrier that JAX's own lowering puts on the saved arrays, alike.
Pure: it reads the traced jaxpr's structure, no devices.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from shardwise._program.graph import Graph
from shardwise._program.rules import rule_of
from shardwise._program.walk import Path

REMAT = frozenset({"remat2", "checkpoint"})
"""The names JAX's checkpoint primitive has gone by."""


class Schedule(NamedTuple):
    """Where XLA runs steps earlier than program order: ``at`` maps a step's index to the
    program point it runs at; ``early`` holds the (step index, operand position) pairs whose
    copy of a saved array is made as soon as the array is, and held until the step."""

    at: dict[int, int]
    early: frozenset[tuple[int, int]]

    def point(self, graph: Graph, k: int) -> int:
        """The program point step ``k`` runs at."""
        return self.at.get(k, graph.born[graph.steps[k].output])


def bodies(graph: Graph) -> list[Path]:
    """The paths in the jaxpr of the bodies of differentiated checkpoints (the backward pass's
    recomputation; a checkpoint that is not differentiated runs where it stands)."""
    if graph.closed is None:
        return []
    out: list[Path] = []
    _find(graph.closed.jaxpr, (), out)
    return out


def _find(jaxpr: Any, path: Path, out: list[Path]) -> None:
    for k, eqn in enumerate(jaxpr.eqns):
        here = (*path, k)
        rule = rule_of(eqn.primitive.name)
        if eqn.primitive.name in REMAT and eqn.params.get("differentiated"):
            out.append(here)
        if rule.kind == "call" and rule.callee in eqn.params:
            inner = eqn.params[rule.callee]
            _find(getattr(inner, "jaxpr", inner), here, out)
        elif rule.kind == "scan":
            _find(eqn.params["jaxpr"].jaxpr, here, out)
        elif rule.kind == "cond":
            for b, branch in enumerate(eqn.params["branches"]):
                _find(branch.jaxpr, (*here, b), out)


def schedule(graph: Graph, copied: Callable[[], set[tuple[int, int]]]) -> Schedule:
    """Where XLA runs the steps of differentiated checkpoints' bodies (the module's account):
    a step that reads only arrays of the forward pass as soon as they exist; one whose result
    is the program's as soon as its operands do; and the copies ``copied()`` names (step
    index, operand position: those a step reads in a layout other than the array's own, no
    bigger per device) of forward arrays as soon as those are made. A program with no
    differentiated checkpoint runs in program order."""
    found = bodies(graph)
    if not found:
        return Schedule({}, frozenset())
    slices = copied()
    backward = [graph.born[s.output] for s in graph.steps if s.backward]
    start = min(backward) if backward else graph.clock + 1
    arguments = set(graph.inputs)
    results = {v for v in graph.outputs if v is not None}
    at: dict[int, int] = {}
    early = set()
    for k, step in enumerate(graph.steps):
        if not any(step.key[: len(b)] == b for b in found) or step.implicit or not step.inputs:
            continue  # (a broadcast XLA makes inside the op that reads it stays there)
        ready = max(0 if a in arguments else graph.born[a] for a in step.inputs)
        forward = all(a in arguments or graph.born[a] < start for a in step.inputs)
        if (forward or step.output in results) and ready < graph.born[step.output]:
            at[k] = ready
        for j, a in enumerate(step.inputs):
            if (k, j) in slices and a not in arguments and graph.born[a] < start:
                early.add((k, j))
    return Schedule(at, frozenset(early))


def last_reads(graph: Graph, plan: Schedule) -> list[int]:
    """Each array's last read under ``plan``: where its last reader is a step that XLA runs
    earlier (or that reads an early copy of it), the latest of its steps' reads as they run,
    else :attr:`Graph.last`. (An elementwise op reading it between is not seen: the graph
    keeps no such reads.)"""
    last = list(graph.last)
    if not plan.at and not plan.early:
        return last
    reads: dict[int, list[tuple[int, int]]] = {}  # array → (read as scheduled, in order)
    for k, step in enumerate(graph.steps):
        for j, a in enumerate(step.inputs):
            when = graph.born[a] if (k, j) in plan.early else plan.point(graph, k)
            reads.setdefault(a, []).append((when, graph.born[step.output]))
    for a, seen in reads.items():
        if graph.last[a] == max(order for _, order in seen):
            last[a] = max(graph.born[a], *(when for when, _ in seen))
    return last
