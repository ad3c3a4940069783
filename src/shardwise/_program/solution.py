"""What one solution of a program's planning problem means: each array's layout, each dot's
strategy, and the prediction (time, collectives with the op and source line behind each,
FLOPs, per-device memory at its peak).

Memory is counted in program order: an array is held from the op that makes it to its last
reader (arguments for the whole program); an elementwise result that only elementwise ops read
is fused away, as XLA does. The peak is the largest sum of held blocks at one point.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from shardwise._model.cost import PredictedCollective
from shardwise._model.mesh import MeshSpec
from shardwise._model.profile import Profile
from shardwise._model.reshard import reshard_moves
from shardwise._model.spec import Spec
from shardwise._model.strategy import Strategy
from shardwise._program.explain import Tally
from shardwise._program.graph import Graph
from shardwise._program.moves import relayout_bytes, shard_bytes
from shardwise._program.nodes import Step
from shardwise._program.problem import Problem
from shardwise._program.search import Constraint
from shardwise._program.steps import StepCosts, map_specs

MEMORY_POINTS = 16
"""How many program points, the fullest first, a memory budget is checked at."""


@dataclass(frozen=True, slots=True)
class ProgramPrediction:
    """A plan's predicted cost per device."""

    seconds: float
    memory_bytes: int
    flops: float
    collectives: tuple[PredictedCollective, ...]
    step_seconds: tuple[float, ...] = ()
    """Each step's time (all its repeats): its own work and the moves it makes."""
    elementwise_seconds: float = 0.0
    """The elementwise ops' time: :attr:`seconds` is this plus every step's."""

    def to_json(self) -> dict[str, object]:
        return {
            "seconds": self.seconds,
            "memory_bytes": self.memory_bytes,
            "flops": self.flops,
            "collectives": [c.to_json() for c in self.collectives],
        }


@dataclass(frozen=True, slots=True)
class Layouts:
    """A solution read back: each array's spec, and by each step's place in the jaxpr the
    layouts its operands are read in and its result is made in (a dot's strategy; a map's
    operand with the dimensions it needs whole, and its result; whole for an opaque op), and
    for a scan's slicing and stacking, by (the scan's place, the stacked array), the layout
    the stack is read in and the one each slice is made in (slicing), or the one the stack is
    made in (stacking)."""

    specs: dict[int, Spec]
    steps: dict[tuple[int, ...], tuple[tuple[Spec, ...], Spec]]
    scans: dict[tuple[tuple[int, ...], int], tuple[Spec, Spec]] = field(default_factory=dict)


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
    scans: dict[tuple[tuple[int, ...], int], tuple[Spec, Spec]] = {}
    for step in graph.steps:
        if step.role in ("scan slice", "scan stack"):
            whole, mapped, _ = map_specs(graph, step, specs[step.inputs[0]], mesh)
            stack = step.inputs[0] if step.role == "scan slice" else step.output
            scans[(step.key, stack)] = (whole, mapped)
        elif step.kind == "map" and not step.implicit:
            whole, mapped, _ = map_specs(graph, step, specs[step.inputs[0]], mesh)
            steps[step.key] = ((whole,), mapped)
        elif step.kind == "opaque":
            steps[step.key] = ((Spec(),) * len(step.inputs), Spec())
    return Layouts(specs, steps, scans)


def predicted(
    graph: Graph,
    problem: Problem,
    choice: Sequence[int],
    mesh: MeshSpec,
    profile: Profile,
    shared: bool = True,
) -> tuple[Layouts, ProgramPrediction]:
    """The layouts of a solution and their predicted cost: each step's time and collectives,
    each collective attributed to the step that causes it, with the reason
    (:class:`~shardwise._program.explain.Tally`), and the elementwise ops' time. A move that
    XLA makes once for two readers is counted once (``shared=False`` counts it for each, as the
    solver's matrices do)."""
    lay = read(graph, problem, choice, mesh)
    var_of = {label: k for k, label in enumerate(problem.labels)}
    costs = StepCosts(graph, mesh, profile)
    tally = Tally(graph, lay, costs, shared)
    for k, step in enumerate(graph.steps):
        strategy = None
        if step.kind == "dot":
            label = var_of[("dot", k)]
            strategy = problem.choices[label][choice[label]]
            assert isinstance(strategy, Strategy)
        tally.step(k, strategy)
    elementwise = sum(
        costs.elementwise(root, lay.specs[root]) for root in sorted(set(graph.classes))
    )
    memory = peak_bytes(graph, lay, mesh, profile.platform)
    seconds = sum(tally.seconds) + elementwise
    return lay, ProgramPrediction(
        seconds, memory, tally.flops, tally.collectives(), tuple(tally.seconds), elementwise
    )


