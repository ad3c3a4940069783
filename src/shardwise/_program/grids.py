"""What moves an array between each pair of a grid of layouts, for every pair at once in
NumPy: each collective's kind, axis and block, the slice and the CPU's copies back, as
:func:`~shardwise._model.reshard.move_path` finds them one pair at a time.

A mesh of four axes gives an array hundreds or thousands of layouts, and a step is priced
between every two: millions of pairs a step, which one at a time in Python had taken minutes
(Llama-3 8B's training step on ``data=2,fsdp=2,sequence=2,tensor=4``). Here every pair of a
grid takes the same moves in the same order, round by round as :func:`move_path` takes them,
each round over every pair still moving.

Pure: no devices.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardwise._model.mesh import MeshSpec
from shardwise._model.spec import Spec

KINDS = ("all-gather", "all-to-all")
"""The collectives a move makes, by their index in :attr:`Grid.term`'s codes (an all-to-all:
1, as its flag)."""


@dataclass(frozen=True, slots=True)
class Grid:
    """What moves each pair of a grid of layouts (``rows × cols`` pairs, row-major),
    flattened for NumPy: each collective (in each pair's order) with its pair, its kind and
    axis (an index into ``terms``) and the ways its block splits the array (in narrow
    integers: a grid is kept, and there are millions); each slice and
    each CPU copy back, with its pair and ways; and which pairs move nothing (the same spec)."""

    shape: tuple[int, int]
    same: np.ndarray
    pair: np.ndarray
    term: np.ndarray
    ways: np.ndarray
    terms: tuple[tuple[str, str], ...]
    sliced: tuple[np.ndarray, np.ndarray]
    relayout: tuple[np.ndarray, np.ndarray]


BITS = 4
"""Bits an axis takes in a dimension's code: each dimension's axes are one integer, the
first axis (its index in the mesh, plus one) in the lowest bits; a prefix is a mask."""


@dataclass(frozen=True, slots=True)
class _Layouts:
    """Layouts of ``rank`` dimensions as arrays: each dimension's axes as one code
    (:data:`BITS`) and how many; each mesh axis's dimension and place there (``-1``: it
    splits none)."""

    code: np.ndarray  # (layouts, rank)
    count: np.ndarray  # (layouts, rank)
    dim: np.ndarray  # (layouts, mesh axes)
    place: np.ndarray  # (layouts, mesh axes)


def _encoded(specs: Sequence[Spec], rank: int, names: tuple[str, ...]) -> _Layouts:
    index = {a: k for k, a in enumerate(names)}
    n = len(specs)
    code, count = np.zeros((n, rank), dtype=np.int64), np.zeros((n, rank), dtype=np.int64)
    dim = np.full((n, max(1, len(names))), -1, dtype=np.int64)
    place = np.full((n, max(1, len(names))), -1, dtype=np.int64)
    for s, spec in enumerate(specs):
        for d, entry in enumerate(spec.padded(rank)):
            count[s, d] = len(entry)
            for p, a in enumerate(entry):
                code[s, d] |= (index[a] + 1) << (BITS * p)
                dim[s, index[a]], place[s, index[a]] = d, p
    return _Layouts(code, count, dim, place)


def grid_of(srcs: Sequence[Spec], dsts: Sequence[Spec], rank: int, mesh: MeshSpec) -> Grid:
    """What moves an array of ``rank`` dimensions from each of ``srcs`` to each of ``dsts``.

    >>> m = MeshSpec.parse("x=2,y=4")
    >>> specs = [Spec.parse("x,y"), Spec.parse("x")], [Spec.parse("y,x"), Spec.parse("x")]
    >>> g = grid_of(*specs, 2, m)
    >>> for p, t, w in sorted(zip(g.pair.tolist(), g.term.tolist(), g.ways.tolist())):
    ...     print(p, *g.terms[t], w)
    0 all-gather x 4
    0 all-to-all y 4
    1 all-gather y 2
    2 all-to-all x 2
    >>> [int(p) for p in g.sliced[0]], g.same.tolist()
    ([2], [False, False, False, True])
    """
    names = mesh.names
    sizes = np.array([mesh.shape[a] for a in names] or [1], dtype=np.int64)
    src, dst = _encoded(srcs, rank, names), _encoded(dsts, rank, names)
    int_ = np.int32 if BITS * len(names) < 31 else np.int64
    masks = ((1 << (BITS * np.arange(len(names) + 1, dtype=np.int64))) - 1).astype(int_)
    index = _index(len(srcs) * len(dsts))
    rows, cols = np.divmod(np.arange(len(srcs) * len(dsts), dtype=index), len(dsts))
    split = np.where(src.dim >= 0, sizes[: len(names)], 1).prod(axis=1)  # (the ways in all)
    split = split.astype(np.int32)
    # each pair still moving: its index in the grid, its dimensions' axes and their counts (a
    # row a dimension), its target, the ways it splits the array, and its last gather along a
    # later dimension (the dimension, and that move's index among them)
    code_of = dst.code.T.astype(int_)
    dim_of, place_of = dst.dim.T.astype(int_), dst.place.T.astype(int_)
    at = np.arange(len(rows), dtype=index)
    state = [src.code.T.astype(int_)[:, rows], src.count.T.astype(int_)[:, rows],
             split[None, rows], cols[None, :],
             np.full((2, len(rows)), -1, dtype=index)]  # fmt: skip
    found: list[tuple[np.ndarray, ...]] = []  # (pair, kind, axis, ways) of each move
    backs: list[tuple[np.ndarray, ...]] = []  # (pair, ways) of each gather along a later one
    dropped: list[np.ndarray] = []  # (those followed by another along the same dimension)
    made = 0
    while at.size:
        code, count, (ways,), (col,), back = state
        changed = np.zeros(len(at), dtype=bool)
        for d in range(rank):
            k = np.flatnonzero((code_of[d][col] & masks[count[d]]) != code[d])
            if not k.size:  # (each keeps its axes there as a prefix of the target's)
                continue
            last = count[d, k] - 1
            axis = ((code[d, k] >> (BITS * last)) & ((1 << BITS) - 1)) - 1
            code[d, k] &= masks[last]
            count[d, k] = last
            size = sizes[axis]
            ck = col[k]
            to, there = dim_of[axis, ck], place_of[axis, ck]
            onto = np.where((to >= 0) & (to != d), to, 0)  # (the dimension that takes it next)
            a2a = (to >= 0) & (to != d) & (count[onto, k] == there)
            a2a &= code[onto, k] == (code_of[onto, ck] & masks[np.maximum(there, 0)])
            moved, into = k[a2a], onto[a2a]
            code[into, moved] |= (axis[a2a] + 1) << (BITS * there[a2a])
            count[into, moved] += 1
            ways[k] //= np.where(a2a, 1, size)  # (an all-to-all keeps its block)
            block = ways[k]
            real = size > 1
            found.append((at[k[real]], a2a[real], axis[real], block[real]))
            if d > 0:
                g = k[~a2a]
                again = back[0, g] == d
                dropped.append(back[1, g[again]])
                back[0, g], back[1, g] = d, made + np.arange(len(g))
                made += len(g)
                backs.append((at[g], block[~a2a]))
            changed[k] = True
        keep = np.flatnonzero(changed)
        at, state = at[keep], [a[:, keep] for a in state]
    return _grid((src, dst), (rows, cols), (names, sizes), found, (backs, dropped))


def _grid(
    layouts: tuple[_Layouts, _Layouts], pairs: tuple[np.ndarray, np.ndarray],
    axes: tuple[tuple[str, ...], np.ndarray], found: list[tuple[np.ndarray, ...]],
    gathers: tuple[list[tuple[np.ndarray, ...]], list[np.ndarray]],
) -> Grid:  # fmt: skip
    """The :class:`Grid` of the moves ``found`` (each pair's in the order made) and the
    ``gathers`` along a later dimension, less those dropped: a CPU copies back once for
    gathers one after another along the same dimension
    (:func:`~shardwise._program.moves.relayout_bytes`)."""
    src, dst = layouts
    rows, cols = pairs
    names, sizes = axes
    many = max(1, len(names))
    narrow = (_index(len(rows)), np.int32, np.int32, np.int32)  # (a grid is kept: millions)
    pair, kind, axis, ways = (_joined([f[k] for f in found], t)
                              for k, t in enumerate(narrow))  # fmt: skip
    code = kind * many + axis
    used = np.flatnonzero(np.bincount(code, minlength=2 * many))
    index = np.zeros(2 * many, dtype=np.int8)
    index[used] = np.arange(len(used))
    terms = tuple((KINDS[c // many], names[c % many]) for c in used)
    backs, dropped = gathers
    copied, blocks = (np.concatenate([b[k] for b in backs]) if backs else
                      np.zeros(0, dtype=np.int64) for k in range(2))  # fmt: skip
    last = np.ones(len(copied), dtype=bool)  # (not followed by one along the same dimension)
    if dropped:
        last[np.concatenate(dropped)] = False
    # (two layouts are the same where their codes are: the same axes, in order, on each)
    _, ids = np.unique(np.vstack([src.code, dst.code]), axis=0, return_inverse=True)
    sid, did = ids.reshape(-1)[: len(src.code)], ids.reshape(-1)[len(src.code) :]
    bits = 1 << np.arange(len(names), dtype=np.int64)
    src_axes = ((src.dim >= 0) * bits).sum(axis=1)
    on = dst.dim >= 0
    dst_axes = (on * bits).sum(axis=1)
    dst_ways = np.where(on, sizes[: len(names)], 1).prod(axis=1)
    cut = np.nonzero((dst_axes[cols] & ~src_axes[rows]) != 0)[0]
    return Grid(
        (len(src.code), len(dst.code)), sid[rows] == did[cols], pair, index[code], ways, terms,
        (cut, dst_ways[cols[cut]]), (copied[last], blocks[last].astype(np.int64)),
    )  # fmt: skip


def _joined(parts: list[np.ndarray], dtype: type[np.signedinteger[Any]]) -> np.ndarray:
    """``parts`` joined, as ``dtype``."""
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)


def _index(pairs: int) -> type[np.signedinteger[Any]]:
    """The narrower integer that indexes ``pairs`` pairs: grids are kept
    (:func:`~shardwise._program.moves.grids_kept`), some 45 bytes a pair so, 87 in 64-bit
    integers."""
    return np.int32 if pairs < 2**31 else np.int64
