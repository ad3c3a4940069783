"""A plan's step time where collectives run beside compute, as XLA schedules them on GPUs and
TPUs: its collectives are asynchronous there, and its latency-hiding scheduler (with the
collective pipeliner inside a scan) starts each one as early as its operand is ready and waits
for it only where a result is read.

The model replays the plan's steps in program order on two streams, compute and links:

- inside a scan, a collective that moves an operand the iteration can make before it begins
  (a layer's slice of a stacked weight, a constant, elementwise ops of those) is
  *prefetched*: it fills the links' idle time anywhere in the iteration, as XLA gathers the
  next layer's weights during this one;
- inside a scan, a collective whose result nothing in the iteration reads (a weight's
  gradient, stacked after the scan), or only what the next iteration does not need, is
  *deferred* the same way, or waited for by nothing;
- every other collective starts once its operand is made and the links are free, and the step
  that reads its result waits for it (outside scans, each step that reads it).

A scope (the program outside scans, or one iteration of an outermost scan, its nested scans
inside it) then takes the longer of its compute with those waits and its links' time, and the
program takes its scopes' times one after the other. The elementwise ops' time is added after,
as if nothing overlapped it. A plan's :attr:`~shardwise._program.solution.ProgramPrediction.
seconds` is the serial sum, which the search minimises; on a CPU, whose collectives XLA runs
synchronously, the two are equal.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from shardwise._program.explain import Tally
from shardwise._program.graph import Graph
from shardwise._program.nodes import Loop


@dataclass(slots=True)
class _Streams:
    """One scope's replay: the compute clock, the links' clock, and what the links did."""

    start: int
    loop: Loop | None
    moving: frozenset[int] = frozenset()
    """The classes of arrays made in the iteration (a scan's carries, its steps' results)."""
    critical: frozenset[int] = frozenset()
    """The classes of arrays the next iteration needs (a scan's carries, and what they are
    made from): only steps that make them wait for a collective."""
    compute: float = 0.0
    links: float = 0.0
    busy: float = 0.0
    """Time the links spent on collectives something waited for."""
    free: float = 0.0
    """Prefetched and deferred collectives' time."""
    made: dict[int, float] = field(default_factory=dict)
    """By class, when its array last made by a step was made."""
    ready: dict[int, list[tuple[int, float]]] = field(default_factory=dict)
    """By class, each waited-for result's program point and the time it arrives."""

    def seconds(self) -> float:
        horizon = max(self.compute, self.links)
        return horizon + max(0.0, self.free - (horizon - self.busy))


def overlapped_seconds(graph: Graph, tally: Tally, elementwise: float) -> float:
    """The step time of the plan ``tally`` costs when collectives overlap compute (see the
    module's docstring), never more than its serial time (the sum of ``tally.seconds`` and
    ``elementwise``)."""
    outermost = _outermost(graph.loops)
    ends = [*tally.starts[1:], len(tally.found)]
    total, scope, loop = 0.0, None, None
    for k, step in enumerate(graph.steps):
        here = _loop_of(graph, k, outermost)
        if scope is None or here is not loop:
            total += _close(scope, loop)
            loop = here
            scope = _Streams(loop.start if loop else graph.born[step.output] - 1, loop,
                             *_classes(graph, loop, outermost))  # fmt: skip
        per = loop.length if loop else 1
        _replay(graph, tally, k, range(tally.starts[k], ends[k]), scope, per)
    total += _close(scope, loop) + elementwise
    return min(total, sum(tally.seconds) + elementwise)


def _outermost(loops: Sequence[Loop]) -> list[Loop]:
    return [x for x in loops if not any(o.start <= x.start and x.end <= o.end and o is not x
                                        for o in loops)]  # fmt: skip


def _classes(
    graph: Graph, loop: Loop | None, outermost: Sequence[Loop]
) -> tuple[frozenset[int], frozenset[int]]:
    """A scan's moving and critical classes (:class:`_Streams`)."""
    if loop is None:
        return frozenset(), frozenset()
    cls = graph.classes
    carried = {cls[a] for a in loop.carried}
    inside = [s for k, s in enumerate(graph.steps) if _loop_of(graph, k, outermost) is loop]
    made = carried | {cls[s.output] for s in inside if s.role != "scan slice"}
    critical = set(carried)
    for step in reversed(inside):
        if cls[step.output] in critical:
            critical |= {cls[a] for a in step.inputs}
    return frozenset(made), frozenset(critical)


def _loop_of(graph: Graph, k: int, outermost: Sequence[Loop]) -> Loop | None:
    """The outermost scan step ``k`` runs in: its slicing runs in it (a slice's array is
    made where the scan begins), its stacking after it (where it ends)."""
    step = graph.steps[k]
    point = graph.born[step.output]
    for x in outermost:
        if x.start < point < x.end or (point == x.start and step.role == "scan slice"):
            return x
        if point == x.end and step.role != "scan stack":
            return x
    return None


def _close(scope: _Streams | None, loop: Loop | None) -> float:
    if scope is None:
        return 0.0
    return scope.seconds() * (loop.length if loop else 1)


def _replay(graph: Graph, tally: Tally, k: int, found: range, scope: _Streams, per: int) -> None:
    """Step ``k`` on ``scope``'s streams, its times per run of the scope (``per`` runs)."""
    step = graph.steps[k]
    cls = graph.classes
    start = scope.compute
    waits = scope.loop is None or cls[step.output] in scope.critical
    for a in step.inputs if waits else ():  # a result on its way, or an array made from it
        for point, arrives in scope.ready.get(cls[a], ()):
            if point <= graph.born[a]:
                start = max(start, arrives)
    own = tally.seconds[k]
    after: list[float] = []
    for i in found:
        c, side = tally.found[i][0], tally.sides[i]
        own -= c.seconds * step.repeat
        seconds = c.seconds * step.repeat / per
        if step.role == "scan slice" and scope.loop is not None:
            scope.free += seconds  # the stack is there before the scan: prefetched
        elif side < 0:
            after.append(seconds)
        elif _prefetched(graph, scope, side):
            scope.free += seconds
        else:
            begin = max(scope.links, scope.made.get(cls[side], 0.0))
            scope.links, scope.busy = begin + seconds, scope.busy + seconds
            start = max(start, scope.links)
    scope.compute = start + max(own, 0.0) / per
    out = step.output
    scope.made[cls[out]] = scope.compute
    loop = scope.loop
    read_here = graph.last[out] > graph.born[out] and (loop is None or graph.last[out] <= loop.end)
    for seconds in after:
        if not read_here:
            scope.free += seconds  # deferred
            continue
        begin = max(scope.links, scope.compute)
        scope.links, scope.busy = begin + seconds, scope.busy + seconds
        scope.ready.setdefault(cls[out], []).append((graph.born[out], scope.links))


def _prefetched(graph: Graph, scope: _Streams, a: int) -> bool:
    """Whether a scan's body can make operand ``a`` before its iteration begins (a constant, a
    slice of a stacked array, elementwise ops of those: not from a carry or a step of the
    iteration), so that its moves can run during the iteration before (outside scans nothing
    runs before: such moves start first and are waited for)."""
    return scope.loop is not None and graph.classes[a] not in scope.moving
