"""Identical parts of a planning problem, solved once: what makes a model written as a Python
loop of layers plan about as fast as the same model under ``lax.scan``.

Take away a set of variables (the *separator*) and the rest falls into *parts* that no edge
joins. Given the separator's choices, the parts are independent problems; two parts with the
same variables, costs and edges, joined to the same separator variables by the same edges,
have the same cheapest choices. So each group of identical parts is kept once, its costs times
the number of parts, and every part takes the choices of the one kept: the cheapest cost is
``min over the separator of (the rest + m · one part's cheapest)``, exactly what the folded
problem computes. Nothing is lost, whatever the separator: the separator only decides how
much folds.

The separator is found as the variables that two alike neighbours join (the same costs, the
same edge): the residual stream's class that every block of a transformer reads and adds to,
a mask every block applies. The blocks of a stack then fall apart, one part each (its dots,
its weights, its activations, and in a training step its gradients), and fold into one. A
chain of layers (``h = relu(h @ w)``) joins each layer to the next through a different
variable: nothing folds, and nothing needs to (dynamic programming solves a chain in a
single pass). Costs and edges are compared by a 64-bit hash of their bytes and shape.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import xxhash

from shardwise._program.problem import Problem


@dataclass(frozen=True, slots=True)
class Folding:
    """A problem with its identical parts folded.

    Attributes:
        problem: the folded problem.
        kept: each of its variables' variable in the original problem.
        of: each original variable's variable in the folded problem (a folded part's, the
            variable it folded into).
        groups: each group of identical parts folded, each part its variables in matching
            order; with ``first_apart`` the first part is kept on its own, the others fold
            into the second.
        weights: how many parts each variable of the folded problem stands for.
    """

    problem: Problem
    kept: tuple[int, ...]
    of: tuple[int, ...]
    groups: tuple[tuple[tuple[int, ...], ...], ...]
    weights: tuple[int, ...]

    def expand(self, choice: Sequence[int]) -> tuple[int, ...]:
        """A choice per original variable from one per folded variable."""
        return tuple(int(choice[f]) for f in self.of)


Print = tuple[tuple[int, ...], int]
"""An array's shape and a hash of its bytes."""
Near = list[list[tuple[int, tuple[Print, int]]]]
"""Each variable's neighbours, each with its edge's print and which end the variable is."""


_KEPT: contextvars.ContextVar[dict[int, tuple[np.ndarray, Print]] | None] = contextvars.ContextVar(
    "shardwise_fold_prints", default=None
)
_FOLDED: contextvars.ContextVar[dict[tuple[int, bool], tuple[Problem, Folding | None]] | None] = (
    contextvars.ContextVar("shardwise_foldings", default=None)
)


@contextlib.contextmanager
def prints_kept() -> Iterator[None]:
    """Within it, each array's print is computed once: the problems one program's search and
    baselines solve share most of their arrays (a pinned problem keeps the others' costs);
    and each problem is folded once (the search's runners-up use the best plan's folding)."""
    token, folded = _KEPT.set({}), _FOLDED.set({})
    try:
        yield
    finally:
        _KEPT.reset(token)
        _FOLDED.reset(folded)


def fingerprint(a: np.ndarray, kept: dict[int, tuple[np.ndarray, Print]] | None) -> Print:
    """``a``'s print (its shape and a 64-bit hash of its values as floats), from ``kept``
    (:func:`prints_kept`'s) where it is there."""
    hit = None if kept is None else kept.get(id(a))
    if hit is not None and hit[0] is a:
        return hit[1]
    found = a.shape, xxhash.xxh3_64_intdigest(np.ascontiguousarray(a, dtype=float).data)
    if kept is not None:
        kept[id(a)] = (a, found)  # the array is kept alive with it: its id is not reused
    return found


def fold(problem: Problem, first_apart: bool = False) -> Folding | None:
    """``problem`` with each group of identical parts kept once (:class:`Folding`), or ``None``
    where no two parts are alike. ``first_apart``: each group's first part is kept on its own
    and the others fold into the next (what the runners-up need: one layer changed alone)."""
    known = _FOLDED.get()
    hit = None if known is None else known.get((id(problem), first_apart))
    if hit is not None and hit[0] is problem:
        return hit[1]
    found = _fold(problem, first_apart)
    if known is not None:
        known[(id(problem), first_apart)] = (problem, found)  # kept alive: its id is not reused
    return found


