"""The buffers XLA makes for loops, beside a program's arrays: the copy a scan's loop runs
its carry in, a stack gathered whole before the loop that slices it, the slices of a stacked
weight hoisted out of a scan's loop, and the loop that draws random bits on CPU. Each adds
its bytes per device to the program points it is held at. And when a scan's slices and
stacks are held (:func:`loop_lives`), and which slices are never made (:func:`fused_slice`).
"""

from __future__ import annotations

from itertools import pairwise
from typing import TYPE_CHECKING

import numpy as np

from shardwise._model.mesh import MeshSpec
from shardwise._model.reshard import reshard_moves
from shardwise._model.spec import Spec
from shardwise._program.bins import Temps
from shardwise._program.cpu_convs import cpu_copies
from shardwise._program.graph import Graph
from shardwise._program.moves import relayout_bytes, shard_bytes
from shardwise._program.nodes import Step, Value
from shardwise._program.upcast import converted_move, moved_widening, widening

if TYPE_CHECKING:
    from shardwise._program.solution import Layouts


THREEFRY_BUFFERS = 4
"""Blocks of random bits XLA's CPU backend holds while it draws them: the threefry hash runs as
a loop over two counter arrays of the bits' shape, carried round and remade in each turn (seen
in the compiled HLO: a ``while`` over two ``u32[8,64]`` arrays for an ``f32[8,64]`` mask)."""


def threefry_loops(graph: Graph, lay: Layouts, mesh: MeshSpec, points: np.ndarray) -> None:
    """The loop of each draw of random bits (:data:`THREEFRY_BUFFERS`), laid out as the plan
    lays out the bits (:mod:`~shardwise._program.drawn`). XLA runs the loop while the
    arrays it masks (the first of their shape made from then on) are made: where one of them
    is made before the draw, its blocks are held from the last step that makes one, up to
    the draw (seen in the compiled schedules: the loop before or after the dot making the
    activations). Where none is, the loop needs only the key: XLA's scheduler, which orders
    ops to hold the least, runs it where the least is held between the draw and the first step
    that reads the bits (:func:`_quietest`)."""
    if not graph.drawn:
        return
    made: dict[int, list[int]] = {}
    for step in graph.steps:
        if step.role == "op":  # (not a bias broadcast to the activations)
            made.setdefault(graph.find(step.output), []).append(graph.born[step.output])
    drawn = {graph.find(d) for _, _, d in graph.drawn if d is not None}
    for at, shape, d in graph.drawn:
        later = [v for v, x in enumerate(graph.values) if x.shape == shape
                 and graph.born[v] >= at and graph.find(v) not in drawn]  # fmt: skip
        v = min(later, key=lambda u: graph.born[u]) if later else None
        spec = lay.specs[d] if d is not None else lay.specs[v] if v is not None else Spec(())
        mine = made.get(graph.find(v), []) if v is not None else []
        start = max((t for t in mine if t <= at), default=at)
        bits = Value(shape, "uint32", "random bits", "")
        if start == at and d is not None:
            start = at = _quietest(graph, d, at, points)
        points[start : at + 1] += THREEFRY_BUFFERS * shard_bytes(bits, spec, mesh)


def _quietest(graph: Graph, bits: int, at: int, points: np.ndarray) -> int:
    """The program point from the draw ``at`` of ``bits`` to the first step that reads them
    (or what is made from them alone: the mask) where the fewest bytes are held: where XLA
    runs the loop that draws them. Its scheduler puts an op that frees nothing as late as its
    readers allow, after the ops that free buffers (seen in the compiled schedule of a dropout
    step split over the weights' columns (FSDP): the loop after the dot that reads the
    gathered weight, which is freed by then, not at the program's start beside it: 20 KB
    where the draw over the gathered weights had counted 29 KB)."""
    mask = graph.find(bits)
    readers = [graph.born[s.output] for s in graph.steps if graph.born[s.output] >= at
               and any(graph.find(a) == mask for a in s.inputs)]  # fmt: skip
    end = min(min(readers, default=graph.clock), len(points) - 1)
    return at + int(np.argmin(points[at : end + 1])) if end >= at else at


def carry_copies(graph: Graph, lay: Layouts, mesh: MeshSpec, points: np.ndarray) -> None:
    """A scan whose carry starts from an argument of the program runs its loop in a copy of
    it: XLA cannot write the caller's buffer, so it copies the argument into the loop's own
    before the ``while`` (seen in the compiled HLO: a ``copy`` of the ``f32[16,64,256]``
    input ahead of the loop), and that copy is held while the loop runs."""
    arguments = set(graph.inputs)
    for init, body in graph.carries:
        loop = _loop(graph, body)
        if init in arguments and loop is not None:
            points[loop] += shard_bytes(graph.values[init], lay.specs[init], mesh)


