"""The temporaries that XLA keeps in a result's buffer before the result is made.

XLA's buffer assignment gives each result of the program a buffer of its own
(``memory_analysis`` counts them in full, as :mod:`.memory` holds them from the program's
start) and then places the other arrays, the largest first, each into the smallest such
buffer that is big enough and that nothing uses while the array is alive, before any array
goes to the heap of temporaries; only what finds no room there is counted in the heap (seen
in XLA's buffer assignment of a training step: the gathers, partial sums and weight
gradients in the new weights' buffers, the activations in the heap). A result's buffer is in
use from the first array made in it (:func:`~shardwise._program.buffers.in_place`: a
gradient updated in place) to the end.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import numpy as np


class Temps:
    """Temporaries, each held from program point ``start`` to ``end`` (inclusive) with its
    bytes per device."""

    def __init__(self) -> None:
        self.start: list[int] = []
        self.end: list[int] = []
        self.size: list[int] = []

    def add(self, start: int, end: int, size: int) -> None:
        """A temporary of ``size`` bytes held from ``start`` to ``end``."""
        if size > 0 and start <= end:
            self.start.append(int(start))
            self.end.append(int(end))
            self.size.append(int(size))

    def extend(self, start: np.ndarray, end: np.ndarray, size: np.ndarray) -> None:
        """:meth:`add` each of these temporaries, in order, at once."""
        keep = (size > 0) & (start <= end)
        self.start += start[keep].tolist()
        self.end += end[keep].tolist()
        self.size += size[keep].tolist()

    def onto(self, points: np.ndarray, homes: np.ndarray) -> None:
        """Add the temporaries in the heap (``homes``, :func:`placed`: ``-1``) to ``points``."""
        if not self.size:
            return
        keep = homes < 0
        start, end = np.asarray(self.start)[keep], np.asarray(self.end)[keep]
        points += totals(start, end, np.asarray(self.size, np.int64)[keep], len(points))


def totals(first: np.ndarray, last: np.ndarray, sizes: np.ndarray, points: int) -> np.ndarray:
    """The sum of ``sizes`` held at each of ``points`` program points, each from ``first`` to
    ``last`` (inclusive; every ``first <= last``).

    >>> totals(np.array([0, 1]), np.array([1, 2]), np.array([3, 4]), 4).tolist()
    [3, 7, 4, 0]
    """
    change = np.zeros(points + 1, dtype=sizes.dtype)
    np.add.at(change, first, sizes)
    np.add.at(change, last + 1, -sizes)
    return np.asarray(np.cumsum(change[:-1]))


def placed(
    temps: Temps, buffers: Sequence[tuple[int, int]], loops: Sequence[tuple[int, int]] = ()
) -> np.ndarray:
    """The result's buffer XLA puts each temporary in (its index in ``buffers``; ``-1``: in
    the heap): ``buffers`` are (bytes, the first point it is in use), one per result. The
    temporaries, largest first (then the earliest),
    each go to the smallest buffer big enough that is free over their whole life: before the
    buffer is in use and apart from the temporaries already in it (one at a time, each at the
    buffer's start, as XLA places them). A temporary alive while a loop runs (``loops``:
    each one's first and last program point) stays in the heap.

    >>> t = Temps()
    >>> for start, end, size in [(0, 2, 4), (1, 3, 4), (3, 4, 2), (5, 6, 2)]:
    ...     t.add(start, end, size)
    >>> placed(t, [(4, 5)]).tolist()  # (the second overlaps the first; the last, the result)
    [0, -1, 0, -1]
    """
    out = np.full(len(temps.size), -1, dtype=np.int64)
    if not buffers or not temps.size:
        return out
    # XLA makes the results' buffers in the order it places arrays (largest first) and tries
    # the last made first: the smallest, and of equal sizes the latest
    order = sorted(range(len(buffers)), key=lambda b: (buffers[b][0], -buffers[b][1]))
    sizes = [buffers[b][0] for b in order]
    until = [buffers[b][1] for b in order]
    # the points at which each buffer holds a temporary, as the bits of an integer (each
    # temporary is held over program points 0 <= start <= end: :meth:`Temps.add` keeps no other)
    used = [0] * len(order)
    starts, ends, needs = temps.start, temps.end, temps.size
    for t in sorted(range(len(needs)), key=lambda t: (-needs[t], starts[t])):
        start, end = starts[t], ends[t]
        if any(start <= last and first <= end for first, last in loops):
            continue
        life = ((1 << (end - start + 1)) - 1) << start
        for b in range(bisect.bisect_left(sizes, needs[t]), len(sizes)):
            if end < until[b] and not used[b] & life:
                used[b] |= life
                out[t] = order[b]
                break
    return out
