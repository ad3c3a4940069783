"""The integer program of a planning problem, as HiGHS solves it: one binary per choice, and
per edge one continuous variable per pair of choices whose marginals are the two ends'
choices (exact when the binaries are integral), with a memory budget's constraints and the
solutions to exclude as rows. Its linear relaxation first: where that is integral (almost
always, without budgets), it is the optimum, proven without branch and bound.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import highspy
import numpy as np
import scipy.optimize
import scipy.sparse
from highspy._core import _Highs

from shardwise._program.problem import Problem


@dataclass(frozen=True, slots=True)
class Constraint:
    """``Σ bytes[(variable, choice)] · chosen ≤ limit`` (one device's memory at one point)."""

    terms: tuple[tuple[int, int, float], ...]
    limit: float


@dataclass(slots=True)
class _Rows:
    """The constraint rows of an integer program, built up a block of entries at a time."""

    rows: list[np.ndarray] = field(default_factory=list)
    cols: list[np.ndarray] = field(default_factory=list)
    vals: list[np.ndarray] = field(default_factory=list)
    lower: list[float] = field(default_factory=list)
    upper: list[float] = field(default_factory=list)

    def add(self, cols: Sequence[int], vals: Sequence[float], low: float, high: float) -> None:
        """``low ≤ Σ vals · x[cols] ≤ high``."""
        at = np.full(len(cols), len(self.lower))
        self.entries(at, np.asarray(cols, dtype=np.int64), np.asarray(vals, dtype=float))
        self.lower.append(low)
        self.upper.append(high)

    def entries(self, rows: np.ndarray, cols: np.ndarray, vals: np.ndarray) -> None:
        """Entries of rows already counted (:attr:`lower`)."""
        self.rows.append(rows.ravel())
        self.cols.append(cols.ravel())
        self.vals.append(np.broadcast_to(vals, rows.shape).ravel())

    def matrix(self, columns: int) -> scipy.sparse.csr_array:
        """The rows as a sparse matrix of ``columns`` columns."""
        if not self.rows:
            return scipy.sparse.csr_array((len(self.lower), columns))
        rows, cols = np.concatenate(self.rows), np.concatenate(self.cols)
        vals = np.concatenate(self.vals, dtype=float)  # (floats already: no copy)
        return scipy.sparse.csr_array((vals, (rows, cols)), shape=(len(self.lower), columns))


def _edge(
    m: np.ndarray, u: int, v: int, offset: np.ndarray, cost: list[np.ndarray], rows: _Rows, col: int
) -> int:
    """Edge ``(u, v)`` with cost matrix ``m``: one continuous variable per pair of groups of
    choices whose rows (columns) are equal, with the two ends' choices as its marginals; an
    edge whose cost depends on one end only is that end's own cost. Returns the next column."""
    rows_m, row_of = _unique_rows(m)
    reduced_t, col_of = _unique_rows(rows_m.T)
    reduced = reduced_t.T
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
        here = np.arange(first, first + groups)
        rows.entries(np.repeat(here, pairs.shape[1]), pairs, np.ones(1))
        rows.entries(of + first, np.arange(len(of)) + start, -np.ones(1))
        rows.lower += [0] * groups
        rows.upper += [0] * groups
    return col + int(nr * nc)


SMALL_EDGE = 4096
"""The most entries an edge's cost matrix has for :func:`_unique_rows` to sort its rows as
Python tuples (more go to ``np.unique``)."""


def _unique_rows(m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(m, axis=0, return_inverse=True)``, the same rows in the same order (``m``
    itself where its rows are distinct and in order already), three times as fast on the
    small cost matrices of a program's edges (NumPy sorts a structured view of the rows; a
    24-layer stack's training step has 207 such edges). A matrix of more than
    :data:`SMALL_EDGE` entries, or with a NaN (Python orders NaNs as it meets them), goes to
    ``np.unique``.

    >>> rows, of = _unique_rows(np.array([[2.0, 1.0], [0.0, 3.0], [2.0, 1.0]]))
    >>> rows.tolist(), of.tolist()
    ([[0.0, 3.0], [2.0, 1.0]], [1, 0, 1])
    """
    if m.size > SMALL_EDGE or np.isnan(m).any():
        rows, of = np.unique(m, axis=0, return_inverse=True)
        return rows, of.ravel()
    given = [tuple(row) for row in m.tolist()]
    keys = sorted(set(given))
    if keys == given:  # (distinct, and in order already)
        return m, np.arange(len(given))
    index = {row: k for k, row in enumerate(keys)}
    return np.array(keys, dtype=m.dtype).reshape(len(keys), m.shape[1]), np.array(
        [index[row] for row in given]
    )


def milp(
    problem: Problem,
    constraints: Sequence[Constraint],
    exclude: Sequence[dict[int, int]],
    time_limit: float,
    rounded: bool = False,
) -> tuple[tuple[int, ...], bool] | None:
    """Each variable's choice in the optimum of ``problem`` under ``constraints``, the
    combinations ``exclude`` names left out, and whether it is proven optimal: the linear
    relaxation's where integral, else branch and bound's (``None``: nothing is feasible).
    ``rounded`` (with no constraints nor exclusions): a relaxation that is not integral is
    rounded instead, each variable taking the choice of its largest share (a start for a
    local search, where branch and bound over thousands of choices would run for minutes);
    ``None`` where the relaxation is not solved within ``time_limit``."""
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
    a = rows.matrix(col)
    objective = np.concatenate(cost)
    # scaled: HiGHS's absolute gap (1e-6) would call any plan of seconds optimal
    objective = objective * (1e6 / max(float(np.abs(objective).max()), 1e-30))
    low, high = np.array(rows.lower), np.array(rows.upper)
    start = time.perf_counter()  # (the relaxation and branch and bound share time_limit)
    relaxed = _relaxation(objective, a, low, high, nx, time_limit)
    if relaxed is not None and float(np.abs(relaxed - np.round(relaxed)).max(initial=0.0)) < 1e-9:
        return _choices(relaxed, offset), True
    if rounded and not constraints and not exclude:  # (each variable's largest share)
        return None if relaxed is None else (_choices(relaxed, offset), False)
    with stdout_to_stderr():  # SciPy's HiGHS can print, with its output off
        result = scipy.optimize.milp(
            objective,
            constraints=scipy.optimize.LinearConstraint(a, rows.lower, rows.upper),
            integrality=(np.arange(col) < nx).astype(float),
            bounds=scipy.optimize.Bounds(0, 1),
            options={
                "time_limit": max(time_limit - (time.perf_counter() - start), 0.0),
                "mip_rel_gap": 1e-9,
            },
        )
    if result.x is None:
        return None
    optimal = bool(result.status == 0 and math.isfinite(result.fun))
    return _choices(result.x[:nx], offset), optimal


class _Redirect:
    """:func:`stdout_to_stderr`'s state, shared by threads: how many are within it, and the
    process's stdout, kept while fd 1 is stderr (``None``: there was none to keep)."""

    lock = threading.Lock()
    within = 0
    saved: int | None = None


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """What native code writes to the process's stdout goes to its stderr within: SciPy's
    HiGHS prints a line now and then from branch and bound (``HighsMipSolverData::
    transformNewIntegerFeasibleSolution tmpSolver.run();``) whatever its options say, and a
    command's ``--json`` on stdout must stay JSON. C's buffered stdout is flushed before fd 1
    is given back, so nothing written within comes out after. Threads may be within it at
    once (the baselines are solved beside the search, :mod:`~shardwise._program.beside`):
    the first to enter redirects, the last to leave gives fd 1 back."""
    with _Redirect.lock:
        if _Redirect.within == 0:
            sys.stdout.flush()
            try:
                _Redirect.saved = os.dup(1)
            except OSError:  # no stdout to guard
                _Redirect.saved = None
            else:
                os.dup2(2, 1)
        _Redirect.within += 1
    try:
        yield
    finally:
        with _Redirect.lock:
            _Redirect.within -= 1
            saved = _Redirect.saved
            if _Redirect.within == 0 and saved is not None:
                with contextlib.suppress(Exception):  # C's stdio, where ctypes can reach it
                    ctypes.CDLL(None).fflush(None)
                sys.stdout.flush()
                os.dup2(saved, 1)
                os.close(saved)
                _Redirect.saved = None


def _choices(x: np.ndarray, offset: np.ndarray) -> tuple[int, ...]:
    """Each variable's choice from the binaries ``x``."""
    return tuple(int(np.argmax(x[offset[v] : offset[v + 1]])) for v in range(len(offset) - 1))


def _relaxation(
    objective: np.ndarray,
    a: scipy.sparse.csr_array,
    lower: np.ndarray,
    upper: np.ndarray,
    nx: int,
    time_limit: float,
) -> np.ndarray | None:
    """The binaries of the linear relaxation's optimum (``None``: not found in time).

    A relaxation's optimum bounds the integer program's from below, so an integral one is the
    integer program's optimum: proven, without branch and bound. Without budgets or excluded
    solutions it almost always is (the pair variables make the relaxation tight on trees), and
    HiGHS's dual simplex finds it in a third of the time its MIP solver takes to start (without
    presolve: it removes nothing here, and took two thirds of a 24-layer stack's 0.28 s). The
    model goes to HiGHS through its own bindings (highspy): ``scipy.optimize.linprog`` loops
    in Python over every column of its answer, which took more than HiGHS's own solve of the
    46,000 columns of a 24-layer stack's training step (0.12 s against 0.05 s). The arrays go
    as they are, not through a ``HighsLp``, whose fields pybind copies an entry at a time.
    """
    csc = a.tocsc()
    cols, rows = csc.shape[1], csc.shape[0]
    inf = highspy.kHighsInf
    highs = _Highs()  # (highspy.Highs prints a banner to the process's stdout)
    for option, value in (
        ("output_flag", False),
        ("presolve", "off"),
        ("solver", "simplex"),
        ("simplex_strategy", 1),  # dual
        ("time_limit", float(time_limit)),
    ):
        highs.setOptionValue(option, value)
    arrays = (
        np.ascontiguousarray(objective, dtype=float), np.zeros(cols), np.ones(cols),
        np.where(np.isfinite(lower), lower, -inf), np.where(np.isfinite(upper), upper, inf),
        csc.indptr.astype(np.int32, copy=False), csc.indices.astype(np.int32, copy=False),
        csc.data.astype(float, copy=False),
        np.zeros(cols, dtype=np.int32),  # (every column continuous)
    )  # fmt: skip
    try:  # the arrays as they are: a HighsLp's fields are copied an entry at a time
        highs.passModel(cols, rows, csc.nnz, int(highspy.MatrixFormat.kColwise),
                        int(highspy.ObjSense.kMinimize), 0.0, *arrays)  # fmt: skip
    except TypeError:  # (a highspy without that form)
        highs.passModel(_lp(arrays, cols, rows))
    highs.run()
    if highs.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return None
    return np.asarray(highs.getSolution().col_value[:nx])


def _lp(arrays: tuple[np.ndarray, ...], cols: int, rows: int) -> highspy.HighsLp:
    """The linear program of :func:`_relaxation`'s ``arrays`` as a ``HighsLp``."""
    cost, low, high, row_low, row_high, start, index, value, _ = arrays
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = cols, rows
    lp.col_cost_, lp.col_lower_, lp.col_upper_ = cost, low, high
    lp.row_lower_, lp.row_upper_ = row_low, row_high
    matrix = lp.a_matrix_
    matrix.format_ = highspy.MatrixFormat.kColwise
    matrix.num_col_, matrix.num_row_ = cols, rows
    matrix.start_, matrix.index_, matrix.value_ = start, index, value
    return lp
