"""The integer program's linear relaxation goes to HiGHS as arrays, or, where highspy has no
such form, as a ``HighsLp``: the same optimum either way, the brute-force one."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from helpers import brute_force
from shardwise._program import integer
from shardwise._program.problem import Problem, total


class _OnlyLp(integer._Highs):  # type: ignore[misc,name-defined]
    """A highspy whose ``passModel`` takes a model object only (``models``: how many)."""

    models = 0

    def passModel(self, *args):  # type: ignore[no-untyped-def]
        if len(args) != 1:
            raise TypeError("passModel(): incompatible function arguments")
        _OnlyLp.models += 1
        return super().passModel(*args)


def _problem(seed: int) -> Problem:
    """Four variables of up to four choices, every two joined (a cycle: no elimination)."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(2, 5, size=4).tolist()
    unary = [rng.uniform(0, 1, k).round(2) for k in sizes]
    edges = {(u, v): rng.uniform(0, 1, (sizes[u], sizes[v])).round(2)
             for u, v in itertools.combinations(range(4), 2)}  # fmt: skip
    return Problem.of([list(range(k)) for k in sizes], unary, edges)


@pytest.mark.parametrize("seed", range(8))
def test_the_relaxation_passed_either_way_is_the_same(monkeypatch, seed):
    problem = _problem(seed)
    seen = []
    real = integer._relaxation
    monkeypatch.setattr(integer, "_relaxation", lambda *a: seen.append(a) or real(*a))
    found = integer.milp(problem, (), (), 10.0)
    assert found is not None
    assert total(problem, found[0]) == pytest.approx(brute_force(problem)[1])
    (given,) = seen
    arrays = real(*given)
    monkeypatch.setattr(integer, "_Highs", _OnlyLp)
    monkeypatch.setattr(_OnlyLp, "models", 0)
    lp = real(*given)
    assert _OnlyLp.models == 1
    assert arrays is not None and lp is not None
    np.testing.assert_allclose(arrays, lp, atol=1e-9)
