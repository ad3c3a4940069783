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
Where the plan lays a recomputed step out as the forward pass's twin, XLA runs it once: the
two merge, and the backward pass reads the forward pass's results (:func:`twins`).
Pure: it reads the traced jaxpr's structure, no devices.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Set
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple

from shardwise._caches import per_object
from shardwise._model.mesh import MeshSpec
from shardwise._program.buffers import readers
from shardwise._program.graph import Graph
from shardwise._program.moves import shard_bytes
from shardwise._program.rules import rule_of
from shardwise._program.sums import summed_axes
from shardwise._program.walk import Path

if TYPE_CHECKING:
    from shardwise._program.solution import Layouts

REMAT = frozenset({"remat2", "checkpoint"})
"""The names JAX's checkpoint primitive has gone by."""


class Schedule(NamedTuple):
    """Where XLA runs steps earlier than program order: ``at`` maps a step's index to the
    program point it runs at; ``early`` holds the (step index, operand position) pairs whose
    copy of a saved array is made as soon as the array is, and held until the step."""

    at: dict[int, int]
    early: frozenset[tuple[int, int]]
    merged: Mapping[int, int] = MappingProxyType({})
    """The recomputed steps that XLA merges with the forward pass's (:func:`twins`): by step
    index, the forward step's."""

    def point(self, graph: Graph, k: int) -> int:
        """The program point step ``k`` runs at."""
        return self.at.get(k, graph.born[graph.steps[k].output])


@per_object(maxsize=8)
def bodies(graph: Graph) -> list[Path]:
    """The paths in the jaxpr of the bodies of differentiated checkpoints (the backward pass's
    recomputation; a checkpoint that is not differentiated runs where it stands), found
    once per graph (every plan's memory and prediction asks)."""
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


def schedule(
    graph: Graph,
    copied: Callable[[], set[tuple[int, int]]],
    alike: Callable[[int, int], bool] = lambda k, f: False,
) -> Schedule:
    """Where XLA runs the steps of differentiated checkpoints' bodies (the module's account):
    a step that reads only arrays of the forward pass as soon as they exist; one whose result
    is the program's as soon as its operands do; and the copies ``copied()`` names (step
    index, operand position: those a step reads in a layout other than the array's own, no
    bigger per device) of forward arrays as soon as those are made. A recomputed step that
    ``alike(k, f)`` says XLA merges with its twin ``f`` (:func:`twins`), reading what such
    steps made or what the forward pass did, does not run. A program with no differentiated
    checkpoint runs in program order."""
    found = bodies(graph)
    if not found:
        return Schedule({}, frozenset())
    merged = merged_steps(graph, alike)
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
        if k in merged:
            continue
        ready = max(0 if a in arguments else graph.born[a] for a in step.inputs)
        forward = all(a in arguments or graph.born[a] < start for a in step.inputs)
        if (forward or step.output in results) and ready < graph.born[step.output]:
            at[k] = ready
        for j, a in enumerate(step.inputs):
            if (k, j) in slices and a not in arguments and graph.born[a] < start:
                early.add((k, j))
    return Schedule(at, frozenset(early), merged)


@per_object(maxsize=8)
def twins(graph: Graph) -> dict[int, int]:
    """Each step of a differentiated checkpoint's body that computes what a step of the
    forward pass computed (the same op of the same arrays, or of what such steps made: the
    layer's dot recomputed from the saved inputs, and the transpose of its result), by step
    index in program order, with that step's. Where the plan lays both out alike, XLA merges
    them into one, and the backward pass reads what the forward pass made (seen in the
    compiled training step of an Equinox MLP with checkpointed layers: 12 dots of the
    program's 14, the layers' ``tanh`` results read by the backward fusions, no dot run
    again; held from the forward pass to the backward one, the recomputed results had put
    plans at 0.79x XLA's memory). A step the plan lays out otherwise (a dot in slices) runs
    again, as :func:`schedule` places it."""
    found = bodies(graph)
    seen: dict[tuple[Any, ...], int] = {}
    same: dict[int, int] = {}  # each recomputed array, the forward pass's
    out: dict[int, int] = {}
    for k, step in enumerate(graph.steps if found else ()):
        if step.implicit or step.kind == "opaque":
            continue
        inputs = tuple(same.get(a, a) for a in step.inputs)
        sign = (step.kind, step.prim, inputs, step.op, step.dim_map, step.local, step.reduced,
                step.whole, step.role, step.repeat, step.branch, step.length)  # fmt: skip
        if not any(step.key[: len(b)] == b for b in found):
            seen.setdefault(sign, k)
        elif sign in seen:
            out[k] = seen[sign]
            same[step.output] = graph.steps[seen[sign]].output
    return out


def merged_steps(graph: Graph, alike: Callable[[int, int], bool]) -> dict[int, int]:
    """The recomputed steps that XLA merges with their twins (:func:`twins`), by step index,
    with the twin's: those ``alike(k, f)`` says are laid out as their twin and that read only
    what merged steps made or what the forward pass did (:attr:`Schedule.merged`)."""
    merged: dict[int, int] = {}
    found = twins(graph)
    recomputed, kept = {graph.steps[k].output for k in found}, set()
    for k, f in found.items():  # (in program order: a step after those it reads)
        step = graph.steps[k]
        if alike(k, f) and all(a not in recomputed or a in kept for a in step.inputs):
            merged[k] = f
            kept.add(step.output)
    return merged


