"""Dynamic programming past two neighbours: where folding variables into one or two neighbours
leaves cycles (the training step of a chain of layers, each weight read by the forward pass,
the backward pass and its update, is a ladder), each variable left is folded into all its
neighbours at once while the tables stay small, exactly, against brute force; past the
tables' limits the integer program solves what is left, as before."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import brute_force
from shardwise._program import eliminate
from shardwise._program.eliminate import eliminate_wide
from shardwise._program.integer import Constraint
from shardwise._program.problem import Problem
from shardwise._program.search import WIDE, solve


def _cyclic(seed: int) -> Problem:
    """Four variables all joined (each has three neighbours: folding into two leaves them),
    and a few more joined at random; some with one choice, costs rounded so ties happen."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(4, 8))
    sizes = [int(rng.integers(2, 4)) for _ in range(4)]
    sizes += [int(rng.integers(1, 4)) for _ in range(n - 4)]
    edges = {
        (u, v): rng.random((sizes[u], sizes[v])).round(2)
        for u in range(n)
        for v in range(u + 1, n)
        if v < 4 or rng.random() < 0.4
    }
    unary = [rng.random(k).round(2) for k in sizes]
    return Problem.of([list(range(k)) for k in sizes], unary, edges)


@pytest.mark.parametrize("seed", range(40))
def test_cycles_are_solved_exactly_by_folding_into_every_neighbour(seed):
    problem = _cyclic(seed)
    assert eliminate.eliminate(problem, set())[0].labels  # (two neighbours are not enough)
    found = solve(problem)
    assert found is not None and found.optimal and found.method == WIDE
    assert found.seconds == pytest.approx(brute_force(problem)[1], rel=1e-12)


@pytest.mark.parametrize("limit", ["WIDE_TABLE", "WIDE_WORK"])
def test_past_the_tables_limits_the_integer_program_solves_what_is_left(monkeypatch, limit):
    problem = _cyclic(0)
    monkeypatch.setattr(eliminate, limit, 4)
    tables: list[np.ndarray] = []
    assert eliminate_wide(problem, tables) is None and tables == []  # (checked before any)
    found = solve(problem)
    assert found is not None and found.optimal and "integer program" in found.method
    assert found.seconds == pytest.approx(brute_force(problem)[1], rel=1e-12)


def test_each_table_is_what_folding_the_variable_costs_given_its_neighbours():
    """The tables, as :func:`~shardwise._program.eliminate.eliminate`'s: axes the variable,
    then its neighbours then; a variable folded last in its part of the problem (no
    neighbours left) holds that part's cheapest cost at each of its choices, so their
    least costs add up to the optimum."""
    for seed in range(10):
        problem = _cyclic(seed)
        tables: list[np.ndarray] = []
        steps = eliminate_wide(problem, tables)
        assert steps is not None and len(steps) == len(tables) == len(problem.labels)
        for (v, near, _), table in zip(steps, tables, strict=True):
            assert table.shape == tuple(len(problem.choices[u]) for u in (v, *near))
        last = sum(float(t.min()) for (_, near, _), t in zip(steps, tables, strict=True)
                   if not near)  # fmt: skip
        assert last == pytest.approx(brute_force(problem)[1], rel=1e-12)


def test_rows_and_excluded_plans_are_left_to_the_integer_program():
    """A budget's rows and the plans a runner-up's search excludes are the integer
    program's, even a row that names no variable of the problem."""
    problem = _cyclic(1)
    best, cheapest = brute_force(problem)
    found = solve(problem, [Constraint((), 1.0)])
    assert found is not None and "integer program" in found.method
    assert found.seconds == pytest.approx(cheapest, rel=1e-12)
    found = solve(problem, exclude=[dict(enumerate(best))])
    assert found is not None and "integer program" in found.method and found.choice != best
