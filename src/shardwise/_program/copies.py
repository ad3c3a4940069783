"""The copies one step makes: of its operands, in the layouts it reads them in, and of its
result, in the layout it makes it in, where those differ from the arrays' own (:mod:`.memory`
counts them beside the arrays held).

Two things XLA frees sooner than the arrays' lives say. On CPU, an operand gathered along a
dimension but the first is gathered in a transposed layout and copied back
(:func:`~shardwise._program.moves.relayout_bytes`); the transposed buffer is freed once it is
copied back, not held to the copy's last reader (and a reshape or another of
:data:`READS_TRANSPOSED` reads it as it is, with no copy back). And a step whose result is
moved after it is made (an all-to-all from the layout the step makes it in to its own) frees
its operands' copies before it moves the result: the result in the step's layout is held
with either, not both at once.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from shardwise._model.mesh import MeshSpec
from shardwise._model.reshard import Move, reshard_moves
from shardwise._model.spec import Spec
from shardwise._program.bins import Temps
from shardwise._program.graph import Graph
from shardwise._program.moves import all_to_all, local, relayout_bytes, shard_bytes
from shardwise._program.nodes import Step, Value
from shardwise._program.upcast import converted_move, moved_widening, widening

if TYPE_CHECKING:
    from shardwise._program.solution import Layouts

READS_TRANSPOSED = frozenset({
    "reshape", "squeeze", "transpose", "broadcast_in_dim", "rev", "slice", "pad",
    "dynamic_slice", "argmax", "argmin", "sort",
})  # fmt: skip
"""The ops that read an operand XLA's CPU backend gathered along a dimension but the first in
the transposed layout it is gathered in, with no copy back (their loop fusion reads it as it
is; a sort copies it into its own result). Seen in the compiled HLO of pooled images
gathered along their channels for a flattening reshape: ``f32[16,8,8,8]{2,1,0,3}`` read by
the reshape's own copy (counted with a copy back, the plan had been at 0.78x XLA's memory);
and of one array gathered along its second dimension then reshaped, transposed, reversed,
padded, sliced (``dynamic_slice``), sorted or reduced by ``argmax`` (``squeeze``,
``broadcast_in_dim``, ``slice`` and ``argmin`` taken to be alike, not measured). A dot
(even one the plan leaves whole: 0.70x without it), a reduction, a pooling, a cumulative op
or ``top_k`` reads it copied back."""

Key = tuple[int, Spec]
"""An argument and a layout a step reads it in."""


class _Moved(NamedTuple):
    """A step whose result is moved after it is made: its program point, its result, the
    temporaries that are its operands' copies (their indices in :class:`Temps`), the arguments'
    copies it reads, the temporary of its result in its own layout and the pieces that move
    it (their index), and the bytes moving it holds beyond the one block the step writes."""

    at: int
    output: int
    temps: tuple[int, ...]
    keys: tuple[Key, ...]
    made: int
    pieces: int


_UNSEEN = -1
"""A dot's result bytes not looked up yet (:meth:`Copies.operands`: most steps copy nothing)."""


