"""What each step of a program costs under given layouts, in one place: its time (all its
repeats), its FLOPs, and the collectives it causes. The solver's matrices
(:mod:`~shardwise._program.problem`) and the explanation of a plan
(:mod:`~shardwise._program.explain`) both read these costs, so they cannot disagree.

- an **elementwise** class writes the bytes of the arrays XLA writes out, over the memory
  bandwidth: XLA fuses chains of elementwise ops, and into reductions, so a result that only
  those read is never written (:func:`written`);
- a **dot** costs what the einsum cost model predicts for its strategy (so a one-dot program
  plans exactly like ``plan_einsum``); an op read as an einsum (a convolution, a gather:
  :mod:`~shardwise._program.windows`) its share of the FLOPs or of the bytes it reads and
  writes, whichever takes longer, and the all-reduces of its partial sums
  (:meth:`StepCosts.read_as_einsum`);
- a **map** gathers the dimensions it needs whole, all-reduces the partial sums of a
  reduction over split dimensions, reads its operand and writes its result;
- an **opaque** op gathers its operands whole and runs whole on each device: the bytes it
  reads and writes, or its rule's FLOPs, whichever takes longer;
- a **move** of an array between two layouts (an operand to the layout a step reads it in, a
  result from the layout a step makes it in) costs the resharding
  (:mod:`~shardwise._program.moves`).

Pure: no devices.
"""

from __future__ import annotations

import math
from collections.abc import Set
from typing import Any

from shardwise._caches import cached
from shardwise._model.collective import wire_bytes, wire_itemsize
from shardwise._model.cost import PredictedCollective, predict, ring_seconds, sum_groups
from shardwise._model.mesh import MeshSpec
from shardwise._model.op import Op
from shardwise._model.profile import Profile
from shardwise._model.reshard import all_to_alls_first
from shardwise._model.spec import Entry, Spec
from shardwise._model.strategy import Strategy, reduce_axes, strategies
from shardwise._program.cpu_convs import conv_taps, cpu_copies, groups
from shardwise._program.graph import Graph
from shardwise._program.moves import Cost, entry_ways, reshard, reshard_seconds, shard_bytes
from shardwise._program.nodes import Step
from shardwise._program.windows import bytes_read


def dot_strategies(
    graph: Graph, step: Step, mesh: MeshSpec, limit: int
) -> tuple[int, list[Strategy]]:
    """A dot's strategies from the einsum enumerator (``limit`` at most) and how many were
    considered. An op read as an einsum splits none of its whole letters (a convolution's
    spatial dimensions) and keeps its partial sums' layout (they are all-reduced; a split
    result is then a local slice)."""
    op = step.op
    assert op is not None
    shapes = [graph.values[a].shape for a in step.inputs]
    if not step.read_as_einsum:
        return strategies(op, op.sizes(shapes), mesh, limit)
    sizes: dict[str, int] = {}
    for term, shape in zip((*op.inputs, op.output), (*shapes, graph.values[step.output].shape),
                           strict=True):  # fmt: skip
        for i, n in zip(term, shape, strict=True):
            sizes.setdefault(i, n)
    split = [i for i in op.indices if i not in step.whole]
    core = Op(tuple("".join(i for i in t if i in split) for t in op.inputs),
              "".join(i for i in op.output if i in split))  # fmt: skip
    considered, found = strategies(core, sizes, mesh, limit)
    kept = [s for s in found if s.out_spec == s.layout.spec_for(core.output)]
    return considered, [Strategy(s.layout, s.layout.spec_for(op.output)) for s in kept]


def map_specs(graph: Graph, step: Step, src: Spec, mesh: MeshSpec) -> tuple[Spec, Spec, Entry]:
    """A map from its operand's layout ``src``: the layout it reads (``src`` without the axes of
    the dimensions it needs whole), the layout of its result, and the mesh axes its partial
    sums are all-reduced over (those of split reduced dimensions). An empty operand or result
    is read as it is held, with no sums: XLA makes the result from nothing (a sum over no
    elements is zeros)."""
    shape, out = graph.values[step.inputs[0]].shape, graph.values[step.output].shape
    empty = not math.prod(shape) or not math.prod(out)
    return _map_specs(len(shape), out, step.dim_map, step.reduced, step.local, src, mesh, empty)