def held(graph: Graph) -> list[int]:
    """The arrays that take memory: arguments, results, and whatever a non-elementwise op
    makes or reads."""
    made = {s.output for s in graph.steps}
    return sorted(set(graph.inputs) | graph.fed | made)


class Lives(NamedTuple):
    """The arrays that take memory and when: array ``k`` is held from program point
    ``first[k]`` to ``last[k]`` (none, where ``first > last``: it lives in another's buffer).
    Intervals, not a point × array table: a program of 10,000 arguments has 30,000 of each,
    and the table took 900 MB (7 GB as the integers summed over it)."""

    arrays: list[int]
    first: np.ndarray
    last: np.ndarray
    points: int

    def alive(self, at: int) -> np.ndarray:
        """Whether each array is held at point ``at``."""
        return np.asarray((self.first <= at) & (at <= self.last))

    def totals(self, sizes: np.ndarray) -> np.ndarray:
        """The sum of ``sizes`` (one per array) held at each point."""
        change = np.zeros(self.points + 1, dtype=sizes.dtype)
        held = self.first <= self.last
        np.add.at(change, self.first[held], sizes[held])
        np.add.at(change, self.last[held] + 1, -sizes[held])
        return np.asarray(np.cumsum(change[:-1]))


def _live(graph: Graph) -> Lives:
    arrays = held(graph)
    results = {v for v in graph.outputs if v is not None}
    within = _in_place(graph, results)
    first = np.ones(len(arrays), dtype=np.int64)
    last = np.zeros(len(arrays), dtype=np.int64)
    for k, v in enumerate(arrays):
        if v not in within:
            first[k], last[k] = 0 if v in results else graph.born[v], graph.last[v]
    return Lives(arrays, first, last, graph.clock + 1)


def _in_place(graph: Graph, results: set[int]) -> set[int]:
    """The arrays that live in a result's buffer: XLA gives each result a buffer of its own,
    held from the program's start (``memory_analysis`` counts arguments, results and the
    temporaries' peak; a data-parallel training step's new weights had been counted from the
    update on, 18–21% low), and an array that the elementwise ops making a result read last
    (an SGD step's gradient) is made in that buffer, not beside it (``w - lr * g`` runs in
    place), and so is the dot's result that such an array transposes (XLA has the dot write
    the transposed layout)."""
    out = set()
    arguments = set(graph.inputs)
    by_class = {graph.find(r): r for r in results}
    for v in graph.fed | {s.output for s in graph.steps}:
        r = by_class.get(graph.find(v))
        if r is None or v == r or v in arguments or v in results:
            continue
        same = graph.values[v].shape == graph.values[r].shape
        if (
            same
            and graph.values[v].dtype == graph.values[r].dtype
            and graph.last[v] <= graph.born[r]
        ):
            out.add(v)
    for step in reversed(graph.steps):  # a transposed gradient is its dot's result, read so
        a = step.inputs[0]
        if (
            step.prim == "transpose"
            and step.output in out
            and graph.last[a] <= graph.born[step.output]
        ):
            out.add(a)
    return out


class Held(NamedTuple):
    """What :func:`held_curve` counts: the arrays that take memory, when each is alive
    (:class:`Lives`), each one's block per device, and the bytes at each point."""

    arrays: list[int]
    lives: Lives
    sizes: np.ndarray
    points: np.ndarray


