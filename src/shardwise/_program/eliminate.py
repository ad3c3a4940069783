"""Exact dynamic programming over a planning problem: variables with one or two neighbours
are folded into them (eliminated), as dynamic programming over a chain or a tree does; a
problem whose edges form a forest (a chain of layers is one) is solved by that alone, and
what is left is the part an integer program must solve
(:func:`~shardwise._program.search.solve`), unless every variable of it can be folded into
all its neighbours at once with tables that stay small (:func:`eliminate_wide`: the training
step of a chain of layers, where each weight is read by the forward pass, the backward pass
and its update, is a ladder, not a chain)."""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from shardwise._program.fold import fingerprint
from shardwise._program.problem import Problem
from shardwise._program.summed import SLAB, Summed

T = TypeVar("T")

Folded = tuple[int, tuple[int, ...], Any]
"""A variable folded into its neighbours, and its best choice for each of theirs."""


def eliminate(
    problem: Problem,
    protected: set[int],
    tables: list[np.ndarray | Summed] | None = None,
    sent: list[np.ndarray | None] | None = None,
) -> tuple[Problem, list[Folded]]:
    """Fold every unprotected variable of degree ≤ 2 into its neighbours, exactly: a leaf adds
    its best cost to its neighbour's choices; a link between two neighbours becomes an edge
    whose cost is the best over the link's choices; a variable with one choice adds its edges'
    costs to its neighbours' choices, whatever its degree. Returns the rest and how to recover each
    folded variable's choice from its neighbours'. ``tables``, where given, gets each folded
    variable's cost over its choices and its neighbours' as it was folded (axes: the variable,
    then its neighbours in the order of its :data:`Folded`; a large one over two neighbours as
    a :class:`~.summed.Summed`; a variable with one choice: its own cost, with its edges to
    variables with one choice folded before it). ``sent``, where
    given, gets what each folded variable passed to its neighbours, its table's least over its
    own choices (``None`` where it has none, or one choice), and the steps then hold no best
    choices (``None``; a variable with one choice keeps it): the min-marginals read the tables
    alone (:mod:`~shardwise._program.marginals`)."""
    n = len(problem.labels)
    unary = [u.astype(float) for u in problem.unary]
    near: list[dict[int, np.ndarray]] = [{} for _ in range(n)]
    for (u, v), m in problem.edges.items():  # (no copy: every sum below makes a new array)
        near[u][v] = m if v not in near[u] else near[u][v] + m
        near[v][u] = m.T if u not in near[v] else near[v][u] + m.T
    steps = _constants(unary, near, protected, tables, sent)
    best = _first_best if sent is None else _no_best
    alive = set(range(n)) - {v for v, _, _ in steps}

    def size(v: int) -> int:  # of the table that folding v makes
        return len(unary[v]) * math.prod(len(unary[o]) for o in near[v])

    # the smallest tables first: folding a link between two small variables before one
    # between two large ones keeps every table small (a stack of layers: 8 times less work)
    queue = [(size(v), v) for v in alive if len(near[v]) <= 2 and v not in protected]
    heapq.heapify(queue)
    while queue:
        was, v = heapq.heappop(queue)
        if v not in alive or len(near[v]) > 2 or v in protected:
            continue
        if size(v) != was:  # its neighbours changed since
            heapq.heappush(queue, (size(v), v))
            continue
        others = tuple(near[v])
        if len(others) == 2 and was > 1 << 22:
            continue
        alive.discard(v)
        least: np.ndarray | None = None
        scores: np.ndarray | Summed
        if not others:
            scores = unary[v]
            steps.append((v, (), best(scores)))
        elif len(others) == 1:
            (a,) = others
            scores = unary[v][:, None] + near[v][a]
            least = scores.min(axis=0)
            unary[a] = unary[a] + least
            steps.append((v, (a,), best(scores, least)))
            del near[a][v]
        else:
            a, b = others
            scores = _link(unary[v], near[v][a], near[v][b])
            least = scores.min(axis=0)
            steps.append((v, (a, b), best(scores, least)))
            del near[a][v], near[b][v]
            near[a][b] = near[a].get(b, 0) + least
            near[b][a] = near[b].get(a, 0) + least.T
        if tables is not None:
            tables.append(scores)
        if sent is not None:
            sent.append(least)
        for o in others:
            if len(near[o]) <= 2:
                heapq.heappush(queue, (size(o), o))
    keep = sorted(alive)
    position = {v: k for k, v in enumerate(keep)}
    edges = {(position[v], position[o]): m for v in keep for o, m in near[v].items() if v < o}
    core = Problem.of([problem.choices[v] for v in keep], [unary[v] for v in keep], edges,
                      [problem.labels[v] for v in keep])  # fmt: skip
    return dataclasses.replace(core, considered=problem.considered), steps


