"""The buffers of partial sums: where a dot's contracted letters are split, each device makes
partial sums of its result, which an all-reduce (or a reduce-scatter) adds up. XLA gives them
a buffer of their own beside the sum, and combines all-reduces that do not depend on each
other: a training step's weight gradients' into one after the backward pass, and those of
the dots that read one activation (a layer's query, key and value projections) into one
after the last of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from shardwise._caches import cached, per_object
from shardwise._model.mesh import MeshSpec
from shardwise._model.op import Op
from shardwise._model.spec import Spec
from shardwise._program.bins import Temps
from shardwise._program.buffers import readers
from shardwise._program.graph import Graph
from shardwise._program.moves import local, shard_bytes
from shardwise._program.nodes import Step
from shardwise._program.upcast import moved_widening, widening
from shardwise._versions import cpu_fuses_transposed_dots

if TYPE_CHECKING:
    from shardwise._program.memory import Lives
    from shardwise._program.solution import Layouts


def _layout(op: Op, ins: tuple[Spec, ...]) -> Spec:
    """The layout of a dot's partial sums, from the layouts it reads its operands in."""
    axes: dict[str, tuple[str, ...]] = {}
    for term, spec in zip(op.inputs, ins, strict=True):
        for letter, entry in zip(term, spec.padded(len(term)), strict=True):
            axes[letter] = axes.get(letter) or tuple(entry)
    return Spec(tuple(axes.get(i, ()) for i in op.output)).canonical()


def to_outputs(graph: Graph) -> set[int]:
    """The classes of arrays that only elementwise ops, transposes and reshapes take to the
    program's outputs (a weight's gradient, transposed, then the update)."""
    found = {graph.find(v) for v in graph.outputs if v is not None}
    for step in reversed(graph.steps):
        if step.prim in ("transpose", "reshape") and graph.find(step.output) in found:
            found.add(graph.find(step.inputs[0]))
    return found


def combined(
    partials: list[tuple[int, int, int]], points: np.ndarray,
    sums: Sequence[tuple[int, int, int]] = (),
) -> None:  # fmt: skip
    """The partial sums of the results that go only to the program's outputs (a training
    step's weight gradients), summed by one all-reduce after the last of them: XLA combines
    their all-reduces, so each one's partial sums are held from its dot to the last such dot,
    and there the sums of those it then slices are made beside them (seen in the compiled
    HLO of a data-parallel step: one all-reduce of a tuple of every gradient, at the end).
    ``sums``: the float32 buffers of sums held beside the arrays (:func:`float32_sums`), by
    (start, end, bytes)."""
    for start, end, size in sums:
        points[start : end + 1] += size
    if not partials:
        return
    end = max(at for at, _, _ in partials)
    for at, size, copies in partials:
        points[at : end + 1] += size
        points[end] += (copies - 1) * size


def partial_buffers(
    graph: Graph,
    step: Step,
    found: tuple[tuple[Spec, ...], Spec],
    at: int,
    mesh: MeshSpec,
    cpu: bool,
    outputs_of: set[int],
    later: list[tuple[int, int, int]],
    summed: list[Summed],
) -> None:
    """A dot's partial sums (it reads its operands and makes its result as ``found`` says)
    where they are a buffer of their own beside the summed result (an all-reduce does not
    write over its operand); on CPU a scattered result is all-reduced into one more, then
    sliced. Those of a result that goes only to the outputs are summed ``later``
    (:func:`combined`), the others as :func:`together` says (``summed``)."""
    if step.kind != "dot" or step.op is None or step.read_as_einsum:
        return  # (an op read as an einsum keeps its partial sums' layout)
    partial, scattered = _buffer(step.op, *found)
    if partial is not None:
        size = shard_bytes(graph.values[step.output], partial, mesh)
        size *= moved_widening(graph.values[step.output].dtype, cpu)  # (:mod:`.upcast`)
        copies = 2 if cpu and scattered else 1
        if graph.find(step.output) in outputs_of and not step.branch:
            later.append((at, size, copies))
        else:
            summed.append((at, size, copies, step, summed_axes(step.op, found[0])))


