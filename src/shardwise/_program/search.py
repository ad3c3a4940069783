"""Find the cheapest choice for every variable of a :class:`Problem`.

- variables with one or two neighbours are eliminated exactly, as dynamic programming over a
  chain does; a problem whose edges form a forest (a chain of layers is one) is solved by that
  alone;
- what is left (cycles: residual connections, operands shared by several dots), and variables
  a memory budget or an excluded solution names, form an integer program solved
  by HiGHS (its linear relaxation first, with the dual simplex: where that is integral it is
  the optimum; else :func:`scipy.optimize.milp`): one binary per choice, and per edge one
  continuous variable per pair of choices whose marginals are the two ends' choices (exact when
  the binaries are integral; :mod:`~shardwise._program.integer`). HiGHS proves optimality or
  says it stopped at its time limit.
"""

from __future__ import annotations

import operator
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardwise._program.eliminate import eliminate
from shardwise._program.fold import fold
from shardwise._program.integer import Constraint, milp
from shardwise._program.problem import Problem

TIME_LIMIT_S = 60.0
"""How long one integer program may run; past it the best solution found is used and the plan
says it is not proven optimal."""


@dataclass(frozen=True, slots=True)
class Solution:
    """A choice per variable, its cost, and how it was found."""

    choice: tuple[int, ...]
    seconds: float
    optimal: bool
    method: str
    solve_seconds: float


def total(problem: Problem, choice: Sequence[int]) -> float:
    """The cost of one choice per variable."""
    cost = sum(float(u[c]) for u, c in zip(problem.unary, choice, strict=True))
    return cost + sum(float(m[choice[u], choice[v]]) for (u, v), m in problem.edges.items())


def solve(
    problem: Problem,
    constraints: Sequence[Constraint] = (),
    exclude: Sequence[dict[int, int]] = (),
    time_limit: float = TIME_LIMIT_S,
) -> Solution | None:
    """The cheapest feasible choice, or ``None`` where none fits the constraints.

    Identical parts (the layers of a stack) are solved once (:mod:`~shardwise._program.fold`;
    not under constraints, which count each part apart). Variables with at most two neighbours
    (and in no constraint) are eliminated exactly first, as dynamic programming over chains and
    trees does; what is left, if anything, is an integer program (its linear relaxation first:
    where that is integral, it is the optimum).
    """
    start = time.perf_counter()
    folded, small = [], problem
    while not (constraints or exclude) and (folding := fold(small)) is not None:
        folded.append(folding)  # folded parts may make parts alike in turn
        small = folding.problem
    if folded:
        found = _solve(small, (), (), time_limit)
        assert found is not None  # only constraints make a problem infeasible
        whole = found.choice
        for folding in reversed(folded):
            whole = folding.expand(whole)
        seconds = time.perf_counter() - start
        return Solution(whole, total(problem, whole), found.optimal, found.method, seconds)
    return _solve(problem, constraints, exclude, time_limit)


def _solve(
    problem: Problem,
    constraints: Sequence[Constraint],
    exclude: Sequence[dict[int, int]],
    time_limit: float,
) -> Solution | None:
    start = time.perf_counter()
    protected = {v for c in constraints for v, _, _ in c.terms} | {v for e in exclude for v in e}
    core, steps = eliminate(problem, protected)
    method, optimal = "dynamic programming", True
    choice = [-1] * len(problem.labels)
    if core.labels:
        index = {label: k for k, label in enumerate(core.labels)}
        at = {label: k for k, label in enumerate(problem.labels)}
        kept = _dominant(core, {index[problem.labels[v]] for v in protected})
        found = milp(
            core.restrict(kept),
            [
                Constraint(tuple((index[problem.labels[v]], c, b) for v, c, b in x.terms), x.limit)
                for x in constraints
            ],
            [{index[problem.labels[v]]: c for v, c in e.items()} for e in exclude],
            time_limit,
        )
        if found is None:
            return None
        for k, (label, c) in enumerate(zip(core.labels, found[0], strict=True)):
            choice[at[label]] = kept[k][c] if k in kept else c
        optimal = found[1]
        method = "integer program (HiGHS)"
        if steps:
            method = "dynamic programming + integer program (HiGHS)"
    for v, near, best in reversed(steps):
        choice[v] = int(best[tuple(choice[n] for n in near)]) if near else int(best)
    seconds = time.perf_counter() - start
    return Solution(tuple(choice), total(problem, choice), optimal, method, seconds)


def descend(
    problem: Problem,
    start: Sequence[int],
    fixed: int,
    near: Sequence[Sequence[tuple[int, np.ndarray]]] | None = None,
    settled: bool = False,
    cost: float | None = None,
    stacks: Stacks | None = None,
) -> Solution:
    """A good solution near ``start`` with ``fixed`` kept at its choice there: each variable,
    then each neighbour of a changed one, takes its best choice given its neighbours', until
    none improves (iterated conditional modes). Each change lowers the cost, so it ends, at a
    local optimum (no one variable's change helps), not proven the best with that choice
    (:attr:`Solution.optimal` is False).

    ``settled``: every variable of ``start`` but ``fixed`` is already at its best given its
    neighbours (``start`` is an optimum with ``fixed`` changed), so only ``fixed``'s
    neighbours are looked at first. ``near``: :func:`neighbours` of ``problem``, if at hand.
    ``cost``: what ``start`` costs, if known: the solution's is then that less what each
    change saves (not the whole problem summed again, for each of thousands of runners-up).
    ``stacks``: :class:`Stacks` of ``near``, shared by many descents."""
    begin = time.perf_counter()
    near = neighbours(problem) if near is None else near
    choice = list(start)
    queue = [u for u, _ in near[fixed]] if settled else list(range(len(choice)))
    saved, _ = settle(problem, choice, fixed, queue, near, stacks or Stacks(near))
    seconds = time.perf_counter() - begin
    found = total(problem, choice) if cost is None else cost - saved
    return Solution(tuple(choice), found, False, "local search", seconds)


