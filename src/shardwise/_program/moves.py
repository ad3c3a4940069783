"""What moving an array between layouts costs the planner: the bytes of one device's block,
a resharding's time and collectives (as :func:`~shardwise._model.reshard.reshard_collectives`
predicts XLA emits them, plus the slice's copy, and on CPUs the copy back after a gather along
a later dimension and the copies around an all-to-all), and the same time alone from a recipe
cached per pair of layouts, for the cost matrices that need it many thousand times.

Pure: no devices.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardwise._caches import cached
from shardwise._model.collective import wire_itemsize
from shardwise._model.cost import PredictedCollective, ring_seconds
from shardwise._model.mesh import MeshSpec
from shardwise._model.profile import Profile
from shardwise._model.reshard import Path, move_path, reshard_collectives
from shardwise._model.spec import Entry, Spec
from shardwise._program.grids import Grid, grid_of
from shardwise._program.nodes import Step, Value

COPY_BYTES = 2
"""Bytes of memory traffic per byte of the block for each copy XLA's CPU backend makes around
an all-to-all (a read and a write): one that cuts the block into one piece per device before
it, where what makes the array cannot do the cutting itself (a program argument, or a dot's
result: ``copy_slice`` fusions), and one that puts the pieces received together after it,
where what reads the array cannot (a dot: a ``copy_bitcast`` fusion). An elementwise op fuses
either (:func:`~shardwise._program.steps.a2a_copies`)."""


@dataclass(frozen=True, slots=True)
class Cost:
    """Seconds, collectives and FLOPs of one choice or one edge (already times its repeats)."""

    seconds: float = 0.0
    collectives: tuple[tuple[PredictedCollective, Step | None], ...] = ()
    flops: float = 0.0


def entry_ways(entry: Sequence[str], mesh: MeshSpec) -> int:
    """How many ways the mesh axes of one spec entry split its dimension."""
    return math.prod(mesh.shape[a] for a in entry)


def shard_bytes(value: Value, spec: Spec, mesh: MeshSpec) -> int:
    """Bytes of one device's block of ``value`` under ``spec``."""
    return _block_bytes(value.shape, value.dtype, spec, mesh)