def _fold(problem: Problem, first_apart: bool) -> Folding | None:
    n = len(problem.labels)
    known = _KEPT.get()
    prints = [fingerprint(u, known) for u in problem.unary]
    near: Near = [[] for _ in range(n)]
    for (u, v), m in problem.edges.items():
        p = fingerprint(m, known)
        near[u].append((v, (p, 0)))
        near[v].append((u, (p, 1)))
    hubs = {s for s in range(n) if _joins_alike(near[s], prints)}
    while True:  # a separator that no two alike parts hang off splits a layer for nothing
        parts = _parts(near, hubs)
        signatures = [_signature(part, near, prints) for part in parts]
        part_of = {v: k for k, part in enumerate(parts) for v in part}
        idle = {s for s in hubs if not _holds_alike(near[s], part_of, signatures)}
        if not idle:
            break
        hubs -= idle
    groups: dict[tuple[object, ...], list[list[int]]] = {}
    for part, signature in zip(parts, signatures, strict=True):
        groups.setdefault(signature, []).append(part)
    folded = [parts for parts in groups.values() if len(parts) > (2 if first_apart else 1)]
    if not folded:
        return None
    return _folded(problem, [[tuple(p) for p in parts] for parts in folded], first_apart)


def restricted(problem: Problem, keep: dict[int, list[int]], within: Problem) -> None:
    """Within :func:`prints_kept`, where ``problem`` is ``within`` restricted to the choices
    ``keep`` (:meth:`Problem.restrict`) alike in every identical part of ``within``, the
    folding of ``within`` made the folding of ``problem``, so that it is not looked for again:
    the baselines pin every layer of a stack alike, and the layers still fold as they did.
    (The parts stay identical; ``problem`` might fold further, and then folds less.)"""
    known = _FOLDED.get()
    if known is None:
        return
    folding = fold(within)
    if folding is None:
        return
    for parts in folding.groups:
        first = [keep.get(v) for v in parts[0]]
        if any([keep.get(v) for v in part] != first for part in parts[1:]):
            return
    known[(id(problem), False)] = (problem, _folded(problem, folding.groups, False))


def _folded(
    problem: Problem, folded: Sequence[Sequence[tuple[int, ...]]], first_apart: bool
) -> Folding:
    """``problem`` with each group of identical parts in ``folded`` kept once."""
    n = len(problem.labels)
    into, weight = list(range(n)), [1] * n
    for parts in folded:
        rest = parts[1:] if first_apart else parts
        for part in rest[1:]:
            for a, b in zip(rest[0], part, strict=True):
                into[b] = a
        for a in rest[0]:
            weight[a] = len(rest)
    kept = [v for v in range(n) if into[v] == v]
    index = {v: k for k, v in enumerate(kept)}
    edges = {
        (index[u], index[v]): m * max(weight[u], weight[v]) if weight[u] > 1 or weight[v] > 1
        else m
        for (u, v), m in problem.edges.items()
        if into[u] == u and into[v] == v
    }  # fmt: skip
    small = Problem.of([problem.choices[v] for v in kept],
                       [problem.unary[v] * weight[v] for v in kept], edges,
                       [problem.labels[v] for v in kept])  # fmt: skip
    small = dataclasses.replace(small, considered=problem.considered,
                                truncated=problem.truncated)  # fmt: skip
    return Folding(small, tuple(kept), tuple(index[into[v]] for v in range(n)),
                   tuple(tuple(tuple(p) for p in parts) for parts in folded),
                   tuple(weight[v] for v in kept))  # fmt: skip


def _joins_alike(near: list[tuple[int, tuple[Print, int]]], prints: list[Print]) -> bool:
    """Whether two of a variable's neighbours are alike: the same costs, the same edge to it."""
    seen = set()
    for u, edge in near:
        key = (prints[u], edge)
        if key in seen:
            return True
        seen.add(key)
    return False


def _holds_alike(
    near: list[tuple[int, tuple[Print, int]]],
    part_of: dict[int, int],
    signatures: list[tuple[object, ...]],
) -> bool:
    """Whether two of the parts a separator variable joins are alike."""
    seen = set()
    for k in {part_of[u] for u, _ in near if u in part_of}:
        if signatures[k] in seen:
            return True
        seen.add(signatures[k])
    return False


def _parts(near: Near, hubs: set[int]) -> list[list[int]]:
    """The variables but ``hubs`` in groups that no edge joins, each in variable order."""
    part = [-1] * len(near)
    out: list[list[int]] = []
    for v in range(len(near)):
        if v in hubs or part[v] >= 0:
            continue
        part[v], members, stack = len(out), [v], [v]
        while stack:
            for u, _ in near[stack.pop()]:
                if u not in hubs and part[u] < 0:
                    part[u] = part[v]
                    members.append(u)
                    stack.append(u)
        out.append(sorted(members))
    return out


def _signature(part: list[int], near: Near, prints: list[Print]) -> tuple[object, ...]:
    """What two parts must share to fold: their variables' costs in order, their edges
    between them, and their edges to the separator (which variable, which edge)."""
    local = {v: k for k, v in enumerate(part)}
    inner: list[tuple[int, int, tuple[Print, int]]] = []
    outer: list[tuple[int, int, tuple[Print, int]]] = []
    for v in part:
        for u, edge in near[v]:
            if u not in local:
                outer.append((local[v], u, edge))
            elif local[u] > local[v]:
                inner.append((local[v], local[u], edge))
    return (
        tuple(prints[v] for v in part),
        tuple(sorted(inner)),
        tuple(sorted(outer)),
    )