@cached(maxsize=1 << 14)
def _map_specs(
    rank: int,
    out: tuple[int, ...],
    dim_map: tuple[int | None, ...],
    reduced: tuple[int, ...],
    local: tuple[int, ...],
    src: Spec,
    mesh: MeshSpec,
    empty: bool = False,
) -> tuple[Spec, Spec, Entry]:
    entries = [list(e) for e in src.padded(rank)]
    carried: list[Entry] = []
    for o, d in enumerate(dim_map):
        # a dimension it needs whole (sliced, padded, sorted, scanned along) is read whole:
        # its elements move between devices (a slice of a split dimension is not local)
        entry = tuple(entries[d]) if d is not None and d not in local else ()
        if entry and out[o] % entry_ways(entry, mesh):
            entry = ()
        carried.append(entry)
    if empty:
        return src.canonical(), Spec(tuple(carried)).canonical(), ()
    kept = {a for e in carried for a in e} | {a for d in reduced for a in entries[d]}
    whole = Spec(tuple(tuple(a for a in e if a in kept) for e in entries)).canonical()
    partial = tuple(a for a in mesh.names if any(a in entries[d] for d in reduced))
    return whole, Spec(tuple(carried)).canonical(), partial


def broadcast_read(graph: Graph, step: Step, dst: Spec, mesh: MeshSpec) -> Spec:
    """The layout an implicit broadcast (a ``(4, 1)`` operand of a ``(4, 8)`` elementwise op)
    reads its operand in to make its result as ``dst``: XLA's partitioner moves the operand to
    the result's layout on the dimensions it carries, and makes the dimensions it broadcasts
    as split on each device (seen: a LayerNorm scale split like the features, its result kept
    split on the batch: an all-gather of the scale, not an all-to-all of the result)."""
    shape = graph.values[step.inputs[0]].shape
    out = dst.padded(len(step.dim_map))
    entries: list[Entry] = [()] * len(shape)
    for o, d in enumerate(step.dim_map):
        if d is not None and shape[d] % entry_ways(out[o], mesh) == 0:
            entries[d] = out[o]
    return Spec(tuple(entries)).canonical()


def made_by_ops(graph: Graph) -> frozenset[int]:
    """The arrays XLA cannot fuse a copy into the making of: the program's arguments and the
    results of its dots and opaque ops."""
    return frozenset(graph.inputs) | {s.output for s in graph.steps if s.kind != "map"}


def a2a_copies(a: int, made: Set[int], into_op: bool) -> int:
    """How many copies of its block an all-to-all that moves array ``a`` costs on a CPU
    (:data:`~shardwise._program.moves.COPY_BYTES`): one where ``a`` is in ``made`` (from
    :func:`made_by_ops`: an elementwise op or a map that makes an array cuts it up itself),
    and one more where a dot or an opaque op reads it (``into_op``; an elementwise op reads
    the pieces as they are)."""
    return int(a in made) + int(into_op)


def written(graph: Graph) -> frozenset[int]:
    """The arrays XLA writes out: those a step reads, those a scan's loop takes in or
    carries, and the program's results. An elementwise result that only elementwise ops, an
    implicit broadcast or a reduction read is fused into them (``(tanh(x @ w) * 2).sum(-1)``
    compiles to one multiply-reduce fusion on CPU): it costs no memory traffic of its own."""
    kept = [s for s in graph.steps if not s.implicit and not (s.kind == "map" and s.reduced)]
    read = {a for s in kept for a in s.inputs}
    return frozenset(read | graph.looped | {v for v in graph.outputs if v is not None})


