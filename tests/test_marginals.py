"""The runners-up where dynamic programming solves a problem: every variable's min-marginal
from one pass over the elimination's cliques, each plan read from them, against brute force
and against solving the problem again with each input held at each choice."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from helpers import brute_force
from shardwise._program import eliminate as elimination
from shardwise._program import summed
from shardwise._program.eliminate import eliminate
from shardwise._program.marginals import marginals
from shardwise._program.problem import Problem, total
from shardwise._program.search import solve
from shardwise._program.top import runners_up


def _series_parallel(seed: int) -> Problem:
    """A random tree with some triangles (each variable joined to its parent and, at times,
    its grandparent): dynamic programming solves it alone. Some variables have one choice (a
    pinned input), costs are rounded so that ties happen."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 9))
    sizes = [int(rng.integers(1, 5)) for _ in range(n)]
    edges, parent = {}, {}
    for v in range(1, n):
        parent[v] = int(rng.integers(0, v))
        edges[(parent[v], v)] = rng.random((sizes[parent[v]], sizes[v])).round(2)
        g = parent.get(parent[v])
        if g is not None and rng.random() < 0.5:
            edges[(g, v)] = rng.random((sizes[g], sizes[v])).round(2)
    unary = [rng.random(k).round(2) for k in sizes]
    return Problem.of([list(range(k)) for k in sizes], unary, edges)


@pytest.fixture(params=["whole", "slabs"])
def table_kind(request, monkeypatch):  # type: ignore[no-untyped-def]
    """Elimination's tables of a variable and two neighbours made whole, or kept as their
    terms and read a slab of one index at a time, as a large one is."""
    if request.param == "slabs":
        monkeypatch.setattr(elimination, "SLAB", 0)
        monkeypatch.setattr(summed, "SLAB", 1)


@pytest.mark.parametrize("seed", range(60))
def test_min_marginals_are_the_best_cost_with_each_choice_held(seed, table_kind):
    problem = _series_parallel(seed)
    best = solve(problem)
    assert best is not None and best.method == "dynamic programming"
    found = marginals(problem, best.choice, best.seconds)
    assert found is not None
    every = list(itertools.product(*(range(len(c)) for c in problem.choices)))
    for v, options in enumerate(problem.choices):
        for c in range(len(options)):
            cheapest = min(total(problem, x) for x in every if x[v] == c)
            assert found.best(v)[c] == pytest.approx(cheapest, rel=1e-7)
            held = found.held(v, c)
            assert held[v] == c
            assert total(problem, held) == pytest.approx(cheapest, rel=1e-7)


def _solved_again(problem: Problem, inputs: list[int], best, count: int):  # type: ignore[no-untyped-def]
    """The runners-up as they were found before the min-marginals: one solve per input held at
    each other choice."""
    seen = {tuple(best.choice[v] for v in inputs)}
    out = []
    for v in inputs:
        alternatives = []
        for c in range(len(problem.choices[v])):
            if c == best.choice[v]:
                continue
            choice = list(solve(problem.restrict({v: [c]})).choice)
            choice[v] = c
            key = tuple(choice[u] for u in inputs)
            if key not in seen:
                seen.add(key)
                alternatives.append(total(problem, choice))
        out += [(rank, s) for rank, s in enumerate(sorted(alternatives))]
    return [s for _, s in sorted(out)[:count]]


@pytest.mark.parametrize("seed", range(60))
def test_runners_up_cost_what_solving_again_per_choice_finds(seed, table_kind):
    """Each input's best alternative, as the one solve per held choice found it; where plans
    tie, the min-marginals may find more distinct ones (never fewer, never dearer)."""
    problem = _series_parallel(seed)
    best = solve(problem)
    assert best is not None
    rng = np.random.default_rng(seed)
    n = len(problem.choices)
    inputs = sorted(rng.choice(n, size=min(n, 3), replace=False).tolist())
    found = runners_up(problem, inputs, best, 4, 10.0)
    before = _solved_again(problem, inputs, best, 4)
    assert len(found) >= len(before)
    for sol, seconds in zip(found, before, strict=False):
        assert sol.seconds == pytest.approx(seconds, rel=1e-9, abs=1e-12)
    keys = [tuple(s.choice[v] for v in inputs) for s in found]
    assert len(set(keys)) == len(keys) and tuple(best.choice[v] for v in inputs) not in keys
    assert brute_force(problem)[1] == pytest.approx(best.seconds)


def test_runners_up_that_cost_the_same_come_in_input_order_and_change_least():
    """A chain of identical layers: changing the first input or the last costs the same (one
    layer pays to change layouts); the first comes first. The second input's best alternative
    changes the first too, and nothing else."""
    layer = np.array([[0.0, 1.0], [1.0, 0.0]])  # a layer keeps its input's layout, or pays
    n = 6
    unary = [np.array([0.0, 0.5]) for _ in range(n)]
    problem = Problem.of([[0, 1]] * n, unary, {(v, v + 1): layer for v in range(n - 1)})
    best = solve(problem)
    assert best is not None and best.choice == (0,) * n
    found = runners_up(problem, list(range(n)), best, 3, 10.0)
    assert [s.seconds for s in found] == pytest.approx([1.5, 1.5, 2.0])
    assert [s.choice for s in found] == [(1, 0, 0, 0, 0, 0), (0, 0, 0, 0, 0, 1), (1, 1, 0, 0, 0, 0)]


@pytest.mark.parametrize("seed", range(20))
def test_what_each_variable_passes_on_is_its_tables_least_and_the_core_is_the_same(
    seed, table_kind
):
    """``eliminate`` with ``sent`` (as the min-marginals call it) folds the same variables
    into the same core, each step's message its table's least over the variable's choices,
    and reads no best choices (but a pinned variable's one)."""
    problem = _series_parallel(seed)
    tables, sent = [], []
    core, steps = eliminate(problem, set(), tables, sent)
    plain_core, plain_steps = eliminate(problem, set())
    assert core.labels == plain_core.labels
    assert [(v, o) for v, o, _ in steps] == [(v, o) for v, o, _ in plain_steps]
    assert all(best is None for v, _, best in steps if len(problem.choices[v]) > 1)
    assert len(tables) == len(sent) == len(steps)
    for (v, others, _), table, up in zip(steps, tables, sent, strict=True):
        if others and len(problem.choices[v]) > 1:
            np.testing.assert_array_equal(up, table.min(axis=0))
        else:
            assert up is None
