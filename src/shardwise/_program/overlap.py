"""A plan's step time where collectives run beside compute, as XLA schedules them on GPUs and
TPUs: its collectives are asynchronous there, and its latency-hiding scheduler (with the
collective pipeliner inside a scan) starts each one as early as its operand is ready and waits
for it only where a result is read.

The model replays the plan's steps in program order on two streams, compute and links:

- inside a scan, a collective that moves an operand the iteration can make before it begins
  (a layer's slice of a stacked weight, a constant, elementwise ops of those) is
  *prefetched*: it fills the links' idle time anywhere in the iteration, as XLA gathers the
  next layer's weights during this one;
- inside a scan, a collective whose result the next iteration does not need (a weight's
  gradient, stacked after the scan) is *deferred*: it fills the links' idle time the same
  way, spilling into the next iteration as XLA's pipeliner lets it;
- every other collective starts once its operand is made and the links are free, and the step
  that reads its result waits for it: outside scans, each step that reads it; inside a scan,
  each step on the path to the next iteration (one off it, a weight's gradient, is taken to
  be scheduled around the wait, as XLA's scheduler moves it).

A scope (the program outside scans, or one iteration of an outermost scan, its nested scans
inside it) then takes the longer of its compute with those waits and its links' time, and the
program takes its scopes' times one after the other. The elementwise ops' time is added after,
as if nothing overlapped it. A plan's :attr:`~shardwise._program.solution.ProgramPrediction.
seconds` is the serial sum, which the search minimises; on a CPU, whose collectives XLA runs
synchronously, the two are equal.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shardwise._program.explain import Tally, runs
from shardwise._program.graph import Graph
from shardwise._program.nodes import Loop


@dataclass(slots=True)
class _Streams:
    """One scope's replay: the compute clock, the links' clock, and what the links did."""

    loop: Loop | None
    moving: frozenset[int] = frozenset()
    """The classes of arrays made in the iteration (a scan's carries, its steps' results)."""
    critical: frozenset[int] = frozenset()
    """The classes of arrays the next iteration needs (a scan's carries, and what they are
    made from): only steps that make them wait for a collective, and only collectives that
    make them are not deferred."""
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
    owner = _owners(graph)
    ends = [*tally.starts[1:], len(tally.found)]
    total, scope = 0.0, None
    for k in range(len(graph.steps)):
        if scope is None or owner[k] is not scope.loop:
            total += _close(scope)
            scope = _Streams(owner[k], *_classes(graph, owner[k]))
        _replay(graph, tally, k, range(tally.starts[k], ends[k]), scope)
    total += _close(scope) + elementwise
    return min(total, sum(tally.seconds) + elementwise)


def _owners(graph: Graph) -> list[Loop | None]:
    """Each step's outermost scan (``None``: outside scans). A scan is recorded after the
    scans nested in it, so the later of two with the same steps is the outer one."""
    owner: list[Loop | None] = [None] * len(graph.steps)
    taken: list[tuple[int, int]] = []
    for loop in reversed(graph.loops):
        first, stop = loop.steps
        if any(a <= first and stop <= b for a, b in taken):
            continue
        taken.append(loop.steps)
        owner[first:stop] = [loop] * (stop - first)
    return owner


def _classes(graph: Graph, loop: Loop | None) -> tuple[frozenset[int], frozenset[int]]:
    """A scan's moving and critical classes (:class:`_Streams`)."""
    if loop is None:
        return frozenset(), frozenset()
    cls = graph.classes
    carried = {cls[a] for a in loop.carried}
    inside = graph.steps[loop.steps[0] : loop.steps[1]]
    made = set(carried)
    for step in inside:  # a slice is made in the iteration where its stack is
        if step.role != "scan slice" or cls[step.inputs[0]] in made:
            made.add(cls[step.output])
    critical, grown = set(carried), True
    while grown:
        before = len(critical)
        for step in reversed(inside):
            if cls[step.output] in critical:
                critical |= {cls[a] for a in step.inputs}
        grown = len(critical) > before
    return frozenset(made), frozenset(critical)


def _close(scope: _Streams | None) -> float:
    if scope is None:
        return 0.0
    return scope.seconds() * (scope.loop.length if scope.loop else 1)


def _replay(graph: Graph, tally: Tally, k: int, found: range, scope: _Streams) -> None:
    """Step ``k`` on ``scope``'s streams, its times per run of the scope. Inside a scan, only
    a step on the path to the next iteration waits for a result on its way; one off it (a
    weight's gradient) is taken to be scheduled around the wait, as XLA's scheduler moves
    it."""
    step = graph.steps[k]
    cls, loop = graph.classes, scope.loop
    per = loop.length if loop else 1
    start = scope.compute
    waits = loop is None or cls[step.output] in scope.critical
    for a in step.inputs if waits else ():  # a result on its way, or an array made from it
        for point, arrives in scope.ready.get(cls[a], ()):
            if point <= graph.born[a]:
                start = max(start, arrives)
    own = tally.seconds[k]
    after: list[float] = []
    sliced = step.role == "scan slice" and loop is not None
    for i in found:
        c, _, _, side = tally.found[i]
        own -= c.seconds * runs(step, side)
        seconds = c.seconds * runs(step, side) / per
        if sliced and cls[step.inputs[0]] not in scope.moving:
            scope.free += seconds  # the stack is there before the iteration: prefetched
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
    read_here = graph.last[out] > graph.born[out] and (
        loop is None or (graph.last[out] <= loop.end and cls[out] in scope.critical)
    )
    for seconds in after:
        if not read_here:
            scope.free += seconds  # deferred
            continue
        begin = max(scope.links, scope.compute)
        scope.links, scope.busy = begin + seconds, scope.busy + seconds
        scope.ready.setdefault(cls[out], []).append((graph.born[out], scope.links))


def _prefetched(graph: Graph, scope: _Streams, a: int) -> bool:
    """Whether a scan's body has operand ``a`` before its iteration begins (a constant or a
    slice of a stacked array, not a carry; or made by elementwise ops of those alone), so
    that its moves can run during the iteration before (outside scans nothing runs before:
    such moves start first and are waited for)."""
    loop = scope.loop
    if loop is None:
        return False
    before = graph.born[a] <= loop.start and a not in loop.carried
    return before or graph.classes[a] not in scope.moving
