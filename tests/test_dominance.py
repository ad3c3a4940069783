"""The search's dominance pruning (:func:`shardwise._program.search._dominant`): a choice that
costs no more than another whatever the neighbours choose stands for it. A variable alike one
pruned before (the same costs, edges and neighbours' choices: a layer of a stack that does not
fold) keeps what that one kept; each check here is against the comparisons made anew for every
variable."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from helpers import alike_layers, brute_force
from shardwise._program import search
from shardwise._program.local import neighbours
from shardwise._program.problem import Problem


def _anew(problem: Problem, protected: set[int]) -> dict[int, list[int]]:
    """Dominance as its definition says, every variable compared anew: choice ``i`` drops
    ``j`` when ``unary[i] - unary[j] + Σ_edges max_c (m[i, c] - m[j, c])`` is at most the
    tolerance, over the neighbours' choices kept so far, the cheapest kept first."""
    near = neighbours(problem)
    kept: dict[int, list[int]] = {}
    for v, unary in enumerate(problem.unary):
        if v in protected or len(unary) < 2:
            continue
        tol = 1e-12 * max(float(np.abs(unary).max()), 1e-30)
        alive: list[int] = []
        for j in np.argsort(unary, kind="stable"):
            if not any(
                unary[i] - unary[j]
                + sum(max(m[i, c] - m[j, c] for c in kept.get(a, range(m.shape[1])))
                      for a, m in near[v])
                <= tol
                for i in alive
            ):  # fmt: skip
                alive.append(int(j))
        if len(alive) < len(unary):
            kept[v] = sorted(alive)
    return kept


@pytest.mark.parametrize(("seed", "alike"), list(itertools.product(range(6), (True, False))))
def test_what_each_variable_keeps_is_what_comparing_it_anew_keeps(seed: int, alike: bool):
    problem = alike_layers(seed, 5, alike)
    protected = {0} if seed % 2 else set()
    found = search._dominant(problem, protected)
    assert found == _anew(problem, protected)
    assert found  # (some choice is dominated: the test compares something)


def test_layers_alike_are_compared_once(monkeypatch: pytest.MonkeyPatch):
    calls: list[int] = []
    compare = search._undominated

    def counted(unary: np.ndarray, edges: list[np.ndarray]) -> list[int]:
        calls.append(len(unary))
        return compare(unary, edges)

    monkeypatch.setattr(search, "_undominated", counted)
    problem = alike_layers(0, 12, alike=True)
    found = search._dominant(problem, set())
    assert found == _anew(problem, set())
    pruned = [v for v, u in enumerate(problem.unary) if len(u) > 1]
    assert len(calls) < len(pruned) / 2  # (the middle layers' variables share theirs)


def test_a_variable_alike_but_for_its_neighbours_choices_is_compared_again():
    # two dots alike, each between two activations alike but for h0, which is pruned first
    # (the others are protected: every choice kept): what dot 1 may drop depends on the
    # choices h0 keeps, dot 3's on all of h4's
    rng = np.random.default_rng(3)
    u_h, u_f = rng.uniform(0, 1, 3), rng.uniform(0, 1, 5)
    u_h0 = u_h.copy()
    u_h0[0] -= 5.0  # (h0's first choice dominates its others: they are dropped first)
    m = rng.uniform(0, 1, (3, 5))
    problem = Problem.of(
        [range(3), range(5), range(3), range(5), range(3)],
        [u_h0, u_f, u_h, u_f, u_h],
        {(0, 1): m, (2, 1): m, (2, 3): m, (4, 3): m},
    )
    found = search._dominant(problem, {2, 4})
    assert found == _anew(problem, {2, 4})


@pytest.mark.parametrize(("seed", "alike"), list(itertools.product(range(4), (True, False))))
def test_the_choices_kept_hold_an_optimum(seed: int, alike: bool):
    problem = alike_layers(seed, 2, alike)
    small = problem.restrict(search._dominant(problem, set()))
    assert sum(map(len, small.choices)) < sum(map(len, problem.choices))
    assert brute_force(small)[1] == pytest.approx(brute_force(problem)[1], rel=1e-12)
