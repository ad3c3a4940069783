"""Identical parts of a problem solved once: folding loses nothing (the best plan and every
runner-up cost what they cost unfolded), folds the layers of a stack written as a Python loop
into one, and leaves a chain of layers (which it cannot fold) alone."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from helpers import brute_force
from shardwise._program import top
from shardwise._program.fold import fold, prints_kept, restricted
from shardwise._program.problem import Problem, total
from shardwise._program.search import solve
from shardwise._program.top import runners_up


def _stack(seed: int, layers: int) -> Problem:
    """A shared variable (a residual stream, say) and ``layers`` copies of one random small
    part (a tree, two of its variables joined to the shared one), then one part of its own."""
    rng = np.random.default_rng(seed)
    size = int(rng.integers(2, 4))
    sizes = [int(rng.integers(1, 4)) for _ in range(size)]
    inner = {(int(rng.integers(0, v)), v): None for v in range(1, size)}
    inner = {(u, v): rng.random((sizes[u], sizes[v])).round(1) for u, v in inner}
    unary = [rng.random(k).round(1) for k in sizes]
    joins = {0: rng.random((3, sizes[0])).round(1), size - 1: rng.random((3, sizes[-1])).round(1)}
    choices, costs, edges = [[0, 1, 2]], [rng.random(3).round(1)], {}
    for _ in range(layers + 1):
        first = len(choices)
        choices += [list(range(k)) for k in sizes]
        costs += [u.copy() for u in unary]
        for (u, v), m in inner.items():
            edges[(first + u, first + v)] = m
        for v, m in joins.items():
            edges[(0, first + v)] = m
    costs[-1] = costs[-1] + 0.05  # the last part is not like the others
    return Problem.of(choices, costs, edges)


def _part_cost(problem: Problem, part: range, h: int, x: tuple[int, ...]) -> float:
    """What one part of a :func:`_stack` problem costs at choices ``x``, the shared variable
    at choice ``h``."""
    c = dict(zip(part, x, strict=True)) | {0: h}
    own = sum(float(problem.unary[v][c[v]]) for v in part)
    return own + sum(float(m[c[u], c[v]]) for (u, v), m in problem.edges.items() if v in part)


def _by_parts(problem: Problem) -> float:
    """The cheapest cost of a :func:`_stack` problem by brute force, part by part: given the
    shared variable's choice the parts are apart, each tried every way on its own."""
    size = (len(problem.labels) - 1) // 4
    parts = [range(1 + k * size, 1 + (k + 1) * size) for k in range(4)]
    return min(
        float(problem.unary[0][h])
        + sum(
            min(
                _part_cost(problem, part, h, x)
                for x in itertools.product(*(range(len(problem.choices[v])) for v in part))
            )
            for part in parts
        )
        for h in range(len(problem.choices[0]))
    )


@pytest.mark.parametrize("seed", range(20))
def test_folding_keeps_the_best_cost(seed):
    problem = _stack(seed, layers=3)
    folding = fold(problem)
    assert folding is not None and len(folding.problem.labels) < len(problem.labels)
    best = solve(problem)
    assert best is not None
    assert best.seconds == pytest.approx(_by_parts(problem))
    if seed < 3:  # (the whole brute force, where it is quick, agrees)
        assert _by_parts(problem) == pytest.approx(brute_force(problem)[1])


def _solved_again(problem: Problem, inputs: list[int], best, count: int):  # type: ignore[no-untyped-def]
    """Runners-up by one solve per input held at each other choice, unfolded."""
    seen = {tuple(best.choice[v] for v in inputs)}
    out = []
    for v in inputs:
        found = []
        for c in range(len(problem.choices[v])):
            if c == best.choice[v]:
                continue
            every = itertools.product(*(range(len(x)) for x in problem.choices))
            choice = min((x for x in every if x[v] == c), key=lambda x: total(problem, x))
            key = tuple(choice[u] for u in inputs)
            if key not in seen:
                seen.add(key)
                found.append(total(problem, choice))
        out += [(rank, s) for rank, s in enumerate(sorted(found))]
    return [s for _, s in sorted(out)[:count]]


@pytest.mark.parametrize("seed", range(12))
def test_runners_up_of_folded_layers_cost_what_they_cost_unfolded(seed):
    """Holding one layer's variable at a choice is read from the layer kept apart; each
    runner-up costs what brute force finds for it, and changes its own layer alone."""
    problem = _stack(seed, layers=3)
    best = solve(problem)
    assert best is not None
    size = (len(problem.labels) - 1) // 4
    inputs = [1 + k * size for k in range(4)]  # each part's first variable
    found = runners_up(problem, inputs, best, 3, 10.0)
    expected = _solved_again(problem, inputs, best, 3)
    assert len(found) >= len(expected)
    for sol, seconds in zip(found, expected, strict=False):
        assert sol.seconds == pytest.approx(seconds, rel=1e-6)
        assert total(problem, sol.choice) == pytest.approx(sol.seconds)


def test_a_chain_of_layers_does_not_fold():
    layer = np.array([[0.0, 1.0], [1.0, 0.0]])
    problem = Problem.of([[0, 1]] * 5, [np.array([0.0, 0.5])] * 5,
                         {(v, v + 1): layer for v in range(4)})  # fmt: skip
    assert fold(problem) is None


@pytest.mark.parametrize("seed", range(12))
def test_local_search_runners_up_are_searched_once_per_layer(seed, monkeypatch):
    """Where local search finds the runners-up (an integer program solved the problem), a
    layer's variable takes its twin's searches mirrored, and the shared variable is searched
    in the folded problem: the same runners-up as searching each in the whole problem."""
    problem = _stack(seed, layers=3)
    best = solve(problem)
    assert best is not None
    best = dataclasses.replace(best, method="integer program (HiGHS)")
    size = (len(problem.labels) - 1) // 4
    inputs = [0, *(1 + k * size for k in range(4))]  # the shared variable, each part's first
    searches = top._Searches(problem, best)
    assert 0 in searches.index and {1 + size, 1 + 2 * size} <= searches.twins.keys()
    folded = runners_up(problem, inputs, best, 6, 10.0)
    monkeypatch.setattr(top, "fold", lambda problem: None)
    whole = runners_up(problem, inputs, best, 6, 10.0)
    assert [s.choice for s in folded] == [s.choice for s in whole]
    for sol in folded:
        assert sol.seconds == pytest.approx(total(problem, sol.choice))
        assert any(sol.choice[v] != best.choice[v] for v in inputs)


@pytest.mark.parametrize(
    "seed", [s for s in range(20) if any(len(c) > 1 for c in _stack(s, 3).choices[1:])][:10]
)
def test_a_problem_pinned_alike_in_every_layer_folds_as_its_whole(seed):
    """A baseline pins every layer alike: its problem takes the whole problem's folding (not
    looked for again) and solves to its own optimum; pinned in one layer only, it is folded
    anew, that layer apart."""
    problem = _stack(seed, layers=3)
    size = (len(problem.labels) - 1) // 4
    j = next(j for j in range(size) if len(problem.choices[1 + j]) > 1)  # (choices to pin)
    alike = {1 + k * size + j: [0] for k in range(4)}  # in each part, at choice 0
    with prints_kept():
        for keep, same in ((alike, True), ({1 + size + j: [0]}, False)):
            pinned = problem.restrict(keep)
            restricted(pinned, keep, problem)
            folding, whole = fold(pinned), fold(problem)
            assert folding is not None and whole is not None
            assert (folding.groups == whole.groups) is same
            best = solve(pinned)
            assert best is not None
            assert best.seconds == pytest.approx(_by_parts(pinned))