def settle(
    problem: Problem,
    choice: list[int],
    fixed: int,
    queue: list[int],
    near: Sequence[Sequence[tuple[int, np.ndarray]]],
    stacks: Stacks,
) -> tuple[float, dict[int, int]]:
    """:func:`descend`'s search, in place on ``choice``, from the variables in ``queue``:
    what its changes save, and each variable it changed, with its choice before (to undo)."""
    saved, was = 0.0, dict[int, int]()
    while queue:
        v = queue.pop()
        if v == fixed:
            continue
        scores = problem.unary[v] + stacks.columns(v, choice)
        best = int(scores.argmin())
        if scores[best] < scores[choice[v]] * (1 - 1e-12) - 1e-300:
            saved += float(scores[choice[v]] - scores[best])
            was.setdefault(v, choice[v])
            choice[v] = best
            queue.extend(u for u, _ in near[v])
    return saved, was


STACKED = 4
"""From how many neighbours :class:`Stacks` sums their columns in one take."""


class Stacks:
    """Each variable's edge matrices (with :data:`STACKED` neighbours or more) stacked, for
    :func:`descend`'s sums of neighbours' columns: the residual stream's class of a 24-layer
    transformer has hundreds of neighbours, summed once per visit. The columns are taken in
    one index and summed along the stack's first axis, which numpy adds row after row as
    :func:`sum` adds them one by one: the scores are bit-for-bit the same. Built per
    variable when first visited."""

    def __init__(self, near: Sequence[Sequence[tuple[int, np.ndarray]]]) -> None:
        self.near = near
        self.built: dict[int, tuple[Callable[[Sequence[int]], Any], np.ndarray, np.ndarray]] = {}

    def columns(self, v: int, choice: Sequence[int]) -> np.ndarray | float:
        """``Σ m[:, choice[u]]`` over ``v``'s neighbours ``u``."""
        near = self.near[v]
        if len(near) < STACKED or near[0][1].shape[0] < 2:  # (one row: numpy sums it pairwise)
            summed: np.ndarray | float = sum((m[:, choice[u]] for u, m in near), 0.0)
            return summed
        if v not in self.built:
            widths = [m.shape[1] for _, m in near]
            self.built[v] = (
                operator.itemgetter(*(u for u, _ in near)),
                np.concatenate([[0], np.cumsum(widths[:-1])]).astype(np.intp),
                np.concatenate([m.T for _, m in near]),
            )
        of, offsets, stacked = self.built[v]
        return np.asarray(np.add.reduce(stacked[offsets + np.array(of(choice))], axis=0))


def moved(
    problem: Problem,
    choice: Sequence[int],
    v: int,
    c: int,
    near: Sequence[Sequence[tuple[int, np.ndarray]]],
) -> float:
    """What changing variable ``v`` of ``choice`` to choice ``c`` adds to its cost."""
    was = choice[v]
    delta = float(problem.unary[v][c] - problem.unary[v][was])
    return delta + sum(float(m[c, choice[u]] - m[was, choice[u]]) for u, m in near[v])


DOMINANCE_WORK = 4_000_000
"""Most comparisons :func:`_dominant` makes for one variable (its choices squared times its
neighbours' choices): past it, the variable keeps every choice. A dot's strategies on a
three-axis mesh number hundreds, and comparing them all took longer than the integer program
they were pruned for."""


def _dominant(problem: Problem, protected: set[int]) -> dict[int, list[int]]:
    """Each unprotected variable's choices that no other choice dominates. Choice ``i``
    dominates ``j`` when it costs no more whatever the neighbours choose:
    ``unary[i] - unary[j] + Σ_edges max_c (m[i, c] - m[j, c]) ≤ 0``; some optimal solution
    uses no dominated choice, so dropping them is exact. Variables are pruned one after another,
    each against its neighbours' choices as they stand."""
    near = neighbours(problem)
    kept: dict[int, list[int]] = {}
    for v, unary in enumerate(problem.unary):
        if v in protected or len(unary) < 2:
            continue
        if len(unary) ** 2 * sum(m.shape[1] for _, m in near[v]) > DOMINANCE_WORK:
            continue  # (the comparisons would cost more than the choices they might drop)
        worst = unary[:, None] - unary[None, :]  # worst[i, j]: i's cost over j's, at most
        for a, m in near[v]:
            m = m[:, kept[a]] if a in kept else m
            worst = worst + (m[:, None, :] - m[None, :, :]).max(axis=2)
        tol = 1e-12 * max(float(np.abs(unary).max()), 1e-30)
        alive: list[int] = []
        for j in np.argsort(unary, kind="stable"):
            if not any(worst[i, j] <= tol for i in alive):
                alive.append(int(j))
        if len(alive) < len(unary):
            kept[v] = sorted(alive)
    return kept


def neighbours(problem: Problem) -> list[list[tuple[int, np.ndarray]]]:
    """Each variable's neighbours and the edge's matrix, oriented from the variable."""
    near: list[list[tuple[int, np.ndarray]]] = [[] for _ in problem.labels]
    for (u, v), m in problem.edges.items():
        near[u].append((v, m))
        near[v].append((u, m.T))
    return near