def collected_halves(
    graph: Graph, lay: Layouts, mesh: MeshSpec, lives: Lives, sizes: np.ndarray, cpu: bool
) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """``sizes`` (one per array of ``lives``) on CPU (``cpu``) with the 16-bit float arrays
    that a collective makes under ``lay`` at float32, where the CPU backend computes them as
    they are (:func:`~shardwise._program.upcast.widening`: bfloat16 with jaxlib 0.12): a dot's sum
    of its partial sums, and a result made in another layout and moved there. XLA sums and
    moves them in float32 (:func:`~shardwise._program.upcast.moved_widening`) and the ops
    that read them read the float32 buffer (seen in the compiled HLO of a bfloat16 training
    step with jaxlib 0.12.1: the weight gradients' ``f32[256,64] all-reduce``, or a gradient
    made split and its ``f32[256,64] all-gather``, read by the update's fusion; counted at two
    bytes, in the updated weight's buffer, the plans had been at 0.67-0.74x XLA's memory).
    One that would be made in a result's buffer (such a gradient) is a float32 buffer of its
    own (:func:`float32_sums`): those are given too, with their bytes."""
    out, extra = sizes, list[tuple[int, int]]()
    steps = _collected_in_float32(graph) if cpu else []
    if not steps:  # (none before jaxlib 0.12: nothing to index, in every plan's curve)
        return out, extra
    index = {v: k for k, v in enumerate(lives.arrays)}
    results = {v for v in graph.outputs if v is not None}
    for step in steps:
        v, found = step.output, lay.steps.get(step.key)
        k = index.get(v)
        if k is None or found is None or v in results:
            continue
        ins, made = found
        kept = lay.specs[v]
        if not (
            (step.kind == "dot" and step.op is not None and summed_axes(step.op, ins))
            or not local(made, kept, len(graph.values[v].shape), mesh)
        ):
            continue
        if lives.first[k] <= lives.last[k]:
            out = out.copy() if out is sizes else out
            out[k] *= 2
        else:  # (in a result's buffer, which is of the result's own type)
            extra.append((v, 2 * int(sizes[k])))
    return out, extra


def float32_sums(
    graph: Graph, extra: list[tuple[int, int]], later: list[tuple[int, int, int]],
    outputs_of: set[int],
) -> list[tuple[int, int, int]]:  # fmt: skip
    """The (start, end, bytes) of the float32 buffers of ``extra`` (:func:`collected_halves`:
    each array and its bytes), each from its step to its last reader; those of results that
    go only to the outputs are summed with the others' partial sums (``later``,
    :func:`combined`), after the last of them, and held from there."""
    end = max((at for at, _, _ in later), default=0)
    out = []
    for v, size in extra:
        start = end if later and graph.find(v) in outputs_of else graph.born[v]
        out.append((start, max(start, graph.last[v]), size))
    return out


@per_object(maxsize=8)
def _collected_in_float32(graph: Graph) -> list[Step]:
    """The steps of ``graph`` that make 16-bit floats that the CPU backend makes as they are
    but sums and moves in float32 (:func:`collected_halves`)."""
    return [
        step
        for step in graph.steps
        if moved_widening(dtype := graph.values[step.output].dtype, True) > widening(dtype, True)
    ]


Summed = tuple[int, int, int, Step, frozenset[str]]
"""A dot's partial sums: its program point, their bytes, how many buffers (the partial sums,
and on CPU a scattered result's whole sum), the dot, and the mesh axes they are summed over."""


def together(graph: Graph, summed: list[Summed], temps: Temps) -> None:
    """The partial sums of dots, in program order (``summed``), added to ``temps``: those of
    dots one after another, run as often and summed over the same mesh axes, that read a common
    operand and nothing made from each other's results (a layer's query, key and value
    projections of one activation) are summed by one all-reduce after the last of them, so
    each is held from its dot to there, and a scattered result's whole sum is made there
    (XLA combines independent all-reduces: seen in the compiled HLO of an FSDP attention
    block, one all-reduce of a tuple of the three projections, their partial sums all held
    before it)."""
    group: list[Summed] = []
    for entry in [*summed, None]:
        if entry is not None and group and _joins(graph, entry, group):
            group.append(entry)
            continue
        end = max((at for at, *_ in group), default=0)
        for at, size, copies, *_ in group:
            temps.add(at, end, size)
            for _ in range(copies - 1):
                temps.add(end, end, size)
        group = [] if entry is None else [entry]