def _link(unary: np.ndarray, left: np.ndarray, right: np.ndarray) -> np.ndarray | Summed:
    """The table of a variable folded into two neighbours (axes: it, then them): its own
    costs and its two edges', made whole where it is small, else kept as those terms and
    made a slab at a time where it is read (on a mesh of three axes, millions of entries)."""
    if len(unary) * left.shape[1] * right.shape[1] <= SLAB:
        made: np.ndarray = unary[:, None, None] + left[:, :, None] + right[:, None, :]
        return made
    shape = (len(unary), left.shape[1], right.shape[1])
    return Summed(shape, ((unary, (0,)), (left, (0, 1)), (right, (0, 2))))


TIE = 1e-12
"""Choices whose costs are this close, relative to their size, cost the same: the sums behind
them may differ in their last bits with the order they were added in."""


def _no_best(scores: np.ndarray | Summed, least: np.ndarray | None = None) -> None:
    """No best choice read (:func:`eliminate` with ``sent``)."""


def _first_best(scores: np.ndarray | Summed, least: np.ndarray | None = None) -> Any:
    """The first of the cheapest choices (axis 0) for each choice of the neighbours: the
    same plan whatever order the costs were added in (``least``: ``scores.min(axis=0)``,
    where already at hand; a :class:`Summed` table read a slab at a time)."""
    least = scores.min(axis=0) if least is None else least
    if isinstance(scores, Summed):
        return np.concatenate([np.argmax(dense <= (near := least[at]) + TIE * np.abs(near),
                                         axis=0) for at, dense in scores.slabs(1)])  # fmt: skip
    return np.argmax(scores <= least + TIE * np.abs(least), axis=0)


def _constants(
    unary: list[np.ndarray],
    near: list[dict[int, np.ndarray]],
    protected: set[int],
    tables: list[np.ndarray | Summed] | None,
    sent: list[np.ndarray | None] | None = None,
) -> list[Folded]:
    """Fold each unprotected variable with one choice (a pinned input): a constant, whatever
    its degree, that adds its edges' costs to its neighbours' choices."""
    steps: list[Folded] = []
    for v in range(len(unary)):
        if len(unary[v]) == 1 and v not in protected:
            for a, m in near[v].items():
                unary[a] = unary[a] + m[0]
                del near[a][v]
            near[v] = {}
            steps.append((v, (), np.int64(0)))
            if tables is not None:
                tables.append(unary[v])
            if sent is not None:
                sent.append(None)
    return steps


Factor = tuple[tuple[int, ...], np.ndarray]
"""A cost over some variables: the variables, and the cost at each of their choices (an axis
per variable, in that order)."""

WIDE_TABLE = 1 << 22
"""The most entries one table of :func:`eliminate_wide` may have (a variable's choices times
its neighbours' at once): 32 MiB of float64 (a dot of a hundred layouts read and made by
arrays of 27 on a mesh of three axes takes 2 million). Past it the integer program is solved
instead."""

WIDE_WORK = 1 << 24
"""The most entries :func:`eliminate_wide`'s tables may have in all, a table alike one made
before not counted again (:func:`_alike`)."""


def eliminate_wide(problem: Problem, tables: list[np.ndarray] | None = None) -> list[Folded] | None:
    """Every variable folded into all its neighbours at once, the smallest table first: each
    table (a variable's choices by its neighbours') is its own cost and every cost it shares
    with them, what the variables folded into it brought included, and its minimum over the
    variable is a cost over the neighbours, shared from then on. Exact like :func:`eliminate`;
    ``None`` where some table would have more than :data:`WIDE_TABLE` entries or the tables
    made more than :data:`WIDE_WORK` (checked before any table is made). A table alike one
    made before (:func:`_alike`: the layers of a chain that do not fold) is not made again,
    its minimum and best choices taken. ``tables`` as :func:`eliminate`'s."""
    order = _wide_order(problem)
    alike = None if order is None else _alike(problem, order)
    if order is None or alike is None:
        return None
    factors: list[list[Factor]] = _kept([u.astype(float) for u in problem.unary], problem.edges)
    steps: list[Folded] = []
    made: dict[int, tuple[np.ndarray, Any, np.ndarray | None]] = {}  # minimum, best, table
    for (v, others), table in zip(order, alike, strict=True):
        axes = (v, *others)
        gathered = _gathered(factors, axes)
        if table not in made:
            shape = [len(problem.unary[a]) for a in axes]
            scores = np.zeros(shape)
            for scope, cost in gathered:
                where = sorted(range(len(scope)), key=lambda k: axes.index(scope[k]))
                ones = [n if a in scope else 1 for a, n in zip(axes, shape, strict=True)]
                scores = scores + cost.transpose(where).reshape(ones)
            least = scores.min(axis=0)
            made[table] = (least, _first_best(scores, least), None if tables is None else scores)
        least, best, kept = made[table]
        steps.append((v, others, best))
        if tables is not None and kept is not None:
            tables.append(kept)
        if others:
            factors[others[0]].append((others, least))
    return steps


