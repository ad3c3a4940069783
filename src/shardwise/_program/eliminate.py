"""Exact dynamic programming over a planning problem: variables with one or two neighbours
are folded into them (eliminated), as dynamic programming over a chain or a tree does; a
problem whose edges form a forest (a chain of layers is one) is solved by that alone, and
what is left is the part an integer program must solve
(:func:`~shardwise._program.search.solve`)."""

from __future__ import annotations

import dataclasses
import heapq
import math
from typing import Any

import numpy as np

from shardwise._program.problem import Problem

Folded = tuple[int, tuple[int, ...], Any]
"""A variable folded into its neighbours, and its best choice for each of theirs."""


def eliminate(
    problem: Problem, protected: set[int], tables: list[np.ndarray] | None = None
) -> tuple[Problem, list[Folded]]:
    """Fold every unprotected variable of degree ≤ 2 into its neighbours, exactly: a leaf adds
    its best cost to its neighbour's choices; a link between two neighbours becomes an edge
    whose cost is the best over the link's choices; a variable with one choice adds its edges'
    costs to its neighbours' choices, whatever its degree. Returns the rest and how to recover each
    folded variable's choice from its neighbours'. ``tables``, where given, gets each folded
    variable's cost over its choices and its neighbours' as it was folded (axes: the variable,
    then its neighbours in the order of its :data:`Folded`; a variable with one choice: its own
    cost, with its edges to variables with one choice folded before it)."""
    n = len(problem.labels)
    unary = [u.astype(float) for u in problem.unary]
    near: list[dict[int, np.ndarray]] = [{} for _ in range(n)]
    for (u, v), m in problem.edges.items():  # (no copy: every sum below makes a new array)
        near[u][v] = m if v not in near[u] else near[u][v] + m
        near[v][u] = m.T if u not in near[v] else near[v][u] + m.T
    steps = _constants(unary, near, protected, tables)
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
        if not others:
            scores = unary[v]
            steps.append((v, (), _first_best(scores)))
        elif len(others) == 1:
            (a,) = others
            scores = unary[v][:, None] + near[v][a]
            unary[a] = unary[a] + scores.min(axis=0)
            steps.append((v, (a,), _first_best(scores)))
            del near[a][v]
        else:
            a, b = others
            scores = unary[v][:, None, None] + near[v][a][:, :, None] + near[v][b][:, None, :]
            link = scores.min(axis=0)
            steps.append((v, (a, b), _first_best(scores, link)))
            del near[a][v], near[b][v]
            near[a][b] = near[a].get(b, 0) + link
            near[b][a] = near[b].get(a, 0) + link.T
        if tables is not None:
            tables.append(scores)
        for o in others:
            if len(near[o]) <= 2:
                heapq.heappush(queue, (size(o), o))
    keep = sorted(alive)
    position = {v: k for k, v in enumerate(keep)}
    edges = {(position[v], position[o]): m for v in keep for o, m in near[v].items() if v < o}
    core = Problem.of([problem.choices[v] for v in keep], [unary[v] for v in keep], edges,
                      [problem.labels[v] for v in keep])  # fmt: skip
    return dataclasses.replace(core, considered=problem.considered), steps


TIE = 1e-12
"""Choices whose costs are this close, relative to their size, cost the same: the sums behind
them may differ in their last bits with the order they were added in."""


def _first_best(scores: np.ndarray, least: np.ndarray | None = None) -> Any:
    """The first of the cheapest choices (axis 0) for each choice of the neighbours: the
    same plan whatever order the costs were added in (``least``: ``scores.min(axis=0)``,
    where already at hand)."""
    least = scores.min(axis=0) if least is None else least
    return np.argmax(scores <= least + TIE * np.abs(least), axis=0)


def _constants(
    unary: list[np.ndarray],
    near: list[dict[int, np.ndarray]],
    protected: set[int],
    tables: list[np.ndarray] | None,
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
    return steps