class Copies:
    """The copies steps make, added one step at a time (:meth:`operands`, :meth:`result`):
    ``temps``, held where the steps run; ``early``, the copies of arguments, by (argument,
    layout): their bytes and the last point a step reads them (held from the program's start,
    as XLA gathers a weight first); ``relayouts``, on CPU the transposed buffer each argument's
    copy is gathered in: its bytes and the first point a step reads the copy (held there
    only: made just before that reader and freed once copied back; seen in the compiled HLO
    of an embedding's weight ``w`` gathered along its columns, where its transposed
    ``f32[512,1024]{0,1}`` is freed after the copy-back: held to the weight's last reader, it
    had put data × tensor plans at 1.18x XLA's memory). ``in_reduce``: the keys of the dots
    fused into a reduction (:func:`~shardwise._program.sums.fused_dots`). ``starting``: the
    arrays made as the program starts besides the arguments, whose slices XLA makes then too,
    in the same fusion (its gathers it makes where they are read: seen in the compiled HLO of
    a float32 FSDP step that converts its weights to bfloat16, each weight gathered twice,
    for the forward and the backward pass;
    :func:`~shardwise._program.upcast.converted_arguments`)."""

    def __init__(
        self, early: dict[Key, tuple[int, int]], cpu: bool,
        in_reduce: frozenset[tuple[int, ...]] = frozenset(),
        starting: frozenset[int] = frozenset(),
    ) -> None:  # fmt: skip
        self.temps = Temps()
        self.early = early
        self.starting = starting
        self.relayouts: dict[Key, tuple[int, int]] = {}
        self.cpu = cpu
        self.in_reduce = in_reduce
        self._moved: list[_Moved] = []
        self._step: tuple[tuple[int, ...], tuple[Key, ...]] = ((), ())
        self.passing = 0
        """The most bytes the arguments' moves of several steps hold beyond their copies as
        the program starts, where XLA makes them one after another (:func:`passing_bytes`)."""
        self._branched: dict[tuple[int, Spec, tuple[int, ...]], int] = {}  # (temps' index)

    def operands(
        self, graph: Graph, step: Step, ins: tuple[Spec, ...], at: int, first: dict[int, int],
        lay: Layouts, mesh: MeshSpec,
    ) -> None:  # fmt: skip
        """The copies ``step`` (at program point ``at``) makes of its operands, read as
        ``ins``: an argument's among :attr:`early`, another's made at the step, or as soon as
        the array is (``first``: by operand position, :mod:`~shardwise._program.remat`). XLA
        partitions a ``cond``'s branch on its own: an argument a branch reads in another
        layout is copied there, at the step, and freed after (seen in the compiled HLO of a
        cond over a replicated ``x``: its slice made in each branch, none before)."""
        temps: list[int] = []
        keys: list[Key] = []
        specs = lay.specs
        made: int | None = _UNSEEN  # (the dot's result bytes: found at its first copy)
        for j, (a, used) in enumerate(zip(step.inputs, ins, strict=False)):
            if used is specs[a] or used.canonical() == specs[a].canonical():
                continue
            if made == _UNSEEN:
                made = _dot_result(graph, step, lay, mesh, self.cpu, self.in_reduce)
            value = graph.values[a]
            copy, relay = read_copy(value, specs[a], used, mesh, self.cpu, made)
            from_start = a in graph.inputs or (  # (a conversion's slice: converted so)
                a in self.starting and local(specs[a], used, len(value.shape), mesh)
            )
            if from_start and not step.branch:  # (a cond's branch copies its own)
                wide = moved_widening(value.dtype, self.cpu)
                passing = passing_bytes(value, specs[a], used, mesh) * wide
                self.passing = max(self.passing, passing)
                key = (a, used.canonical())
                was = self.early.get(key, (0, 0))  # (a dot reads it at its own type, others wide)
                self.early[key] = (max(copy, was[0]), max(at, was[1]))
                if relay:
                    self.relayouts[key] = (relay, min(at, self.relayouts.get(key, (0, at))[1]))
                keys.append(key)
            elif a in graph.inputs and (found := self._branched.get((a, used, step.branch))):
                self.temps.end[found] = at  # (one copy for the branch's readers)
            else:
                if a in graph.inputs:
                    self._branched[(a, used, step.branch)] = len(self.temps.size)
                temps.append(len(self.temps.size))
                copied_back = 0 if step.prim in READS_TRANSPOSED else relay
                self.temps.add(first.get(j, at), at, copy + copied_back)
        self._step = (tuple(temps), tuple(keys))

    def result(self, at: int, output: int, copy: int, block: int) -> None:
        """The copy the step of :meth:`operands` holds of its result (``output``) in the layout
        it makes it in (``copy`` bytes: ``block``, and what moving it holds beyond: an
        all-to-all's pieces, the steps of a move of several collectives,
        :func:`made_copy`)."""
        if copy > 0:
            self._moved.append(_Moved(at, output, *self._step, len(self.temps.size), copy - block))
            self.temps.add(at, at, copy)

    def argument_temps(self) -> dict[Key, tuple[int, ...]]:
        """:attr:`early` and :attr:`relayouts` added to :attr:`temps`: their indices there,
        by (argument, layout)."""
        out: dict[Key, tuple[int, ...]] = {}
        for key, (copy, until) in self.early.items():
            out[key] = (len(self.temps.size),) if copy > 0 else ()
            self.temps.add(0, until, copy)
        for key, (relay, first) in self.relayouts.items():
            if self.early.get(key, (0, -1))[1] >= first:
                out[key] = (*out.get(key, ()), len(self.temps.size))
                self.temps.add(first, first, relay)
        return out

    def one_or_other(
        self, homes: np.ndarray, arguments: dict[Key, tuple[int, ...]],
        results: dict[int, int], points: np.ndarray,
    ) -> None:  # fmt: skip
        """Take from ``points`` what the steps whose results are moved do not hold at once:
        of the copies in the heap (``homes``, :func:`~shardwise._program.bins.placed`: ``-1``),
        the operands' copies freed at the step, or the result's pieces and the result itself
        (``results``: each temporary array's index in :attr:`temps`), the fewer bytes."""
        t = self.temps
        for m in self._moved:
            ops = sum(t.size[k] for k in m.temps if homes[k] < 0)
            ops += sum(
                t.size[k]
                for key in m.keys
                for k in arguments.get(key, ())
                if homes[k] < 0 and t.end[k] == m.at
            )
            moved = m.pieces if homes[m.made] < 0 else 0
            kept = results.get(m.output)
            if kept is not None and homes[kept] < 0 and t.start[kept] <= m.at <= t.end[kept]:
                moved += t.size[kept]
            points[m.at] -= min(ops, moved)