def _joins(graph: Graph, entry: Summed, group: list[Summed]) -> bool:
    """Whether the dot of ``entry`` is summed with the ``group``'s: run as often (not one in a
    loop's body and one after it; an inlined call's or checkpoint's dots are the caller's),
    over the same mesh axes, reading an operand of the group's first dot and no array of the
    class of a group's result (the result, or what elementwise ops make of it)."""
    step, axes, first = entry[3], entry[4], group[0][3]
    made = {graph.find(s.output) for *_, s, _ in group}
    return (
        step.repeat == first.repeat
        and step.branch == first.branch
        and axes == group[0][4]
        and bool(set(step.inputs) & set(first.inputs))
        and not made & {graph.find(a) for a in step.inputs}
    )


@cached(maxsize=1 << 14)
def summed_axes(op: Op, ins: tuple[Spec, ...]) -> frozenset[str]:
    """The mesh axes a dot that reads its operands as ``ins`` sums its partial sums over
    (those that split its contracted letters; none: nothing is summed after it)."""
    return frozenset(
        axis
        for term, spec in zip(op.inputs, ins, strict=True)
        for letter, entry in zip(term, spec.padded(len(term)), strict=True)
        if letter not in op.output
        for axis in entry
    )


@cached(maxsize=1 << 14)
def _buffer(op: Op, ins: tuple[Spec, ...], made: Spec) -> tuple[Spec | None, bool]:
    """The layout of the partial sums of a dot that reads its operands as ``ins`` and makes
    its result as ``made``, where they are a buffer of their own (else ``None``), and whether
    the result is scattered: the same for every layer of a stack and every plan alike."""
    partial = _layout(op, ins)
    scattered = partial != made.canonical()
    return (partial if scattered or summed_axes(op, ins) else None), scattered


REDUCES = frozenset({"reduce_sum", "reduce_max", "reduce_min"})
"""The reductions XLA's CPU backend fuses into the dot they read (:func:`into_reduce`)."""


def into_reduce(graph: Graph) -> dict[int, tuple[int, tuple[int, ...]]]:
    """The dots whose result XLA's CPU backend never stores: a float32 or bfloat16 dot,
    contracted over its left operand's last dimensions and reading no transposed operand,
    whose result only elementwise ops read (a bfloat16 sum's conversion to float32, a
    ``tanh``) until one sum, maximum or minimum reads their last; it fuses them all (one
    YNNPACK fusion: seen in the compiled HLO of ``(e @ w).sum(-1)``, the dot's
    ``f32[8,128,1024]`` never made, where counting it had put every plan of an embedding at
    1.2x XLA's memory, and ``(x @ w).sum(-1)`` in bfloat16 at 3.3x; the same for 2-D and 3-D
    dots, ``sum``, ``mean``, ``max`` and ``min`` over any axis). Not a float16 or an integer
    dot, nor, before jaxlib 0.12.1, one whose transposed operand XLA folds into it
    (``x.T @ w``, :func:`~shardwise._versions.cpu_fuses_transposed_dots`): XLA stores those.
    (:func:`fused_into_reduce` also asks that nothing is summed after it.) By the dot's step
    index: the reduction's, and the arrays never stored (the dot's and the elementwise ones')."""
    read_by = readers(graph)
    members: dict[int, list[int]] = {}
    for u in range(len(graph.values)):
        members.setdefault(graph.find(u), []).append(u)
    results = {v for v in graph.outputs if v is not None}
    transposed = {s.output for s in graph.steps if s.prim.startswith("transpose")}
    any_order = cpu_fuses_transposed_dots()  # (jaxlib 0.12.1: ``x.T @ w`` too)
    # each class's readers, its arrays no elementwise op makes, and whether one is a result:
    # once per class (a residual stream joins every layer's last dots: its readers are many)
    classes: dict[int, tuple[set[int], list[int], bool]] = {}
    out = {}
    for n, step in enumerate(graph.steps):
        v, op = step.output, step.op
        if step.prim != "dot_general" or op is None or step.repeat != 1:
            continue
        root = graph.find(v)
        if root not in classes:  # (the arrays elementwise ops join to the dot's result)
            chain = members[root]
            classes[root] = (
                {r for u in chain for r in read_by.get(u, ())},
                [u for u in chain if u not in graph.elementwise],
                not results.isdisjoint(chain),
            )
        reading, made, returned = classes[root]
        contracted = [c for c in op.inputs[0] if c not in op.output]
        last = op.inputs[0][len(op.inputs[0]) - len(contracted) :]
        if (
            graph.values[v].dtype in ("float32", "bfloat16")
            and all(u == v for u in made)
            and not returned
            and (any_order or sorted(last) == sorted(contracted))
            and (any_order or not transposed & set(step.inputs))
            and len(reading) == 1
            and graph.steps[min(reading)].prim in REDUCES
        ):
            out[n] = (min(reading), tuple(members[root]))
    return out


