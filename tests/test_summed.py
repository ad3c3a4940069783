"""A table kept as its terms (:class:`~shardwise._program.summed.Summed`) reads as the table
made whole: every entry the same float, every least and every first cheapest choice the same,
whatever the slabs it is read in."""

import itertools

import numpy as np
import pytest

from shardwise._program import eliminate, summed
from shardwise._program.summed import Summed


def _table(seed: int) -> tuple[Summed, np.ndarray]:
    """A variable and two neighbours' table, as elimination folds it, and the same made whole
    (ties among its entries, as layouts that cost the same make)."""
    rng = np.random.default_rng(seed)
    n, a, b = rng.integers(1, 9, size=3)
    u = rng.integers(0, 4, n) * 0.1
    left, right = rng.integers(0, 4, (n, a)) * 0.1, rng.integers(0, 4, (n, b)) * 0.1
    outside = rng.integers(0, 4, (a, b)) * 0.1
    whole = u[:, None, None] + left[:, :, None] + right[:, None, :] + outside[None]
    terms = [(u, (0,)), (left, (0, 1)), (right, (0, 2)), (outside, (1, 2))]
    return Summed((int(n), int(a), int(b)), terms), whole


@pytest.mark.parametrize("slab", [1, 5, 1 << 18])
@pytest.mark.parametrize("seed", range(12))
def test_read_as_the_whole_table(monkeypatch, seed, slab):
    monkeypatch.setattr(summed, "SLAB", slab)
    table, whole = _table(seed)
    assert table.shape == whole.shape and table.ndim == 3
    for drop in [(), *itertools.chain.from_iterable(
            itertools.combinations(range(3), k) for k in (1, 2, 3))]:  # fmt: skip
        np.testing.assert_array_equal(table.min(axis=drop), whole.min(axis=drop))
    assert float(table.min()) == whole.min()
    rng = np.random.default_rng(seed)
    for _ in range(10):
        index = tuple(int(rng.integers(n)) if rng.random() < 0.5 else slice(None)
                      for n in whole.shape)  # fmt: skip
        np.testing.assert_array_equal(table[index], whole[index])
    least = whole.min(axis=0)
    np.testing.assert_array_equal(eliminate._first_best(table, least),
                                  eliminate._first_best(whole, least))  # fmt: skip