def _dot_result(
    graph: Graph, step: Step, lay: Layouts, mesh: MeshSpec, cpu: bool,
    in_reduce: frozenset[tuple[int, ...]],
) -> int | None:  # fmt: skip
    """The bytes per device of the result of ``step`` where it is a dot that computes (not one
    fused into a reduction, ``in_reduce``), at the type it is made in; else ``None``."""
    found = lay.steps.get(step.key)
    if step.prim != "dot_general" or step.key in in_reduce or found is None:
        return None
    value = graph.values[step.output]
    return shard_bytes(value, found[1], mesh) * widening(value.dtype, cpu)


def read_copy(
    value: Value, held: Spec, used: Spec, mesh: MeshSpec, cpu: bool, made: int | None = None
) -> tuple[int, int]:
    """The bytes of the copy a step reads of ``value`` (held as ``held``) as ``used``, and on
    CPU those of the buffer it is moved into first, freed once copied from: gathered along a
    dimension but the first, the transposed layout it is gathered in
    (:func:`~shardwise._program.moves.relayout_bytes`). A 16-bit float is moved by a
    collective in float32 (:func:`~shardwise._program.upcast.moved_widening`; sliced, it is
    made as :func:`~shardwise._program.upcast.widening` says). A dot that computes it as it
    is (:func:`~shardwise._program.upcast.widening`: bfloat16 with jaxlib 0.12), whose result
    takes ``made`` bytes, reads its copy converted back, and the float32 buffers it is moved
    in (:func:`~shardwise._program.upcast.converted_move`) are that first buffer, freed
    before the dot makes its result: counted beyond it (seen in the compiled HLO with jaxlib
    0.12.1: a bfloat16 weight's ``f32[64,256]`` all-gather, then the ``bf16[64,256]`` the
    dot reads; counted at float32 to the dot, the data × tensor plan of a bfloat16 forward
    pass had been at 0.88x XLA's memory, beside the dot's result at 1.12x)."""
    moved = not local(held, used, len(value.shape), mesh)  # (a slice is made as it is)
    wide = moved_widening(value.dtype, cpu) if moved else widening(value.dtype, cpu)
    kept = widening(value.dtype, cpu) if made is not None else wide
    copy = shard_bytes(value, used, mesh)
    relay = relayout_bytes(value, held, used, mesh) * wide if cpu else 0
    if kept < wide and not relay:
        converted = converted_move(shard_bytes(value, held, mesh), copy, value.dtype, cpu)
        relay = max(0, converted - (made or 0))
    return copy * kept, relay


def made_copy(
    value: Value, made: Spec, kept: Spec, mesh: MeshSpec, cpu: bool, broadcast: bool = False
) -> int:
    """The bytes a step holds of its result ``value`` where it makes it as ``made``, not as it
    is ``kept``: a block, but on CPU two where an all-to-all moves it (the devices' slices of
    it, which the step writes, and the pieces the all-to-all brings, one buffer per device,
    which cannot be the result's buffer; seen in the compiled HLO of an MLP's training step:
    four 32 KiB slices and four 32 KiB pieces of a 128 KiB gradient, all in the heap, where
    one block had put the step at 1.19x); a move of several collectives holds what
    :func:`_moving` says. An operand moved into a step the same way is
    counted as one block: a second there brought the built-in MLP's plans no closer to
    XLA's memory (3.5% off on average either way). A ``broadcast`` that is only sliced to
    the layout it is kept in is made in that layout (XLA broadcasts each device's block: seen
    in the compiled HLO of a weight broadcast along a batch split 8 ways, one eighth of it
    made, where the whole had been counted, 4.4x XLA's memory)."""
    if made is kept or made.canonical() == kept.canonical():
        return 0
    if broadcast and local(made, kept, len(value.shape), mesh):
        return 0
    moves = reshard_moves(made, kept, len(value.shape))
    if cpu and len(moves) > 1:
        return _moving(value, made, moves, mesh) * moved_widening(value.dtype, cpu)
    pieces = 2 if cpu and all_to_all(made, kept, len(value.shape), mesh) else 1
    return pieces * shard_bytes(value, made, mesh) * moved_widening(value.dtype, cpu)