def _alike(problem: Problem, order: list[tuple[int, tuple[int, ...]]]) -> list[int] | None:
    """For each variable of ``order``, its table's number, the same for tables made of the
    same costs in the same places (each cost by its print, :func:`~.fold.fingerprint`; the
    costs a fold brings by the number of the table they are the minimum of), which are the
    same to the last bit; ``None`` where the distinct tables hold more than
    :data:`WIDE_WORK` entries."""
    factors: list[list[tuple[tuple[int, ...], object]]] = _kept(
        [fingerprint(u, None) for u in problem.unary],
        {e: fingerprint(m, None) for e, m in problem.edges.items()},
    )
    numbers: dict[tuple[object, ...], int] = {}
    out, work = [], 0
    for v, others in order:
        axes = (v, *others)
        shape = tuple(len(problem.unary[a]) for a in axes)
        gathered = _gathered(factors, axes)
        key = (shape, *((tuple(axes.index(a) for a in scope), cost) for scope, cost in gathered))
        if key not in numbers:
            numbers[key] = len(numbers)
            work += math.prod(shape)
            if work > WIDE_WORK:
                return None
        out.append(numbers[key])
        if others:
            factors[others[0]].append((others, ("table", numbers[key])))
    return out


def _kept(
    unary: Sequence[T], edges: Mapping[tuple[int, int], T]
) -> list[list[tuple[tuple[int, ...], T]]]:
    """Each variable's costs as :func:`_gathered` takes them: its own (``unary``), and each
    edge's with the edge's first variable in order (each cost kept once, with one of its
    ends). :func:`eliminate_wide` keeps the costs so, and :func:`_alike` their prints, so that
    both gather the same costs for each variable."""
    factors: list[list[tuple[tuple[int, ...], T]]] = [[((v,), u)] for v, u in enumerate(unary)]
    for (u, v), m in edges.items():
        factors[min(u, v)].append(((u, v), m))
    return factors


def _gathered(
    factors: list[list[tuple[tuple[int, ...], T]]], axes: tuple[int, ...]
) -> list[tuple[tuple[int, ...], T]]:
    """The costs over ``axes[0]`` (the variable folded now), taken from where they are kept:
    each with a variable of its own, which is among ``axes``."""
    v = axes[0]
    out: list[tuple[tuple[int, ...], T]] = []
    for a in axes:
        keep: list[tuple[tuple[int, ...], T]] = []
        for scope, cost in factors[a]:
            (out if v in scope else keep).append((scope, cost))
        factors[a] = keep
    return out


def _wide_order(problem: Problem) -> list[tuple[int, tuple[int, ...]]] | None:
    """The order :func:`eliminate_wide` folds the variables in, each with its neighbours
    then; ``None`` where a table would be too large."""
    sizes = [len(u) for u in problem.unary]
    near: list[set[int]] = [set() for _ in sizes]
    for u, v in problem.edges:
        near[u].add(v)
        near[v].add(u)

    def size(v: int) -> int:
        return sizes[v] * math.prod(sizes[o] for o in near[v])

    queue = [(size(v), v) for v in range(len(sizes))]
    heapq.heapify(queue)
    alive, order = set(range(len(sizes))), []
    while queue:
        was, v = heapq.heappop(queue)
        if v not in alive:
            continue
        if size(v) != was:
            heapq.heappush(queue, (size(v), v))
            continue
        if was > WIDE_TABLE:
            return None
        alive.discard(v)
        others = tuple(sorted(near[v]))
        order.append((v, others))
        for o in others:
            near[o] |= near[v] - {o}
            near[o].discard(v)
            heapq.heappush(queue, (size(o), o))
    return order