def loop_lives(graph: Graph, born: list[int]) -> None:
    """A scan's stacked results are held from the loop's start, each iteration's slice
    written into them as it is made (``dynamic-update-slice``), not all held to the loop's
    end (which had put a training step's peak, at the end of its forward scan, 19% high);
    and a slice of a stack the program makes (the activations a backward scan reads) is made
    as the body first reads it, not as the iteration starts (counting every one from the
    start had put the same step's peak, at its backward scan's start, 21% high). A slice of
    an argument (a layer's weights) is made as the iteration starts: counted so, the
    data-parallel forward pass of a scanned transformer is XLA's to the byte."""
    for loop in graph.loops:
        k = loop.steps[1]
        while k < len(graph.steps) and graph.steps[k].role == "scan stack":
            born[graph.steps[k].output] = min(born[graph.steps[k].output], loop.start)
            k += 1
    arguments = set(graph.inputs)
    sliced = {
        s.output for s in graph.steps if s.role == "scan slice" and s.inputs[0] not in arguments
    }
    first: dict[int, int] = {}
    for s in graph.steps:
        for a in s.inputs:
            if a in sliced:
                first[a] = min(first.get(a, born[s.output]), born[s.output])
    for v, at in first.items():
        born[v] = max(born[v], at)


def _loop(graph: Graph, body: tuple[int, ...]) -> slice | None:
    """The program points a scan's loop runs over: from the first step of its ``body`` (the
    path of the scan's body in the jaxpr) to the last; ``None`` where it has no steps."""
    within = [graph.born[s.output] for s in graph.steps if s.key[: len(body)] == body]
    return slice(min(within), max(within) + 1) if within else None


def gathered_stack(
    graph: Graph, step: Step, whole: Spec, lay: Layouts, mesh: MeshSpec, cpu: bool,
    copies: tuple[Temps, dict[tuple[int, Spec], tuple[int, int]]],
) -> None:  # fmt: skip
    """A stack split along the dimension a scan runs over (its layers over a mesh axis) is
    gathered whole on that dimension before the loop, which slices one layer of it in each
    iteration: the gathered stack is a buffer beside the stack, held while the loop runs
    (seen in the compiled HLO: an ``all-gather`` of the ``f32[2,512,512]`` stack to
    ``f32[4,512,512]`` ahead of the while loop, which carries it; counting one layer's slice
    had put that plan at 0.43x XLA's memory). An argument's stack is gathered, as any
    argument's copy, as the program starts (into ``copies``' second part, by argument and
    layout, with the last point it is held at); another's, as the loop starts (a temporary,
    into their first)."""
    stack = step.inputs[0]
    held_as = lay.specs[stack]
    if whole is held_as or whole.canonical() == held_as.canonical():
        return
    loop = _loop(graph, step.key)
    assert loop is not None  # the slicing step itself is in the loop's body
    value, rank = graph.values[stack], len(graph.values[stack].shape)
    size, wide = shard_bytes(value, whole, mesh), moved_widening(value.dtype, cpu)
    kept = widening(value.dtype, cpu)  # (bfloat16 with jaxlib 0.12: moved wide, kept as it is)
    relay = relayout_bytes(value, held_as, whole, mesh) if cpu else 0
    if cpu:
        size = (size + relay) * kept
    # (moved along a dimension but the first, the transposed buffer is the one converted back,
    # as copies.read_copy counts it)
    held = shard_bytes(value, held_as, mesh)
    converted = 0 if relay else converted_move(held, size, value.dtype, cpu)
    temps, early = copies
    start = 0 if stack in graph.inputs else loop.start
    if stack in graph.inputs:
        key = (stack, whole.canonical())
        early[key] = (size, max(loop.stop - 1, early.get(key, (0, 0))[1]))
    else:
        temps.add(start, loop.stop - 1, size)
    # gathered over several mesh axes, one all-gather after another, each step's result is
    # held while the next is made from it (seen: the ``f32[4,512,512]`` gather over one axis
    # beside the ``f32[8,512,512]`` one over the other; without it the FSDP plan was 0.79x)
    steps = [wide * shard_bytes(value, m.spec, mesh) for m in reshard_moves(held_as, whole, rank)]
    pairs = [a + b - steps[-1] for a, b in pairwise(steps)]
    temps.add(start, start, max([*pairs, converted], default=0))


