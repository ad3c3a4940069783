"""Dynamic programming past two neighbours: where folding variables into one or two neighbours
leaves cycles (the training step of a chain of layers, each weight read by the forward pass,
the backward pass and its update, is a ladder), each variable left is folded into all its
neighbours at once while the tables stay small, exactly, against brute force; past the
tables' limits the integer program solves what is left, as before."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import alike_layers, brute_force
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


def _made_anew(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every table of :func:`eliminate_wide` made, none taken from one alike."""
    monkeypatch.setattr(eliminate, "_alike", lambda problem, order: list(range(len(order))))


@pytest.mark.parametrize("seed", range(4))
def test_tables_alike_are_made_once_and_are_what_making_each_gives(monkeypatch, seed):
    """The layers of a stack that do not fold (each joined to the next through variables of
    its own) make the same tables: each is made once, and every step (each variable's best
    choice for each of its neighbours') is what making each table anew gives."""
    problem = alike_layers(seed, 8, alike=True)
    order = eliminate._wide_order(problem)
    assert order is not None
    alike = eliminate._alike(problem, order)
    assert alike is not None and len(set(alike)) < len(order) - 5  # (the layers' own)
    tables: list[np.ndarray] = []
    steps = eliminate_wide(problem, tables)
    _made_anew(monkeypatch)
    fresh: list[np.ndarray] = []
    anew = eliminate_wide(problem, fresh)
    assert steps is not None and anew is not None and len(steps) == len(anew)
    for (v, near, best), (u, around, again) in zip(steps, anew, strict=True):
        assert (v, near) == (u, around)
        np.testing.assert_array_equal(best, again)
    for table, again in zip(tables, fresh, strict=True):
        np.testing.assert_array_equal(table, again)


@pytest.mark.parametrize("alike", [True, False])
def test_layers_alike_or_not_are_solved_exactly(alike):
    problem = alike_layers(5, 2, alike)
    found = solve(problem)
    assert found is not None and found.optimal
    assert found.seconds == pytest.approx(brute_force(problem)[1], rel=1e-12)


def test_the_work_limit_counts_each_table_made_once(monkeypatch):
    """Tables alike count once against :data:`~shardwise._program.eliminate.WIDE_WORK`:
    layers whose tables take more than it in all are solved so while the tables made fit."""
    problem = alike_layers(0, 8, alike=True)
    order = eliminate._wide_order(problem)
    alike = eliminate._alike(problem, order) if order is not None else None
    assert order is not None and alike is not None
    each = {k: int(np.prod([len(problem.choices[a]) for a in (v, *near)]))
            for (v, near), k in zip(order, alike, strict=True)}  # fmt: skip
    made = sum(each.values())
    every = sum(each[k] for k in alike)
    assert made < every
    monkeypatch.setattr(eliminate, "WIDE_WORK", made)
    assert eliminate_wide(problem) is not None
    monkeypatch.setattr(eliminate, "WIDE_WORK", made - 1)
    tables: list[np.ndarray] = []
    assert eliminate_wide(problem, tables) is None and tables == []


def test_a_cost_alike_read_the_other_way_round_makes_another_table(monkeypatch):
    """Two pairs of variables joined by the same matrix, the second pair's edge stored from
    the other end: the tables that fold their first variables are not alike (the matrix is
    read transposed)."""
    rng = np.random.default_rng(0)
    m, ux, uy = rng.random((3, 3)), rng.random(3), rng.random(3)
    problem = Problem.of([range(3)] * 4, [ux, uy, ux, uy], {(0, 1): m, (3, 2): m})
    order = eliminate._wide_order(problem)
    assert order is not None and [v for v, _ in order][:1] == [0] and (2, (3,)) in order
    steps = eliminate_wide(problem)
    _made_anew(monkeypatch)
    anew = eliminate_wide(problem)
    assert steps is not None and anew is not None
    for (_, _, best), (_, _, again) in zip(steps, anew, strict=True):
        np.testing.assert_array_equal(best, again)