class StepCosts:
    """The costs of one graph's steps on one mesh, under one profile."""

    def __init__(self, graph: Graph, mesh: MeshSpec, profile: Profile) -> None:
        self.graph, self.mesh, self.profile = graph, mesh, profile
        self.made = made_by_ops(graph)
        scans: dict[int, set[tuple[int, ...]]] = {}  # (each scan slice step's key: its scan)
        for s in graph.steps:
            if s.role == "scan slice":
                scans.setdefault(s.inputs[0], set()).add(s.key)
        self.hoisting = frozenset(a for a in graph.inputs if len(scans.get(a, ())) > 1)
        """The argument stacks that two scans slice (:meth:`hoisted`)."""
        done = written(graph)
        self.runs: dict[int, int] = {}
        """Per class, how many elementwise ops write an array of it (weighted by repeats)."""
        for v, n in graph.elementwise.items():
            if v in done:
                root = graph.find(v)
                self.runs[root] = self.runs.get(root, 0) + n
        firsts: dict[tuple[int, ...], int] = {}
        for k, s in enumerate(graph.steps):
            firsts.setdefault(s.key, k)
        self.first = frozenset(firsts.values())
        """The first step of each equation (one opaque op with several results is one step
        per result; it reads its operands and does its work once)."""
        dots = [s for s in graph.steps if s.prim == "dot_general"]
        self.empty = frozenset(s.key for s in dots if not all(
            graph.values[a].nbytes for a in (*s.inputs, s.output)))  # fmt: skip
        """The ``dot_general``s with an empty operand or result: XLA makes their results from
        nothing (zeros, or nothing at all), reading no operand (not so an op read as a dot: a
        concatenation with an empty piece reads the others); it moves the zeros it makes."""
        self.known: dict[tuple[Any, ...], Any] = {}
        """The costs of steps alike, by what they depend on (a model written as a Python loop
        of layers repeats the same few steps once per layer), with no step attached."""

    def elementwise(self, root: int, spec: Spec) -> float:
        """The elementwise ops of class ``root`` laid out as ``spec``: each array they write
        read and written once."""
        value = self.graph.values[root]
        unit = 2.0 * self.runs.get(root, 0) / self.profile.memory_Bps
        return unit * shard_bytes(value, spec, self.mesh)

    def move(self, step: Step, a: int, src: Spec, dst: Spec, into_op: bool) -> Cost:
        """Array ``a`` moved from ``src`` to ``dst`` for ``step`` (into an op that reads it,
        ``into_op``, or from the layout the step makes it in)."""
        if self.moves_nothing(step, a):
            return Cost(0.0, ())
        mid = self.hoisted(step, a, src, dst)
        if mid is not None:
            first, rest = self.stack_move(step, src, mid), self.move(step, a, mid, dst, into_op)
            return Cost(first.seconds + rest.seconds, (*first.collectives, *rest.collectives))
        copies = a2a_copies(a, self.made, into_op)
        return reshard(self.graph.values[a], src, dst, self.mesh, self.profile, step,
                       step.runs(a == step.output), copies)  # fmt: skip

    def move_seconds(self, step: Step, a: int, src: Spec, dst: Spec, into_op: bool) -> float:
        """:meth:`move`'s time alone (the cost matrices need nothing else, many thousand
        times)."""
        if self.moves_nothing(step, a):
            return 0.0
        mid = self.hoisted(step, a, src, dst)
        if mid is not None:
            first = self.stack_move(step, src, mid).seconds
            return first + self.move_seconds(step, a, mid, dst, into_op)
        copies = a2a_copies(a, self.made, into_op)
        return reshard_seconds(self.graph.values[a], src, dst, self.mesh, self.profile,
                               step.runs(a == step.output), copies)  # fmt: skip

    def moves_nothing(self, step: Step, a: int) -> bool:
        """Whether ``a`` moves nothing for ``step``: an :attr:`empty` dot's operand, or its
        result if empty (its zeros move as a product would: seen, two 192 B all-to-alls)."""
        return step.key in self.empty and (a != step.output or not self.graph.values[a].nbytes)

    def hoists(self, step: Step, a: int) -> bool:
        """Whether ``step`` slices ``a`` from a stack that two scans slice (:meth:`hoisted`)."""
        return step.role == "scan slice" and a == step.output and step.inputs[0] in self.hoisting

    def hoisted(self, step: Step, a: int, src: Spec, dst: Spec) -> Spec | None:
        """Where a layer's slice of an argument that two scans slice (a training step's
        forward and backward passes) is moved by all-to-alls before any gather, the layout
        those all-to-alls leave it in: XLA moves the whole stack so, once, before the loops
        (seen in the compiled HLO: an all-to-all of the ``f32[2,8,32,256]`` stack before the
        while loop); else ``None``: the slice moves in each iteration (a forward pass)."""
        if not self.hoists(step, a):
            return None
        return all_to_alls_first(src, dst, len(self.graph.values[a].shape))

    def stack_move(self, step: Step, src: Spec, dst: Spec) -> Cost:
        """Scan slice ``step``'s stack moved before the loop from the layout its slices are
        made in, ``src``, to ``dst`` (:meth:`hoisted`)."""
        stack = self.graph.values[step.inputs[0]]
        rank = len(stack.shape) - 1
        whole = Spec(((), *src.padded(rank))), Spec(((), *dst.padded(rank)))
        copies = a2a_copies(step.inputs[0], self.made, False)
        return reshard(stack, *whole, self.mesh, self.profile, step, step.repeat, copies)

    def dot(self, step: Step, strategy: Strategy) -> Cost:
        """A dot's own cost under ``strategy``: the einsum cost model's prediction (or
        :meth:`read_as_einsum`'s)."""
        assert step.op is not None
        if step.key in self.empty:
            return Cost(0.0, (), 0.0)
        if step.read_as_einsum:
            return self.read_as_einsum(step, strategy)
        shapes = tuple(self.graph.values[a].shape for a in step.inputs)
        dtype = self.graph.values[step.output].dtype
        key = ("dot", step.op, shapes, dtype, step.repeat, strategy, step.kernel)
        if key not in self.known:
            p = predict(step.op, list(shapes), dtype, self.mesh, strategy, self.profile)
            # in a fused kernel its blocks stream from the core's own memory: FLOPs alone
            seconds = p.compute_seconds + p.comm_seconds if step.kernel else p.seconds
            self.known[key] = Cost(seconds * step.repeat,
                                   tuple((c, None) for c in p.collectives),
                                   p.flops * step.repeat)  # fmt: skip
        return _at(self.known[key], step)

    def read_as_einsum(self, step: Step, strategy: Strategy) -> Cost:
        """An op read as an einsum (a convolution, a gather) under ``strategy``: each device
        does its share of the FLOPs (each mesh axis the strategy uses divides them) or moves
        the bytes of its blocks (:func:`~shardwise._program.windows.bytes_read`), whichever
        takes longer, and its partial sums over split summed letters are all-reduced, one
        all-reduce per letter, as a dot's."""
        graph, mesh, profile = self.graph, self.mesh, self.profile
        op = step.op
        assert op is not None
        out = graph.values[step.output]
        held = [
            shard_bytes(graph.values[a], spec, mesh)
            for a, spec in zip(step.inputs, strategy.in_specs(op), strict=True)
        ]
        partial = shard_bytes(out, strategy.out_spec, mesh)
        wire = wire_itemsize(out.dtype, profile.platform)  # (a CPU sums bfloat16 as float32)
        summed = wire_bytes(partial, out.dtype, profile.platform)
        split = {i: entry_ways(e, mesh) for i, e in strategy.layout.assignment}
        own = step.flops / math.prod(split.values())
        flops = own
        axes = tuple(a for a in reduce_axes(op, strategy.layout, mesh) if mesh.shape[a] > 1)
        sums = [
            PredictedCollective("all-reduce", group, summed,
                                ring_seconds("all-reduce", group, summed, mesh, profile))
            for group in sum_groups(op, strategy.layout, axes)
        ]  # fmt: skip
        # summing partial results costs one add per element reduced (as XLA counts it)
        flops += sum(c.bytes // wire for c in sums)
        moved = bytes_read(step.prim, held, partial)
        compute = flops / profile.flops(out.dtype)
        if step.prim == "conv_general_dilated":
            # a convolution is a matrix product over image patches: its operands read at the
            # matmul's rate, and on a CPU packed first, then multiplied (the times add), after
            # the copies into the layouts its kernels take (a kernel gradient's operands)
            memory = moved / profile.gemm_Bps
            seconds = compute + memory if profile.platform == "cpu" else max(compute, memory)
            if profile.platform == "cpu":
                copied = [n for n, c in zip((*held, partial), cpu_copies(op), strict=True) if c]
                seconds += 2 * sum(copied) / profile.memory_Bps
            if profile.conv_tap_s:  # (a time per position and tap, whatever the features)
                kernel = graph.values[step.inputs[1]].shape
                n = groups(op, graph.values[step.inputs[0]].shape, kernel)
                seconds += conv_taps(op, kernel, own, split, n) * profile.conv_tap_s
        else:
            seconds = max(compute, moved / profile.memory_Bps)
        seconds += sum(c.seconds for c in sums)
        return Cost(seconds * step.repeat, tuple((c, step) for c in sums), flops * step.repeat)

    def map_head(self, step: Step, src: Spec) -> tuple[Cost, Spec]:
        """A map's cost from its operand held as ``src`` up to its result in the layout it
        makes it in, and that layout: the gather of the dimensions it needs whole, an
        all-reduce per split reduced dimension, and the bytes it reads and writes."""
        a, out = self.graph.values[step.inputs[0]], self.graph.values[step.output]
        made = step.inputs[0] in self.made
        key = ("map", a.shape, a.dtype, out.shape, out.dtype, step.dim_map, step.local,
               step.reduced, step.runs(False), step.runs(True), step.implicit, made,
               src, step.kernel)  # fmt: skip
        if key not in self.known:
            self.known[key] = self._map_head(step, src)
        head, mapped = self.known[key]
        return _at(head, step), mapped

    def _map_head(self, step: Step, src: Spec) -> tuple[Cost, Spec]:
        graph, mesh, profile = self.graph, self.mesh, self.profile
        value, out = graph.values[step.inputs[0]], graph.values[step.output]
        whole, mapped, partial = map_specs(graph, step, src, mesh)
        gather = self.move(step, step.inputs[0], src, whole, into_op=False)
        sums: list[tuple[PredictedCollective, Step]] = []
        if partial:
            # one all-reduce per split reduced dimension, over its axes (as XLA sums a
            # reduction over two dimensions split on two axes: over one axis, then the other)
            # (a CPU sums bfloat16 as float32)
            n = wire_bytes(shard_bytes(out, mapped, mesh), out.dtype, profile.platform)
            entries = src.padded(len(value.shape))
            for d in step.reduced:
                axes = tuple(a for a in mesh.names if a in entries[d] and a in partial)
                if axes:
                    seconds = ring_seconds("all-reduce", axes, n, mesh, profile)
                    sums.append((PredictedCollective("all-reduce", axes, n, seconds), step))
        # it reads its operand and writes its result, but an implicit broadcast is carried out
        # inside the elementwise op that reads it, and writes nothing of its own (nor does
        # anything in a fused kernel, through HBM)
        moved = 0 if step.kernel else shard_bytes(value, whole, mesh)
        if not (step.implicit or step.kernel):
            moved += shard_bytes(out, mapped, mesh)
        # the gather's cost already counts its repeats (and its copies); the sums are per run
        comm = gather.seconds + sum(c.seconds for c, _ in sums) * step.repeat
        parts = (*gather.collectives, *sums)
        return Cost(comm + step.repeat * moved / self.profile.memory_Bps, parts), mapped

    def broadcast_bytes(self, step: Step, read: Spec) -> float:
        """Seconds an implicit broadcast takes to read its operand as ``read`` (it writes
        nothing of its own: the elementwise op that reads it does)."""
        value = self.graph.values[step.inputs[0]]
        moved = 0 if step.kernel else shard_bytes(value, read, self.mesh)
        return step.repeat * moved / self.profile.memory_Bps

    def map(self, step: Step, src: Spec, dst: Spec) -> Cost:
        """A map from its operand held as ``src`` to its result kept as ``dst``."""
        head, mapped = self.map_head(step, src)
        after = self.move(step, step.output, mapped, dst, into_op=False)
        return Cost(head.seconds + after.seconds, (*head.collectives, *after.collectives))

    def opaque(self, k: int) -> Cost:
        """Opaque step ``k``'s own work, whole on each device: the bytes it reads (once per
        equation) and writes, or its FLOPs, whichever takes longer."""
        graph = self.graph
        step = graph.steps[k]
        out = graph.values[step.output]
        moved, flops = out.nbytes, 0.0
        if k in self.first:
            moved += sum(graph.values[a].nbytes for a in step.inputs)
            flops = step.flops
        seconds = max(moved / self.profile.memory_Bps, flops / self.profile.flops(out.dtype))
        found: tuple[tuple[PredictedCollective, None], ...] = ()
        group = tuple(a for a in self.mesh.names if self.mesh.shape[a] > 1)
        if step.prim in CALLBACKS and group:  # run on one device, its result sent to all
            size = wire_bytes(out.nbytes, out.dtype, self.profile.platform)
            sent = ring_seconds("all-reduce", group, size, self.mesh, self.profile)
            found = ((PredictedCollective("all-reduce", group, size, sent), None),)
            seconds += sent
        return Cost(seconds * step.repeat, found, flops * step.repeat)


CALLBACKS = frozenset({"pure_callback"})
"""Callbacks with a result: XLA runs one on one device and sums its result over the mesh
(an all-reduce named after a sharding constraint, seen for ``jax.pure_callback``)."""


def _at(cost: Cost, step: Step) -> Cost:
    """``cost`` with its collectives caused by ``step``."""
    if not cost.collectives:
        return cost
    return Cost(cost.seconds, tuple((c, step) for c, _ in cost.collectives), cost.flops)