@cached(maxsize=1 << 16)
def _block_bytes(shape: tuple[int, ...], dtype: str, spec: Spec, mesh: MeshSpec) -> int:
    entries = spec.padded(len(shape))
    blocks = math.prod(n // entry_ways(e, mesh) for n, e in zip(shape, entries, strict=True))
    return blocks * np.dtype(dtype).itemsize


def reshard(
    value: Value,
    src: Spec,
    dst: Spec,
    mesh: MeshSpec,
    profile: Profile,
    step: Step | None,
    repeat: int,
    copies: int = 0,
) -> Cost:
    """What moving ``value`` from ``src`` to ``dst`` costs, where an all-to-all costs
    ``copies`` copies of its block besides the collective on a CPU
    (:func:`~shardwise._program.steps.a2a_copies`)."""
    if src == dst:
        return Cost()
    seconds, found = _reshard(value.shape, value.dtype, src, dst, mesh, profile, copies)
    return Cost(seconds * repeat, tuple((c, step) for c in found))


def reshard_seconds(
    value: Value,
    src: Spec,
    dst: Spec,
    mesh: MeshSpec,
    profile: Profile,
    repeat: int,
    copies: int = 0,
) -> float:
    """:func:`reshard`'s time alone (the cost matrices need nothing else, many thousand
    times)."""
    if src == dst:
        return 0.0
    return _reshard_seconds(value.shape, value.dtype, src, dst, mesh, profile, copies) * repeat


@dataclass(frozen=True, slots=True)
class _Recipe:
    """What a resharding moves, whatever the array's shape: each collective's kind, axis and
    the ways its block is split per dimension; the block a slice writes (``None``: no slice);
    the blocks a CPU copies back after gathering along a later dimension."""

    collectives: tuple[tuple[str, str, tuple[int, ...]], ...]
    sliced: tuple[int, ...] | None
    relayout: tuple[tuple[int, ...], ...]


@cached(maxsize=1 << 18)
def _recipe(src: Spec, dst: Spec, rank: int, mesh: MeshSpec) -> _Recipe:
    sizes = mesh.shape
    found, before = [], src.padded(rank)
    path = move_path(src, dst, rank)
    for kind, axis, after in path:
        if axis is not None and sizes[axis] > 1:
            held = after if kind == "all-gather" else before
            found.append((kind, axis, _entries_ways(held, sizes)))
        before = after
    sliced = _entries_ways(dst.padded(rank), sizes) if set(dst.axes) - set(src.axes) else None
    back = tuple(_entries_ways(e, sizes) for e in _relayouts(src.padded(rank), path))
    return _Recipe(tuple(found), sliced, back)


def _entries_ways(entries: tuple[Entry, ...], sizes: dict[str, int]) -> tuple[int, ...]:
    """The ways each of ``entries`` splits its dimension (``sizes``: the mesh's)."""
    return tuple(math.prod(sizes[a] for a in e) for e in entries)


class _Kept(OrderedDict[tuple[Any, ...], Grid]):
    """The grids kept, least recently used first, and how many pairs they hold; the grids
    being made, each with what its maker sets once it is made (threads price steps at once,
    :mod:`.pricing`: one makes a grid, the others wait for it)."""

    def __init__(self) -> None:
        super().__init__()
        self.pairs = 0
        self.lock = threading.Lock()
        self.making: dict[tuple[Any, ...], threading.Event] = {}


_GRIDS: contextvars.ContextVar[_Kept | None] = contextvars.ContextVar(
    "shardwise_grids", default=None
)


KEPT_PAIRS = 1 << 19
"""The most pairs a grid is priced at once: a larger one is priced a block of rows of that
many pairs at a time (an array of 5,356 layouts on a mesh of four axes beside a dot's 4,096
strategies makes 22 million pairs, which priced whole had run the machine out of memory)."""

HELD_PAIRS = 1 << 23
"""The most pairs of layouts of the grids :func:`grids_kept` keeps (some 45 bytes each, about
380 MB), the most recently used: a training step prices its backward pass's grids after its
forward pass's, and Llama-3 8B's AdamW step on a mesh of four axes prices 53 million pairs,
a third of them again."""


@contextlib.contextmanager
def grids_kept() -> Iterator[None]:
    """Within it, each grid of pairs of layouts is made once, however many arrays it prices
    (a mesh of four axes: 27 grids of 4.3 million pairs, 14 of them distinct), the most
    recently used up to :data:`HELD_PAIRS` pairs; dropped after."""
    grids = _GRIDS.set(_Kept())
    try:
        yield
    finally:
        _GRIDS.reset(grids)


def _grid(srcs: Sequence[Spec], dsts: Sequence[Spec], rank: int, mesh: MeshSpec) -> Grid:
    kept, key = _GRIDS.get(), (tuple(srcs), tuple(dsts), rank, mesh)
    if kept is None:
        return grid_of(srcs, dsts, rank, mesh)
    while True:
        with kept.lock:
            found = kept.get(key)
            if found is not None:
                kept.move_to_end(key)
                return found
            made = kept.making.get(key)
            if made is None:  # (this thread makes it)
                made = kept.making[key] = threading.Event()
                break
        made.wait()  # (then kept, or too large to keep: made here too)
    try:
        found = grid_of(srcs, dsts, rank, mesh)
        with kept.lock:
            if len(found.same) <= HELD_PAIRS:
                kept[key] = found
                kept.pairs += len(found.same)
                while kept.pairs > HELD_PAIRS:
                    kept.pairs -= len(kept.popitem(last=False)[1].same)
    finally:
        with kept.lock:
            del kept.making[key]
        made.set()
    return found


def reshard_grid(
    value: Value,
    srcs: Sequence[Spec],
    dsts: Sequence[Spec],
    mesh: MeshSpec,
    profile: Profile,
    repeat: int,
    copies: int = 0,
) -> np.ndarray:
    """:func:`reshard_seconds` of every pair of ``srcs × dsts``, as a matrix: the same sums in
    the same order, so the same numbers, in NumPy (a mesh of four axes gives an array hundreds
    of layouts, and each step is priced between every two). Where a layout does not divide
    the array evenly, pair by pair."""
    size, shape = math.prod(value.shape), value.shape
    if len(srcs) * len(dsts) > KEPT_PAIRS and len(srcs) > 1:  # (a block of rows at a time)
        n = max(1, KEPT_PAIRS // len(dsts))
        parts = [reshard_grid(value, srcs[k : k + n], dsts, mesh, profile, repeat, copies)
                 for k in range(0, len(srcs), n)]  # fmt: skip
        return np.vstack(parts)
    if not all(divides(shape, spec, mesh) for spec in (*srcs, *dsts)):
        each = [[reshard_seconds(value, a, b, mesh, profile, repeat, copies) for b in dsts]
                for a in srcs]  # fmt: skip
        return np.array(each, dtype=float).reshape(len(srcs), len(dsts))
    g = _grid(srcs, dsts, len(shape), mesh)
    width, wire = np.dtype(value.dtype).itemsize, wire_itemsize(value.dtype, profile.platform)
    ways = g.ways.astype(np.int64)  # (narrow in the grid kept; a block may pass 2**31 bytes)
    blocks = size // ways  # (each layout divides each dimension: :func:`_blocks` alike)
    seconds = np.zeros(g.shape[0] * g.shape[1])
    times = np.zeros(len(g.pair))
    for t, (kind, axis) in enumerate(g.terms):
        mine = g.term == t
        times[mine] = ring_seconds(kind, (axis,), wire * blocks[mine], mesh, profile)
    np.add.at(seconds, g.pair, times)  # (in each pair's order, as Python's sum adds)
    at, ways = g.sliced
    seconds[at] += 2 * (size // ways) * width / profile.memory_Bps
    if profile.platform == "cpu":
        back = np.zeros(len(seconds), dtype=np.int64)
        np.add.at(back, g.relayout[0], size // g.relayout[1] * width)
        seconds += 2 * back / profile.memory_Bps
        moved = np.zeros(len(seconds), dtype=np.int64)
        a2a = np.array([kind == "all-to-all" for kind, _ in g.terms], dtype=bool)[g.term]
        np.add.at(moved, g.pair[a2a], blocks[a2a])
        seconds += copies * COPY_BYTES * moved * wire / profile.memory_Bps
    seconds[g.same] = 0.0
    return np.asarray((seconds * repeat).reshape(g.shape))


def in_turn(terms: Iterable[float]) -> float:
    """``terms`` added one after another, as NumPy's ``add.at`` adds each pair's in
    :func:`reshard_grid`: Python's ``sum`` compensates the rounding of floats from 3.12 on,
    which differs from that in the last bit (and plans tied to the bit would break alike no
    more).

    >>> in_turn([0.1, 0.2, 0.3]) == (0.1 + 0.2) + 0.3
    True
    """
    total = 0.0
    for term in terms:
        total += term
    return total


def divides(shape: Sequence[int], spec: Spec, mesh: MeshSpec) -> bool:
    """Whether ``spec`` splits each dimension of ``shape`` evenly."""
    return all(
        n % entry_ways(e, mesh) == 0 for n, e in zip(shape, spec.padded(len(shape)), strict=False)
    )


def all_to_all(src: Spec, dst: Spec, rank: int, mesh: MeshSpec) -> bool:
    """Whether moving an array of ``rank`` dimensions from ``src`` to ``dst`` takes an
    all-to-all."""
    return any(kind == "all-to-all" for kind, _, _ in _recipe(src, dst, rank, mesh).collectives)


def local(src: Spec, dst: Spec, rank: int, mesh: MeshSpec, pieces: bool = False) -> bool:
    """Whether moving an array of ``rank`` dimensions from ``src`` to ``dst`` is a slice on
    each device, with no collective (``pieces``: or first an all-to-all, which sends slices
    of each device's block)."""
    found = _recipe(src, dst, rank, mesh).collectives
    return not found or (pieces and found[0][0] == "all-to-all")


def _blocks(shape: tuple[int, ...], ways: tuple[int, ...]) -> int:
    return math.prod(n // w for n, w in zip(shape, ways, strict=True))


@cached(maxsize=1 << 19)
def _reshard_seconds(
    shape: tuple[int, ...],
    dtype: str,
    src: Spec,
    dst: Spec,
    mesh: MeshSpec,
    profile: Profile,
    copies: int,
) -> float:
    """:func:`_reshard`'s seconds from the shape-free :func:`_recipe` (the same sums in the
    same order, so the same number)."""
    r = _recipe(src, dst, len(shape), mesh)
    width, wire = np.dtype(dtype).itemsize, wire_itemsize(dtype, profile.platform)
    seconds = in_turn(
        ring_seconds(kind, (axis,), wire * _blocks(shape, ways), mesh, profile)
        for kind, axis, ways in r.collectives
    )
    if r.sliced is not None:
        seconds += 2 * _blocks(shape, r.sliced) * width / profile.memory_Bps
    if profile.platform == "cpu":
        seconds += 2 * sum(_blocks(shape, w) * width for w in r.relayout) / profile.memory_Bps
        moved = sum(_blocks(shape, w) for kind, _, w in r.collectives if kind == "all-to-all")
        seconds += copies * COPY_BYTES * moved * wire / profile.memory_Bps
    return seconds


@cached(maxsize=1 << 16)
def _reshard(
    shape: tuple[int, ...],
    dtype: str,
    src: Spec,
    dst: Spec,
    mesh: MeshSpec,
    profile: Profile,
    copies: int,
) -> tuple[float, tuple[PredictedCollective, ...]]:
    found = reshard_collectives(src, dst, shape, dtype, mesh, profile)
    seconds = in_turn(c.seconds for c in found)
    value = Value(shape, dtype, "")
    if set(dst.axes) - set(src.axes):
        # slicing on an axis is local, but XLA copies each device's new block out of the
        # array it holds (a dynamic-slice): it reads and writes that block
        seconds += 2 * shard_bytes(value, dst, mesh) / profile.memory_Bps
    if profile.platform == "cpu":
        # ... and the CPU's gathers along a dimension but the first copy their result back
        seconds += 2 * relayout_bytes(value, src, dst, mesh) / profile.memory_Bps
        # ... and the copies around its all-to-alls that no neighbouring op does
        moved = sum(c.bytes for c in found if c.kind == "all-to-all")
        seconds += copies * COPY_BYTES * moved / profile.memory_Bps
    return seconds, found


def relayout_bytes(value: Value, src: Spec, dst: Spec, mesh: MeshSpec) -> int:
    """Bytes of the copies XLA's CPU backend makes when it moves ``value`` from ``src`` to
    ``dst``: it gathers along the first dimension, so a gather along another one leaves its
    result in a transposed layout that is copied back (seen in its buffer assignment)."""
    rank = len(value.shape)
    path = move_path(src, dst, rank)
    return sum(shard_bytes(value, Spec(e), mesh) for e in _relayouts(src.padded(rank), path))


def _relayouts(src: tuple[Entry, ...], path: Path) -> list[tuple[Entry, ...]]:
    """The layouts after each gather along a dimension but the first: the CPU backend copies
    them back, once for gathers one after another along the same dimension, which it makes
    in the same transposed layout (seen in the compiled HLO: an ``f32[16,8,8,4]`` then an
    ``f32[16,8,8,8]`` gather along the last dimension, both with the layout ``{2,1,0,3}``,
    and one copy)."""
    out: list[tuple[int, tuple[Entry, ...]]] = []
    before = src
    for kind, _, after in path:
        if kind == "all-gather":
            grown = [d for d in range(len(src)) if len(after[d]) < len(before[d])]
            if grown and grown[0] > 0:
                if out and out[-1][0] == grown[0]:
                    out.pop()
                out.append((grown[0], after))
        before = after
    return [entries for _, entries in out]
