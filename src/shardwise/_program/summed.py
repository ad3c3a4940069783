"""A table kept as the sum of smaller arrays, each over some of its axes, and made a slab at a
time where it is read: what dynamic programming over a variable and two neighbours folds
(its own costs, its two edges' and what comes from outside, :mod:`.marginals`). On a mesh of
three axes such a table has millions of entries, and the min-marginals keep one per variable:
kept as their terms, they take the memory of their edges, not of their products.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import numpy as np

SLAB = 1 << 18
"""The most entries a slab of a :class:`Summed` holds at once (2 MiB of float64), so that a
slab comes from the C library's heap, warm, not from a fresh mapping."""


class Summed:
    """A table of ``shape``: the sum of ``terms``, each an array over some of its axes (in
    order), added first to last, so each entry is the same float as where the whole table is
    made by broadcasting them together.

    >>> u, a = np.arange(2.0), np.arange(6.0).reshape(2, 3)
    >>> t = Summed((2, 3, 4), [(u, (0,)), (a, (0, 1)), (np.ones(4), (2,))])
    >>> whole = u[:, None, None] + a[:, :, None] + np.ones(4)[None, None, :]
    >>> bool((t[1, :, 2] == whole[1, :, 2]).all()), t.min(axis=(1, 2)).tolist(), float(t.min())
    (True, [1.0, 5.0], 1.0)
    """

    def __init__(
        self, shape: tuple[int, ...], terms: Sequence[tuple[np.ndarray, tuple[int, ...]]]
    ) -> None:
        self.shape = shape
        self.terms = tuple(terms)
        self._least: dict[tuple[int, ...], np.ndarray] = {}  # (each min made once)

    @property
    def ndim(self) -> int:
        """How many axes the table has."""
        return len(self.shape)

    def plus(self, term: np.ndarray, axes: tuple[int, ...]) -> Summed:
        """This table with ``term`` (over ``axes``) added last."""
        return Summed(self.shape, (*self.terms, (term, axes)))

    def __getitem__(self, index: tuple[int | slice, ...]) -> np.ndarray:
        """The entries at ``index`` (an int or a slice per axis), made: an int's axis goes."""
        kept = [k for k, i in enumerate(index) if isinstance(i, slice)]
        out: np.ndarray | None = None
        for array, axes in self.terms:
            part = array[tuple(index[k] for k in axes)]
            have = [k for k in axes if k in kept]  # (part's axes, in the table's order)
            part = part.reshape([part.shape[have.index(k)] if k in have else 1 for k in kept])
            out = part if out is None else out + part
        assert out is not None
        return np.broadcast_to(out, self._sliced(index))

    def _sliced(self, index: tuple[int | slice, ...]) -> tuple[int, ...]:
        """The shape of the entries at ``index``."""
        return tuple(len(range(*i.indices(n))) for i, n in zip(index, self.shape, strict=True)
                     if isinstance(i, slice))  # fmt: skip

    def min(self, axis: int | tuple[int, ...] | None = None) -> np.ndarray:
        """The least entry over ``axis`` (``None``: all), as ``np.ndarray.min``, made a slab
        along one axis at a time (a kept one where there is one)."""
        drop = tuple(range(self.ndim)) if axis is None else tuple(np.atleast_1d(axis).tolist())
        if drop not in self._least:
            self._least[drop] = self._min(drop)
        return self._least[drop]

    def _min(self, drop: tuple[int, ...]) -> np.ndarray:
        kept = [k for k in range(self.ndim) if k not in drop]
        parts = [dense.min(axis=drop) for _, dense in self.slabs(kept[0] if kept else 0)]
        if kept:
            return np.concatenate(parts, axis=0)
        return np.asarray(np.min(parts, axis=0))

    def slabs(self, axis: int) -> Iterator[tuple[slice, np.ndarray]]:
        """The table made a slab at a time along ``axis`` (at most :data:`SLAB` entries
        each, but one index along it): each slab's indices along it and its entries."""
        step = max(1, SLAB * self.shape[axis] // max(1, math.prod(self.shape)))
        for start in range(0, self.shape[axis], step):
            at = slice(start, start + step)
            yield at, self[tuple(at if k == axis else slice(None) for k in range(self.ndim))]
