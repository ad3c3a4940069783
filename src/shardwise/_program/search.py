"""Find the cheapest choice for every variable of a :class:`Problem`.

- variables with one or two neighbours are eliminated exactly, as dynamic programming over a
  chain does; a problem whose edges form a forest (a chain of layers is one) is solved by that
  alone;
- what is left (cycles: residual connections, operands shared by several dots), and variables
  a memory budget or an excluded solution names, form an integer program solved
  by HiGHS (its linear relaxation first, with the dual simplex: where that is integral it is
  the optimum; else :func:`scipy.optimize.milp`): one binary per choice, and per edge one
  continuous variable per pair of choices whose marginals are the two ends' choices (exact when
  the binaries are integral). HiGHS proves optimality or says it stopped at its time limit.
"""

from __future__ import annotations

import math
import operator
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import highspy
import numpy as np
import scipy.optimize
import scipy.sparse
from highspy._core import _Highs

from shardwise._program.eliminate import eliminate
from shardwise._program.fold import fold
from shardwise._program.problem import Problem

TIME_LIMIT_S = 60.0
"""How long one integer program may run; past it the best solution found is used and the plan
says it is not proven optimal."""


@dataclass(frozen=True, slots=True)
class Constraint:
    """``Σ bytes[(variable, choice)] · chosen ≤ limit`` (one device's memory at one point)."""

    terms: tuple[tuple[int, int, float], ...]
    limit: float


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
        found = _milp(
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


@dataclass(slots=True)
class _Rows:
    """The constraint rows of an integer program, built up one row at a time."""

    rows: list[int] = field(default_factory=list)
    cols: list[int] = field(default_factory=list)
    vals: list[float] = field(default_factory=list)
    lower: list[float] = field(default_factory=list)
    upper: list[float] = field(default_factory=list)

    def add(self, cols: Sequence[int], vals: Sequence[float], low: float, high: float) -> None:
        """``low ≤ Σ vals · x[cols] ≤ high``."""
        self.rows += [len(self.lower)] * len(cols)
        self.cols += [int(c) for c in cols]
        self.vals += list(vals)
        self.lower.append(low)
        self.upper.append(high)


def _edge(
    m: np.ndarray, u: int, v: int, offset: np.ndarray, cost: list[np.ndarray], rows: _Rows, col: int
) -> int:
    """Edge ``(u, v)`` with cost matrix ``m``: one continuous variable per pair of groups of
    choices whose rows (columns) are equal, with the two ends' choices as its marginals; an
    edge whose cost depends on one end only is that end's own cost. Returns the next column."""
    rows_m, row_of = np.unique(m, axis=0, return_inverse=True)
    reduced, col_of = np.unique(rows_m, axis=1, return_inverse=True)
    row_of, col_of = row_of.ravel(), col_of.ravel()
    if reduced.shape[0] == 1:
        cost[0][offset[v] : offset[v + 1]] += reduced[0, col_of]
        return col
    if reduced.shape[1] == 1:
        cost[0][offset[u] : offset[u + 1]] += reduced[row_of, 0]
        return col
    nr, nc = reduced.shape
    cost.append(reduced.ravel().astype(float))
    block = np.arange(nr * nc).reshape(nr, nc) + col
    for groups, of, start, pairs in (
        (nr, row_of, offset[u], block),
        (nc, col_of, offset[v], block.T),
    ):  # a row per group g: Σ pairs of group g = Σ choices in group g
        first = len(rows.lower)
        rows.rows += np.repeat(np.arange(first, first + groups), pairs.shape[1]).tolist()
        rows.cols += pairs.ravel().tolist()
        rows.vals += [1.0] * pairs.size
        rows.rows += (of + first).tolist()
        rows.cols += (np.arange(len(of)) + start).tolist()
        rows.vals += [-1.0] * len(of)
        rows.lower += [0] * groups
        rows.upper += [0] * groups
    return col + int(nr * nc)


def _milp(
    problem: Problem,
    constraints: Sequence[Constraint],
    exclude: Sequence[dict[int, int]],
    time_limit: float,
) -> tuple[tuple[int, ...], bool] | None:
    sizes = [len(c) for c in problem.choices]
    offset = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
    cost = [np.concatenate(problem.unary)]
    rows = _Rows()
    for v, n in enumerate(sizes):  # one choice per variable
        rows.add(range(offset[v], offset[v] + n), [1.0] * n, 1, 1)
    nx = int(offset[-1])
    col = nx
    for (u, v), m in problem.edges.items():
        col = _edge(m, u, v, offset, cost, rows, col)
    for c in constraints:
        rows.add(
            [offset[v] + k for v, k, _ in c.terms], [b for _, _, b in c.terms], -np.inf, c.limit
        )
    for ex in exclude:  # not this combination again
        rows.add([offset[v] + k for v, k in ex.items()], [1.0] * len(ex), -np.inf, len(ex) - 1.0)
    a = scipy.sparse.csr_array((rows.vals, (rows.rows, rows.cols)), shape=(len(rows.lower), col))
    objective = np.concatenate(cost)
    # scaled: HiGHS's absolute gap (1e-6) would call any plan of seconds optimal
    objective = objective * (1e6 / max(float(np.abs(objective).max()), 1e-30))
    low, high = np.array(rows.lower), np.array(rows.upper)
    relaxed = _integral_relaxation(objective, a, low, high, nx, time_limit)
    if relaxed is not None:
        return _choices(relaxed, offset), True
    result = scipy.optimize.milp(
        objective,
        constraints=scipy.optimize.LinearConstraint(a, rows.lower, rows.upper),
        integrality=(np.arange(col) < nx).astype(float),
        bounds=scipy.optimize.Bounds(0, 1),
        options={"time_limit": time_limit, "mip_rel_gap": 1e-9},
    )
    if result.x is None:
        return None
    optimal = bool(result.status == 0 and math.isfinite(result.fun))
    return _choices(result.x[:nx], offset), optimal


def _choices(x: np.ndarray, offset: np.ndarray) -> tuple[int, ...]:
    """Each variable's choice from the binaries ``x``."""
    return tuple(int(np.argmax(x[offset[v] : offset[v + 1]])) for v in range(len(offset) - 1))


def _integral_relaxation(
    objective: np.ndarray,
    a: scipy.sparse.csr_array,
    lower: np.ndarray,
    upper: np.ndarray,
    nx: int,
    time_limit: float,
) -> np.ndarray | None:
    """The binaries of the linear relaxation's optimum where they are all 0 or 1, else ``None``.

    A relaxation's optimum bounds the integer program's from below, so an integral one is the
    integer program's optimum: proven, without branch and bound. Without budgets or excluded
    solutions it almost always is (the pair variables make the relaxation tight on trees), and
    HiGHS's dual simplex finds it in a third of the time its MIP solver takes to start (without
    presolve: it removes nothing here, and took two thirds of a 24-layer stack's 0.28 s). The
    model goes to HiGHS through its own bindings (highspy): ``scipy.optimize.linprog`` loops
    in Python over every column of its answer, which took more than HiGHS's own solve of the
    46,000 columns of a 24-layer stack's training step (0.12 s against 0.05 s).
    """
    csc = a.tocsc()
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = csc.shape[1], csc.shape[0]
    lp.col_cost_ = objective
    lp.col_lower_, lp.col_upper_ = np.zeros(csc.shape[1]), np.ones(csc.shape[1])
    inf = highspy.kHighsInf
    lp.row_lower_ = np.where(np.isfinite(lower), lower, -inf)
    lp.row_upper_ = np.where(np.isfinite(upper), upper, inf)
    matrix = lp.a_matrix_
    matrix.format_ = highspy.MatrixFormat.kColwise
    matrix.num_col_, matrix.num_row_ = csc.shape[1], csc.shape[0]
    matrix.start_, matrix.index_, matrix.value_ = csc.indptr, csc.indices, csc.data
    highs = _Highs()  # (highspy.Highs prints a banner to the process's stdout)
    for option, value in (
        ("output_flag", False),
        ("presolve", "off"),
        ("solver", "simplex"),
        ("simplex_strategy", 1),  # dual
        ("time_limit", float(time_limit)),
    ):
        highs.setOptionValue(option, value)
    highs.passModel(lp)
    highs.run()
    if highs.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return None
    x = np.asarray(highs.getSolution().col_value[:nx])
    return x if float(np.abs(x - np.round(x)).max(initial=0.0)) < 1e-9 else None
