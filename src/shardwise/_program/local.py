"""Local search over a :class:`~shardwise._program.problem.Problem`: from a choice per
variable, each variable takes its best choice given its neighbours' until none improves
(:func:`descend`); the runners-up are found so from the best plan, and the integer
program's rounded plans are improved so (:mod:`~shardwise._program.search`)."""

from __future__ import annotations

import operator
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from shardwise._program.problem import Problem, Solution, total


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
    begin, near, choice = (
        time.perf_counter(),
        neighbours(problem) if near is None else near,
        list(start),
    )
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
    at_rest: bool = False,
) -> tuple[float, dict[int, int]]:
    """:func:`descend`'s search, in place on ``choice``, from the variables in ``queue``:
    what its changes save, and each variable it changed, with its choice before (to undo).

    ``at_rest``: ``choice`` was a local optimum (:func:`at_rest`) before ``fixed`` was set,
    so a variable none of whose neighbours has changed since, which keeps its choice, is
    passed over without its sums: the same changes in the same order, where a runner-up's
    search from a four-axis plan visits every variable, and most keep theirs."""
    saved, was = 0.0, dict[int, int]()
    stirred = {u for u, _ in near[fixed]} if at_rest and fixed >= 0 else set()
    while queue:
        v = queue.pop()
        if v == fixed or (at_rest and v not in stirred):
            continue
        scores = problem.unary[v] + stacks.columns(v, choice)
        best = int(scores.argmin())
        if scores[best] < scores[choice[v]] * (1 - 1e-12) - 1e-300:
            saved += float(scores[choice[v]] - scores[best])
            was.setdefault(v, choice[v])
            choice[v] = best
            queue.extend(u for u, _ in near[v])
            if at_rest:
                stirred.update(u for u, _ in near[v])
    return saved, was


def at_rest(
    problem: Problem,
    choice: Sequence[int],
    near: Sequence[Sequence[tuple[int, np.ndarray]]],
    stacks: Stacks,
) -> bool:
    """Whether ``choice`` is a local optimum as :func:`settle` sees it: no variable changes
    its choice given its neighbours' (each visited once, none changing)."""
    _, was = settle(problem, list(choice), -1, list(range(len(choice))), near, stacks)
    return not was


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


def neighbours(problem: Problem) -> list[list[tuple[int, np.ndarray]]]:
    """Each variable's neighbours and the edge's matrix, oriented from the variable."""
    near: list[list[tuple[int, np.ndarray]]] = [[] for _ in problem.labels]
    for (u, v), m in problem.edges.items():
        near[u].append((v, m))
        near[v].append((u, m.T))
    return near