def last_reads(graph: Graph, plan: Schedule) -> list[int]:
    """Each array's last read under ``plan``: where its last reader is a step that XLA runs
    earlier (or that reads an early copy of it), the latest of its steps' reads as they run,
    else :attr:`Graph.last`; a step XLA merges with its twin (:attr:`Schedule.merged`) reads
    nothing. (An elementwise op reading it between is not seen: the graph keeps no such
    reads.)"""
    last = list(graph.last)
    if not plan.at and not plan.early and not plan.merged:
        return last
    reads: dict[int, list[tuple[int, int]]] = {}  # array → (read as scheduled, in order)
    for k, step in enumerate(graph.steps):
        for j, a in enumerate(step.inputs):
            when = graph.born[a] if (k, j) in plan.early else plan.point(graph, k)
            # (a merged step does not run: it reads nothing)
            reads.setdefault(a, []).append((-1 if k in plan.merged else when,
                                            graph.born[step.output]))  # fmt: skip
    for a, seen in reads.items():
        if graph.last[a] == max(order for _, order in seen):
            last[a] = max(graph.born[a], *(when for when, _ in seen))
    return last


def merged_into(graph: Graph, plan: Schedule, reads: list[int], held: Set[int]) -> set[int]:
    """The results of the steps XLA merges with their twins (:attr:`Schedule.merged`), which
    take no buffer of their own. What reads such a result other than another merged step
    reads the twin's: the twin, or where elementwise ops made a buffer from it alone in the
    forward pass (a layer's ``tanh``, ``held``), the last such buffer, is held until then
    (``reads``, each array's last read, changes): the backward pass's ``tanh`` derivative
    reads the forward pass's ``tanh``. (Where the chain mixes in another array, as a residual
    connection adds the layer's input, the twin itself is held: the derivative needs it.)"""
    if not plan.merged:
        return set()
    out, read_by = set(), readers(graph)
    made: dict[int, list[int]] = {}  # each array, the elementwise results made from it alone
    for v, source in graph.made_from.items():
        made.setdefault(source, []).append(v)
    for k, f in plan.merged.items():
        v, twin = graph.steps[k].output, graph.steps[f].output
        out.add(v)
        steps = read_by.get(v, [])
        merged = max((graph.born[graph.steps[j].output] for j in steps if j in plan.merged),
                     default=-1)  # fmt: skip
        if all(j in plan.merged for j in steps) and reads[v] <= merged:
            continue
        target, chain = twin, list(made.get(twin, ()))
        while chain:
            a = chain.pop()
            if a in held and graph.born[a] > graph.born[target]:
                target = a
            chain += made.get(a, ())
        reads[target] = max(reads[target], reads[v])
    return out


def alike(graph: Graph, lay: Layouts, k: int, f: int) -> bool:
    """Whether XLA merges steps ``k`` and ``f`` under ``lay``: it lays both out alike, their
    operands read and their results made and kept in the same layouts, and neither is a dot
    that sums partial sums after it, nor a reduction over split dimensions (XLA merges such
    a dot's local product, holds its partial sums from the forward pass to the backward one
    and sums them again there: seen in the
    compiled training step of the checkpointed Equinox MLP's Megatron plan, an ``all-reduce``
    of the forward ``ynn_fusion``'s result in the backward pass; taken as merged, the plan had
    been predicted at 0.64x XLA's memory)."""
    a, b = graph.steps[k], graph.steps[f]
    found, twin = lay.steps.get(a.key), lay.steps.get(b.key)
    if found != twin or lay.specs[a.output].canonical() != lay.specs[b.output].canonical():
        return False
    if found is None:
        return True
    if a.kind == "dot" and a.op is not None:
        return not summed_axes(a.op, found[0])
    entries = found[0][0].padded(len(graph.values[a.inputs[0]].shape)) if a.inputs else ()
    return not any(entries[d] for d in a.reduced)  # (a reduction over split dimensions: no)


def scheduled(graph: Graph, lay: Layouts, mesh: MeshSpec) -> Schedule:
    """Where XLA runs the steps of the program's differentiated checkpoints under ``lay``
    (:func:`schedule`)."""
    return schedule(graph, lambda: copied(graph, lay, mesh), lambda k, f: alike(graph, lay, k, f))


def copied(graph: Graph, lay: Layouts, mesh: MeshSpec) -> set[tuple[int, int]]:
    """The (step index, operand position) pairs whose operand the step reads in a layout
    other than the array's own, no bigger per device (a slice of it, made on each device
    with no collective)."""
    out = set()
    for n, step in enumerate(graph.steps):
        if step.key not in lay.steps:
            continue
        for j, (a, used) in enumerate(zip(step.inputs, lay.steps[step.key][0], strict=False)):
            held_as = lay.specs[a]
            if used.canonical() != held_as.canonical() and shard_bytes(
                graph.values[a], used, mesh
            ) <= shard_bytes(graph.values[a], held_as, mesh):
                out.add((n, j))
    return out
