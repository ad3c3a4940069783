"""Per-device memory of a plan at each point of the program: which arrays are held and when,
the copies steps make of their operands and results, and the budget as constraints.

Memory is counted in program order: an array is held from the op that makes it to its last
reader (arguments for the whole program); an elementwise result that only elementwise ops read
is fused away, as XLA does; a result over a donated argument takes its buffer (:mod:`.donation`);
a temporary made before a result, in that result's buffer where it fits (:mod:`.bins`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from shardwise._caches import Bounded
from shardwise._model.mesh import MeshSpec
from shardwise._model.spec import Spec
from shardwise._program import loops
from shardwise._program.bins import placed, totals
from shardwise._program.buffers import (
    folded_transposes,
    gathered_transposes,
    in_conds,
    in_place,
    made_again,
    overwritten,
    padded_windows,
    pooled_operands,
    pooled_sums,
    sliced_only,
    unread_inputs,
)
from shardwise._program.constants import made_whole
from shardwise._program.copies import (
    UPDATES,
    Copies,
    copies_argument,
    made_copy,
    moved_broadcast,
)
from shardwise._program.donation import aliased, unaliased_bytes, updated_early
from shardwise._program.graph import Graph
from shardwise._program.integer import Constraint
from shardwise._program.moves import shard_bytes
from shardwise._program.nodes import Step, Value
from shardwise._program.problem import Problem
from shardwise._program.remat import Schedule, bodies, last_reads, merged_into, schedule, scheduled
from shardwise._program.sums import (
    Summed,
    collected_halves,
    combined,
    float32_sums,
    fused_dots,
    into_reduce,
    partial_buffers,
    to_outputs,
    together,
)
from shardwise._program.upcast import (
    argument_copies,
    converted_arguments,
    made_halves,
    moved_widening,
)

if TYPE_CHECKING:
    from shardwise._program.solution import Layouts

MEMORY_POINTS = 16
"""How many program points, the fullest first, a memory budget is checked at."""


def held(graph: Graph) -> list[int]:
    """The arrays that take memory: arguments the program reads, results, and whatever a
    non-elementwise op makes or reads, but a broadcast that only elementwise ops read
    (:func:`fused`)."""
    made = {s.output for s in graph.steps if not fused(graph, s)}
    results = {v for v in graph.outputs if v is not None}
    return sorted((set(graph.inputs) - unread_inputs(graph)) | graph.fed | made | results)


def fused(graph: Graph, step: Step) -> bool:
    """Whether XLA makes ``step``'s result inside the elementwise ops that read it, never as
    a buffer of its own: a broadcast (a bias broadcast to the batch, then added) that no
    other step reads and that is not a result. One that a collective moves from the layout
    it is made in to the one it is kept in is made, and moved, all the same, but only at its
    step: its copy in the layout it is made in, and the collective's pieces, are counted
    there where the plan lays it out so (:func:`~.copies.moved_broadcast`); XLA fuses the
    moved pieces into the ops that read them."""
    return (
        step.prim.startswith("broadcast_in_dim")
        and step.output not in graph.fed
        and step.output not in graph.outputs
    )


class Lives(NamedTuple):
    """The arrays that take memory and when: array ``k`` is held from program point
    ``first[k]`` to ``last[k]`` (none, where ``first > last``: it lives in another's buffer).
    Intervals, not a point × array table, which grows with the square of a program's
    arguments."""

    arrays: list[int]
    first: np.ndarray
    last: np.ndarray
    points: int
    written: dict[int, int]
    """Each result held in a buffer of its own, by array: the first point something is
    written in that buffer (the result, or an array made in it, :func:`in_place`)."""
    temporary: np.ndarray
    """Whether each array is a temporary: neither an argument nor such a result
    (:mod:`.bins` may place it in a result's buffer)."""

    def alive(self, at: int) -> np.ndarray:
        """Whether each array is held at point ``at``."""
        return np.asarray((self.first <= at) & (at <= self.last))

    def totals(self, sizes: np.ndarray) -> np.ndarray:
        """The sum of ``sizes`` (one per array) held at each point."""
        held = self.first <= self.last
        return totals(self.first[held], self.last[held], sizes[held], self.points)


def _live(graph: Graph, plan: Schedule | None = None, cpu: bool = False) -> Lives:
    """When each array is held: from its step (as :mod:`~shardwise._program.remat`'s
    ``plan`` runs it) to its last read (``cpu``: on CPU devices, :mod:`.upcast`; an
    argument's conversion from the program's start, :func:`.upcast.converted_arguments`)."""
    arrays = held(graph)
    results = {v for v in graph.outputs if v is not None}
    folded, taken = folded_transposes(graph, results), aliased(graph)  # (taken: in donated buffers)
    homes = in_place(graph, results - taken.keys(), cpu)
    within = set(homes) | padded_windows(graph, results) | set(folded) | set(taken)
    within |= in_conds(graph, cpu).keys() - results
    plan = plan or schedule(graph, set)
    born = list(graph.born)
    for k, at in plan.at.items():
        born[graph.steps[k].output] = at
    inputs = set(graph.inputs)
    for v in converted_arguments(graph) if cpu else ():  # (as the program starts, on CPU)
        born[v] = 0
    written = {r: born[r] for r in results - within - inputs}
    for v, r in homes.items():
        if r in written:
            written[r] = min(written[r], born[v])
    loops.loop_lives(graph, born)
    reads = last_reads(graph, plan)
    within |= merged_into(graph, plan, reads, set(arrays))
    made_again(graph, born, reads)
    updated_early(graph, taken, born, reads)  # (results over donated arguments)
    for v, a in sorted(folded.items(), reverse=True):  # (a later transpose of a transpose)
        reads[a] = max(reads[a], reads[v])
    first = np.ones(len(arrays), dtype=np.int64)
    last = np.zeros(len(arrays), dtype=np.int64)
    for k, v in enumerate(arrays):
        if v not in within:
            first[k], last[k] = 0 if v in results else born[v], reads[v]
    overwritten(graph, arrays, first, last, results | within)
    temporary = np.array([v not in inputs and v not in written for v in arrays], dtype=bool)
    return Lives(arrays, first, last, graph.clock + 1, written, temporary)


class _Fixed(NamedTuple):
    """What :func:`held_curve` needs of a graph whatever its layouts: :func:`_live` in program
    order (``None`` where a differentiated checkpoint makes the schedule depend on the
    layouts), the steps that may make copies (all but the fused broadcasts), the classes of
    :func:`~shardwise._program.sums.to_outputs`, the held arrays' kinds (each distinct
    (class root, shape, dtype), and each array's), which of them are 16-bit floats the program
    makes (:mod:`.upcast`), the arrays that some step reads, and the dots that the CPU backend
    may fuse into the reduction that reads them (:func:`~shardwise._program.sums.into_reduce`)."""

    lives: Lives | None
    visit: list[int]
    outputs_of: set[int]
    kinds: list[tuple[int, Value]]
    kind_of: np.ndarray
    halves: np.ndarray
    read: frozenset[int]
    into_reduce: dict[int, tuple[int, tuple[int, ...]]]
    folded: dict[int, int]
    pooled: tuple[tuple[int, int, int], ...]
    broadcasts: tuple[int, ...] = ()
    """The fused broadcasts (:func:`fused`), by step index."""
    starting: frozenset[int] = frozenset()
    """On CPU, the arrays made as the program starts but the arguments (:mod:`.upcast`)."""


_FIXED: Bounded[tuple[int, bool], tuple[Graph, _Fixed]] = Bounded(8)
"""Per graph (by id, kept alive with it so that the id is not reused) and whether its devices
are CPUs, :class:`_Fixed`: the same for every plan of the program."""


def _fixed(graph: Graph, cpu: bool = False) -> _Fixed:
    """:class:`_Fixed` of ``graph``, computed once per graph (and ``cpu``, where the program
    makes 16-bit floats or converts its arguments: there only the lives differ,
    :mod:`.upcast`)."""
    hit = _FIXED.get((id(graph), cpu))
    if hit is not None and hit[0] is graph:
        return hit[1]
    if cpu:
        base = _fixed(graph)
        if not base.halves.any() and not converted_arguments(graph):
            return base
        lives = None if bodies(graph) else _live(graph, Schedule({}, frozenset()), cpu)
        found = base._replace(lives=lives, starting=converted_arguments(graph))
        _FIXED.put((id(graph), cpu), (graph, found))
        return found
    lives = None if bodies(graph) else _live(graph, Schedule({}, frozenset()))
    visit = [n for n, s in enumerate(graph.steps) if not fused(graph, s)]
    kinds: dict[tuple[int, tuple[int, ...], str], tuple[int, int, Value]] = {}
    kind_of = []
    arrays = held(graph)
    for v in arrays:
        value = graph.values[v]
        key = (graph.find(v), value.shape, value.dtype)
        kind_of.append(kinds.setdefault(key, (len(kinds), key[0], value))[0])
    each = [(root, value) for _, root, value in kinds.values()]
    halves = np.array(made_halves(graph, arrays), dtype=bool)
    read = frozenset(a for step in graph.steps for a in step.inputs)
    kind_at = np.array(kind_of, np.intp)
    results = {v for v in graph.outputs if v is not None}
    broadcasts = tuple(n for n, s in enumerate(graph.steps) if fused(graph, s))
    found = _Fixed(lives, visit, to_outputs(graph), each, kind_at, halves, read, into_reduce(graph),
                   folded_transposes(graph, results), pooled_sums(graph), broadcasts)  # fmt: skip
    _FIXED.put((id(graph), cpu), (graph, found))
    return found


def _in_order(graph: Graph, cpu: bool = False) -> Lives | None:
    """When each array is held where the program runs in program order (no differentiated
    checkpoint: :func:`~shardwise._program.remat.schedule`), computed once per graph."""
    return _fixed(graph, cpu).lives


def _sizes(graph: Graph, lay: Layouts, mesh: MeshSpec, arrays: list[int]) -> np.ndarray:
    """Each array's block per device: once per kind (:class:`_Fixed`) where each array is laid
    out as its class (as :func:`~shardwise._program.solution.read` lays them out)."""
    fixed, specs = _fixed(graph), lay.specs
    if all(specs[v] is specs[graph.classes[v]] for v in arrays):
        each = [shard_bytes(value, specs[root], mesh) for root, value in fixed.kinds]
        return np.asarray(np.array(each, dtype=np.int64)[fixed.kind_of])
    return np.array([shard_bytes(graph.values[v], specs[v], mesh) for v in arrays], np.int64)


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
    result, or even a local slice, is a new buffer beside the array it came from; an argument's
    is made at the program's start and held until its last reader; a scan's loop, and the
    loop that draws random bits on CPU, hold buffers of their own, :mod:`.loops`). On CPU, a
    gather along any dimension but the first is made in a transposed layout and copied back
    (:func:`~shardwise._program.moves.relayout_bytes`); a step whose result is moved after it
    is made frees its operands' copies first (:mod:`.copies`). A checkpointed function's backward
    steps and copies are counted where XLA runs them (:mod:`~shardwise._program.remat`). A
    temporary (an array, a copy, partial sums) that fits in a result's buffer before the
    result is made is kept there, as XLA's buffer assignment keeps it (:mod:`.bins`)."""
    cpu = platform == "cpu"
    lives, plan = _in_order(graph, cpu), Schedule({}, frozenset())
    if lives is None:  # (the schedule of a checkpoint's backward pass depends on the layouts)
        plan = scheduled(graph, lay, mesh)
        lives = _live(graph, plan, cpu)
    arrays, fixed, specs, born = lives.arrays, _fixed(graph, cpu), lay.specs, graph.born
    sizes = sliced_only(graph, lay, mesh, arrays, _sizes(graph, lay, mesh, arrays), cpu)
    if cpu and fixed.halves.any():  # (:mod:`.upcast`: float16, bfloat16 too, made as float32)
        sizes = np.where(fixed.halves, 2 * sizes, sizes)
    sizes, collected = collected_halves(graph, lay, mesh, lives, sizes, cpu)  # (float32 sums)
    reduced = fixed.into_reduce if cpu else {}  # (the dots fused into a reduction)
    sizes, fused, every = fused_dots(graph, lay, mesh, reduced, arrays, sizes)
    temporary, gone = lives.temporary, set[int]()
    points = lives.totals(np.where(temporary, 0, sizes)) + unaliased_bytes(graph, lay, mesh)
    copies = Copies(
        argument_copies(graph, lay, mesh, fused) if cpu else {}, cpu, every, fixed.starting
    )
    temps, early = copies.temps, copies.early
    later, summed = list[tuple[int, int, int]](), list[Summed]()  # (partial sums, :mod:`.sums`)
    for n in _visited(graph, lay, mesh, fixed):
        if n in plan.merged:  # (:func:`~shardwise._program.remat.twins`)
            continue
        step = graph.steps[n]
        at = plan.at.get(n, born[step.output])  # (plan.point)
        if step.role == "scan slice" and (step.key, step.inputs[0]) in lay.scans:
            if loops.scan_slice(graph, step, at, lay, mesh, cpu, points, (temps, early)):
                k = arrays.index(step.output)
                if temporary[k]:
                    gone.add(k)
                else:
                    points[lives.first[k] : lives.last[k] + 1] -= sizes[k]
            continue
        found = lay.steps.get(step.key)
        if found is None:
            continue
        ins, made = found
        first = {j: born[a] for j, a in enumerate(step.inputs) if (n, j) in plan.early}
        copies.operands(graph, step, ins, at, first, lay, mesh)  # (:mod:`.remat`: first)
        value, broadcast = graph.values[step.output], step.prim == "broadcast_in_dim"
        if copy := made_copy(value, made, specs[step.output], mesh, cpu, broadcast):
            block = shard_bytes(value, made, mesh) * moved_widening(value.dtype, cpu)
            copies.result(at, step.output, copy, block)
        if cpu and step.prim == "conv_general_dilated" and step.op is not None:
            loops.conv_copies(graph, step, ins, made, mesh, points)
        if step.prim in UPDATES and copies_argument(graph, step, fixed.read):
            points[at] += shard_bytes(graph.values[step.inputs[0]], ins[0], mesh)
        if step.kind == "dot":
            partial_buffers(graph, step, found, at, mesh, cpu, fixed.outputs_of, later, summed)
    together(graph, summed, temps)
    if cpu:
        pooled_operands(graph, lay, mesh, points, fixed.pooled)
    for start, end, size in made_whole(graph):  # (masks, closed-over arrays: whole)
        temps.add(start, end, size)
    for v in gathered_transposes(graph, lay, mesh, fixed.folded):  # (made after all)
        temps.add(born[v], graph.last[v], int(sizes[arrays.index(v)]))
    still = temporary.copy()
    still[list(gone)] = False
    still &= (sizes > 0) & (lives.first <= lives.last)
    results = {arrays[k]: len(temps.size) + i for i, k in enumerate(np.flatnonzero(still))}
    temps.extend(lives.first[still], lives.last[still], sizes[still])
    temps.add(0, 0, copies.passing)  # (a result's buffer may take it too)
    _heap(graph, lives, sizes, copies, results, points)
    combined(later, points, float32_sums(graph, collected, later, fixed.outputs_of))
    loops.carry_copies(graph, lay, mesh, points)
    if cpu:
        loops.threefry_loops(graph, lay, mesh, points)
    return Held(arrays, lives, sizes, points)


def _heap(
    graph: Graph, lives: Lives, sizes: np.ndarray, copies: Copies, results: dict[int, int],
    points: np.ndarray,
) -> None:  # fmt: skip
    """The ``copies`` (the temporaries and the copies of arguments, :class:`Copies`) added to
    ``points``, but those kept in a result's buffer (:mod:`.bins`); less what a step whose
    result is moved holds of them at once (:meth:`Copies.one_or_other`; ``results``: each
    temporary array's index among the temporaries)."""
    # XLA moves an argument (gathers a weight) before anything else, as soon as the program
    # starts, and holds it until its last reader (seen in the compiled schedules: every
    # all-gather of an FSDP weight first)
    arguments = copies.argument_temps()
    buffers = [(int(sizes[k]), lives.written[v]) for k, v in enumerate(lives.arrays)
               if v in lives.written]  # fmt: skip
    spans = [(loop.start + 1, loop.end) for loop in graph.loops]
    homes = placed(copies.temps, buffers, spans)
    copies.temps.onto(points, homes)
    copies.one_or_other(homes, arguments, results, points)


def _visited(graph: Graph, lay: Layouts, mesh: MeshSpec, fixed: _Fixed) -> list[int]:
    """The steps that may make copies under ``lay``, in order: all but the fused broadcasts
    (:func:`fused`), and those of them that a collective moves."""
    moved = [n for n in fixed.broadcasts if moved_broadcast(graph, graph.steps[n], lay, mesh)]
    return sorted([*fixed.visit, *moved]) if moved else fixed.visit


def peak_bytes(graph: Graph, lay: Layouts, mesh: MeshSpec, platform: str = "") -> int:
    """Per-device bytes held at the fullest point of the program (:func:`held_curve`)."""
    points = held_curve(graph, lay, mesh, platform).points
    return int(points.max()) if len(points) else 0


def memory_constraints(
    graph: Graph, problem: Problem, budget: int, mesh: MeshSpec
) -> list[Constraint]:
    """``budget`` as linear constraints at the :data:`MEMORY_POINTS` fullest program points."""
    lives = _in_order(graph)
    lives = _live(graph) if lives is None else lives
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