def held_curve(graph: Graph, lay: Layouts, mesh: MeshSpec, platform: str = "") -> Held:
    """Per-device bytes at each program point: the arrays held there in their layouts, plus,
    at each step, the copies it makes of its operands in the layouts it reads them in, and of
    its result in the layout it makes it in, where those differ from the held ones (a gather's
    result, or even a local slice, is a new buffer beside the array it came from; a replicated
    stacked weight's local slices are all made before its scan, :func:`_hoist`; a scan's
    carry that starts from an argument is held in a copy, :func:`_carry_copies`). On CPU, a
    gather along any dimension but the first also leaves a copy in the usual layout
    (:func:`~shardwise._program.moves.relayout_bytes`)."""
    lives = _live(graph)
    arrays = lives.arrays
    sizes = np.array(
        [shard_bytes(graph.values[v], lay.specs[v], mesh) for v in arrays], dtype=np.int64
    )
    points = lives.totals(sizes)
    cpu = platform == "cpu"
    arguments = set(graph.inputs)
    for step in graph.steps:
        at = graph.born[step.output]
        if step.role == "scan slice" and (step.key, step.inputs[0]) in lay.scans:
            _, mapped = lay.scans[(step.key, step.inputs[0])]
            slice_, spec = graph.values[step.output], lay.specs[step.output]
            if cpu:
                points[at] += relayout_bytes(slice_, mapped, spec, mesh)
            if step.inputs[0] in arguments:
                _hoist(graph, step, lay, mapped, mesh, points)
            continue
        if step.key not in lay.steps:
            continue
        ins, made = lay.steps[step.key]
        for a, used in zip(step.inputs, ins, strict=False):
            if used.canonical() != lay.specs[a].canonical():
                points[at] += shard_bytes(graph.values[a], used, mesh)
                if cpu:
                    points[at] += relayout_bytes(graph.values[a], lay.specs[a], used, mesh)
        if made.canonical() != lay.specs[step.output].canonical():
            points[at] += shard_bytes(graph.values[step.output], made, mesh)
    _carry_copies(graph, lay, mesh, points)
    return Held(arrays, lives, sizes, points)


def _carry_copies(graph: Graph, lay: Layouts, mesh: MeshSpec, points: np.ndarray) -> None:
    """A scan whose carry starts from an argument of the program runs its loop in a copy of
    it: XLA cannot write the caller's buffer, so it copies the argument into the loop's own
    before the ``while`` (seen in the compiled HLO: a ``copy`` of the ``f32[16,64,256]``
    input ahead of the loop), and that copy is held while the loop runs. Left out, a
    transformer's forward pass with its activations replicated was predicted at 0.76 of
    XLA's buffers."""
    arguments = set(graph.inputs)
    for init, body in graph.carries:
        loop = _loop(graph, body)
        if init in arguments and loop is not None:
            points[loop] += shard_bytes(graph.values[init], lay.specs[init], mesh)


def _loop(graph: Graph, body: tuple[int, ...]) -> slice | None:
    """The program points a scan's loop runs over: from the first step of its ``body`` (the
    path of the scan's body in the jaxpr) to the last; ``None`` where it has no steps."""
    within = [graph.born[s.output] for s in graph.steps if s.key[: len(body)] == body]
    return slice(min(within), max(within) + 1) if within else None


def _hoist(
    graph: Graph, step: Step, lay: Layouts, mapped: Spec, mesh: MeshSpec, points: np.ndarray
) -> None:
    """A replicated argument's stack, sliced locally for each layer: XLA hoists that slicing
    out of the loop (it does not change from one iteration to the next), so every layer's
    slice is made before the loop and all are held while it runs, where one is counted as the
    array (seen in the compiled HLO: an ``f32[2,256,512]`` dynamic-slice of a
    ``(2,256,1024)`` stack before the while loop). A replicated layer, which slices nothing
    but the layer, is read in place: nothing is hoisted (a data-parallel transformer's
    forward pass had been counted 30% over XLA's buffers)."""
    stack, slice_, spec = step.inputs[0], graph.values[step.output], lay.specs[step.output]
    moves = reshard_moves(mapped, spec, len(slice_.shape))
    sliced = set(spec.axes) - set(mapped.axes)
    if lay.specs[stack].axes or not sliced or any(m.kind != "slice" for m in moves):
        return
    loop = _loop(graph, step.key)
    assert loop is not None  # the slicing step itself is in the loop's body
    layers = graph.values[stack].shape[0]
    points[loop] += (layers - 1) * shard_bytes(slice_, spec, mesh)


def peak_bytes(graph: Graph, lay: Layouts, mesh: MeshSpec, platform: str = "") -> int:
    """Per-device bytes held at the fullest point of the program (:func:`held_curve`)."""
    points = held_curve(graph, lay, mesh, platform).points
    return int(points.max()) if len(points) else 0


def memory_constraints(
    graph: Graph, problem: Problem, budget: int, mesh: MeshSpec
) -> list[Constraint]:
    """``budget`` as linear constraints at the :data:`MEMORY_POINTS` fullest program points."""
    lives = _live(graph)
    arrays = lives.arrays
    if not arrays:
        return []
    var_of = {label[1]: k for k, label in enumerate(problem.labels) if label[0] == "class"}
    whole = np.array([graph.values[v].nbytes for v in arrays], dtype=np.int64)
    order = np.argsort(-lives.totals(whole), kind="stable")
    out, seen = [], set()
    for t in order:
        members = tuple(np.flatnonzero(lives.alive(int(t))))
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