def fused_into_reduce(
    step: Step, found: tuple[tuple[Spec, ...], Spec], kept: Spec, read: Spec | None
) -> bool:
    """Whether a dot of :func:`into_reduce`, reading its operands and making its result as
    ``found`` says, is fused into its reduction: nothing is summed after it, and it makes its
    result as it is ``kept`` and the reduction ``read`` s it."""
    ins, made = found
    return (
        step.op is not None
        and read is not None
        and not summed_axes(step.op, ins)
        and made.canonical() == kept.canonical() == read.canonical()
    )


def fused_dots(
    graph: Graph, lay: Layouts, mesh: MeshSpec, dots: dict[int, tuple[int, tuple[int, ...]]],
    arrays: list[int], sizes: np.ndarray,
) -> tuple[np.ndarray, frozenset[tuple[int, ...]], frozenset[tuple[int, ...]]]:  # fmt: skip
    """``sizes`` (one per array of ``arrays``) but none for the arrays of the ``dots``
    (:func:`into_reduce`) that the CPU backend fuses into their reductions under ``lay``
    (:func:`fused_into_reduce`), the keys of those of them that gather no operand: they
    read 16-bit operands as they are (:func:`~shardwise._program.upcast.argument_copies`;
    one that gathers one makes float32 copies, seen in an FSDP plan), and the keys of all
    of them: they read an operand gathered in float32 as it is, where a bfloat16 dot that
    is not fused reads it converted back (:func:`~shardwise._program.copies.read_copy`; seen
    with jaxlib 0.12.1 in the FSDP plan of ``(x @ w).sum(-1)`` in bfloat16: the gathered
    ``f32[512,1024]`` read by the fused dot, which, counted converted back, had been
    predicted at 0.77x XLA's memory)."""
    if not dots:  # (no copy of the sizes where no dot is fused: every plan's curve on a GPU)
        return sizes, frozenset(), frozenset()
    index, out, fused, every = {v: k for k, v in enumerate(arrays)}, sizes.copy(), set(), set()
    for n, (r, chain) in dots.items():
        step, reader = graph.steps[n], lay.steps.get(graph.steps[r].key)
        found = lay.steps.get(step.key)
        read = reader[0][0] if reader and reader[0] else None
        if not found or not fused_into_reduce(step, found, lay.specs[step.output], read):
            continue
        assert step.op is not None
        gathered = [j for j, (a, used) in enumerate(zip(step.inputs, found[0], strict=False))
                    if shard_bytes(graph.values[a], used, mesh)
                    > shard_bytes(graph.values[a], lay.specs[a], mesh)]  # fmt: skip
        terms, contracted = step.op.inputs, set(step.op.contracted)
        # (a right operand gathered and contracted on its last dimensions, w of x @ w.T:
        # stored, seen in an FSDP plan of einsum("nd,kd->nk", x, w).sum(-1))
        if any(j and set(terms[j][: len(contracted & set(terms[j]))]) != contracted & set(
                terms[j]) for j in gathered):  # fmt: skip
            continue
        out[[index[u] for u in chain if u in index]] = 0
        every.add(step.key)
        if not gathered:
            fused.add(step.key)
    return out, frozenset(fused), frozenset(every)