def scan_slice(
    graph: Graph, step: Step, at: int, lay: Layouts, mesh: MeshSpec, cpu: bool,
    points: np.ndarray, copies: tuple[Temps, dict[tuple[int, Spec], tuple[int, int]]],
) -> bool:  # fmt: skip
    """A scan's slice of its stack, at program point ``at``, read in the layout ``lay`` maps it
    to: the stack gathered whole before the loop (:func:`gathered_stack`, into ``copies``: the
    temporaries and the copies of arguments), on CPU the copy of the slice in the usual
    layout, and an argument's stack sliced before the loop (:func:`hoist`), added to
    ``points``; whether the slice is fused into its reader (never a buffer,
    :func:`fused_slice`)."""
    whole, mapped = lay.scans[(step.key, step.inputs[0])]
    gathered_stack(graph, step, whole, lay, mesh, cpu, copies)
    if cpu:
        slice_ = graph.values[step.output]
        points[at] += relayout_bytes(slice_, mapped, lay.specs[step.output], mesh)
    if step.inputs[0] in graph.inputs:
        hoist(graph, step, lay, mapped, mesh, points)
    return fused_slice(graph, step, lay, mapped)


def hoist(
    graph: Graph, step: Step, lay: Layouts, mapped: Spec, mesh: MeshSpec, points: np.ndarray
) -> None:
    """A replicated argument's stack, sliced locally for each layer: XLA hoists that slicing
    out of the loop (it does not change from one iteration to the next), so every layer's
    slice is made before the loop and all are held while it runs, where one is counted as the
    array (seen in the compiled HLO: an ``f32[2,256,512]`` dynamic-slice of a
    ``(2,256,1024)`` stack before the while loop). A replicated layer, which slices nothing
    but the layer, is read in place: nothing is hoisted."""
    stack, slice_, spec = step.inputs[0], graph.values[step.output], lay.specs[step.output]
    moves = reshard_moves(mapped, spec, len(slice_.shape))
    sliced = set(spec.axes) - set(mapped.axes)
    if lay.specs[stack].axes or not sliced or any(m.kind != "slice" for m in moves):
        return
    loop = _loop(graph, step.key)
    assert loop is not None  # the slicing step itself is in the loop's body
    layers = graph.values[stack].shape[0]
    points[loop] += (layers - 1) * shard_bytes(slice_, spec, mesh)


def fused_slice(graph: Graph, step: Step, lay: Layouts, mapped: Spec) -> bool:
    """Whether a layer's slice is never made: it is sliced as it is kept, and every op that
    reads it reads it split further on each device (a replicated layer read split), so XLA
    fuses the layer's slicing into each reader's (seen in the compiled HLO: the
    ``f32[2,1024,256]`` stack sliced to each device's ``f32[512,256]`` piece in one fusion
    inside the loop, with no buffer for the layer)."""
    v = step.output
    spec, rank = lay.specs[v], len(graph.values[v].shape)
    if spec.canonical() != mapped.canonical() or graph.classes.count(graph.classes[v]) > 1:
        return False  # (moved, or read by an elementwise op as it is held)
    readers = [(r, j) for r in graph.steps for j, a in enumerate(r.inputs) if a == v]
    for r, j in readers:
        found = lay.steps.get(r.key)
        if found is None or j >= len(found[0]) or found[0][j].canonical() == spec.canonical():
            return False
        if any(m.kind != "slice" for m in reshard_moves(spec, found[0][j], rank)):
            return False
    return bool(readers)


def conv_copies(
    graph: Graph, step: Step, ins: tuple[Spec, ...], made: Spec, mesh: MeshSpec, points: np.ndarray
) -> None:
    """The copies XLA's CPU backend makes of a convolution's operands and result in the
    layouts its kernels take (:func:`~shardwise._program.cpu_convs.cpu_copies`): an operand's
    by the op after the one that makes it (an argument's as the program starts), held until
    the convolution (seen in the compiled schedules: a kernel gradient's transposed image
    made right after the forward pass reads it, once what made it is freed)."""
    assert step.op is not None
    at = graph.born[step.output]
    *copied, result = cpu_copies(step.op)
    for a, used, copy in zip(step.inputs, ins, copied, strict=True):
        if copy:
            start = 0 if a in graph.inputs else min(graph.born[a] + 1, at)
            points[start : at + 1] += shard_bytes(graph.values[a], used, mesh)
    if result:
        points[at] += shard_bytes(graph.values[step.output], made, mesh)