def _moving(value: Value, made: Spec, moves: Sequence[Move], mesh: MeshSpec) -> int:
    """The most bytes a move on CPU of ``value`` from ``made`` through ``moves`` (two or more)
    holds at once beyond its result: each collective's operand with what it makes, before
    the result is (so less the result's block), and the last one's operand beside the result,
    with an all-to-all's pieces, a buffer of their own. Seen in the compiled HLO of a
    convolution made with its batch split on ``(data, model)`` (one block per device) and
    kept with its channels split so: XLA gathers it on ``model`` (4 blocks), then makes the
    all-to-all on ``data`` of that gathered block, whose slices (4 blocks) and pieces (4
    blocks) it holds at once, where one block had put the plan at 1.65x XLA's memory. (Not
    seen on other platforms, which keep :func:`made_copy`'s one block.)"""
    sizes = [shard_bytes(value, made, mesh), *(shard_bytes(value, m.spec, mesh) for m in moves)]
    last = len(moves) - 1
    before = max(sizes[k] + sizes[k + 1] for k in range(last)) - sizes[-1]
    pieces = sizes[-1] if moves[-1].kind == "all-to-all" else 0
    return max(before, sizes[last] + pieces)


def passing_bytes(value: Value, held: Spec, used: Spec, mesh: MeshSpec) -> int:
    """The bytes per device a move of ``value`` from ``held`` to ``used`` holds at once beyond
    its result, where it takes more than one collective (or a collective, then a slice):
    each step's result beside the one it is made from (the held array aside, counted as it
    is). Seen in the compiled HLO of an FSDP plan that reads its batch, held split on
    ``(data, model)``, split on ``model`` alone: XLA gathers it on ``model``, then whole on
    ``data``, then slices it, and holds the whole batch and the first gather at once.

    >>> from shardwise._program.nodes import Value
    >>> v = Value((512, 256), "float32", "x", "")
    >>> mesh = MeshSpec.parse("data=2,model=4")
    >>> passing_bytes(v, Spec.parse("(data,model)"), Spec.parse("model"), mesh)  # 1/4 + whole
    655360
    >>> passing_bytes(v, Spec.parse("(data,model)"), Spec.parse("data"), mesh)  # one gather
    0
    """
    moves = reshard_moves(held, used, len(value.shape))
    if len(moves) < 2:
        return 0
    sizes = [shard_bytes(value, move.spec, mesh) for move in moves]
    most = max(sizes[0], *(a + b for a, b in itertools.pairwise(sizes)))
    return max(0, most - sizes[-1])


UPDATES = frozenset({"dynamic_update_slice", "scatter", "scatter-add"})
"""The ops that write part of their first operand's buffer."""


def copies_argument(graph: Graph, step: Step, read: frozenset[int]) -> bool:
    """Whether an update (:data:`UPDATES`) writes an argument, into a temporary copy of it: XLA
    may not write an argument, so it updates a copy (seen: ``copy(param)`` then the update
    fused into a new buffer), made in the result's buffer where the update is a result that
    no step reads (a KV cache written and returned: no temporary). A scatter-add into zeros
    made on each device writes no argument: its first operand is then the indices."""
    a = step.inputs[0]
    return (
        a in graph.inputs
        and graph.values[a].shape == graph.values[step.output].shape
        and (step.output not in graph.outputs or step.output in read)
    )


def moved_broadcast(graph: Graph, step: Step, lay: Layouts, mesh: MeshSpec) -> bool:
    """Whether the plan makes broadcast ``step``'s result in a layout that a collective moves
    to the one it is kept in: XLA then makes the broadcast in a buffer and moves it, where it
    fuses a broadcast read as it is made, or sliced, into the elementwise ops that read it
    (seen in the compiled HLO of a Haiku MLP's bias split on ``data`` and broadcast along the
    batch split on ``(data, model)``: ``wrapped_broadcast`` and the ``all-to-all``'s pieces
    held before the fusion that adds them, 1.30x the prediction without them)."""
    found = lay.steps.get(step.key)
    if found is None:
        return False
    made, kept = found[1], lay.specs[step.output]
    return not local(made, kept, len(graph.values[step.output].shape), mesh)
