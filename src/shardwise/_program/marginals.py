"""The cheapest plan with each variable held at each of its choices, at once, for a problem
that dynamic programming solves: what the runners-up need (the best plan that lays an input
out another way), without solving the problem again per choice.

:func:`~shardwise._program.eliminate.eliminate` folds each variable into at most two neighbours;
the variable and those neighbours are a *clique*, and each clique's *parent* is the clique of
the first of its neighbours folded after it: a junction tree. One pass back down that tree
turns each clique's table (its cost as it was folded: the variable's own, its edges', and
what the cliques folded into it before bring) into its *min-marginal*: the cheapest cost of
the whole problem with the clique's variables at each of their choices. A parent passes its
own min-marginal over the two cliques' shared variables, less what the child had passed up
(costs add, so the exchange is exact: Hugin propagation in the min-sum semiring).

A plan with one variable held at a choice is read from that variable's clique outwards, each
next clique's free variables at their cheapest given the ones already read; where the shared
variables keep the best plan's choices, the best plan's choices beyond them stay (the cheapest
completion beyond depends only on what is shared), so reading a plan costs the part of the
program it changes, not the whole program.

Among plans that cost the same (a stack of identical layers has many: the same change at any
layer), the one that changes fewest choices of the best plan is read: each choice but the best
plan's costs :data:`NUDGE` of the best plan's time over the number of variables more, so no
two plans that differ in cost by more than that swap places.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from shardwise._program.eliminate import eliminate
from shardwise._program.fold import Folding, fold
from shardwise._program.problem import Problem
from shardwise._program.summed import Summed

NUDGE = 1e-8
"""What changing every choice of the best plan costs more, relative to its time, when plans
are read from the min-marginals: it breaks ties between plans that cost the same towards the
one nearest the best plan (the min-marginals' rounding is far smaller)."""


@dataclass(frozen=True, slots=True)
class Marginals:
    """A problem's cliques, each with its min-marginal, and how they join.

    Attributes:
        base: the best plan, a choice per variable, that ties are broken towards.
        nudge: what each choice but the best plan's costs more (seconds), per variable it
            stands for; :data:`NUDGE` of the best plan's time in all.
        cliques: each variable's clique: the variable, then the neighbours it was folded into.
        tables: each clique's min-marginal over its own tree of cliques (seconds, with the
            nudges), axes in its order (a large one kept as its terms, a
            :class:`~shardwise._program.summed.Summed`).
        rest: what the rest of the problem adds to each clique's table at its cheapest (its
            other trees, and the variables with one choice).
        near: each variable's neighbouring cliques in the tree (its parent and children).
    """

    base: tuple[int, ...]
    nudge: float
    cliques: tuple[tuple[int, ...], ...]
    tables: tuple[np.ndarray | Summed, ...]
    rest: tuple[float, ...]
    near: tuple[tuple[int, ...], ...]

    def best(self, v: int) -> np.ndarray:
        """The cheapest cost of the whole problem with variable ``v`` at each choice (with
        the nudges of the choices it changes)."""
        table = self.tables[v]
        least = table.min(axis=tuple(range(1, table.ndim)))  # (1-D: a copy of the table)
        return least + self.rest[v]

    def held(self, v: int, c: int) -> tuple[int, ...]:
        """A cheapest choice per variable with ``v`` held at choice ``c``, nearest the best
        plan: read from ``v``'s clique outwards, as far as choices change."""
        fixed = {v: c}
        _assign(self.cliques[v], self.tables[v], fixed)
        queue, seen = [v], {v}
        while queue:
            x = queue.pop()
            for y in self.near[x]:
                if y in seen:
                    continue
                seen.add(y)
                shared = set(self.cliques[x]) & set(self.cliques[y])
                if all(fixed[u] == self.base[u] for u in shared):
                    continue  # beyond it, the best plan's choices are still the cheapest
                _assign(self.cliques[y], self.tables[y], fixed)
                queue.append(y)
        choice = list(self.base)
        for u, k in fixed.items():
            choice[u] = k
        return tuple(choice)


def _assign(clique: tuple[int, ...], table: np.ndarray | Summed, fixed: dict[int, int]) -> None:
    """The clique's variables not yet in ``fixed`` at their cheapest, given those that are."""
    free = [u for u in clique if u not in fixed]
    if free:
        sub = table[tuple(fixed.get(u, slice(None)) for u in clique)]
        at = np.unravel_index(int(np.argmin(sub)), sub.shape)
        fixed.update({u: int(k) for u, k in zip(free, at, strict=True)})


def marginals(
    problem: Problem, base: Sequence[int], seconds: float, weights: Sequence[int] = ()
) -> Marginals | None:
    """Every clique's min-marginal (:class:`Marginals`) around ``base``, a cheapest plan of
    ``problem`` (``seconds`` its cost), or ``None`` where dynamic programming alone does not
    solve ``problem`` (a part of it is left to an integer program). ``weights``: how many
    variables each stands for (a folded problem's), each change nudged as many times."""
    weights = list(weights) or [1] * len(base)
    nudge = NUDGE * abs(seconds) / max(sum(weights), 1)
    nudged = [
        u + nudge * w * (np.arange(len(u)) != b)
        for u, b, w in zip(problem.unary, base, weights, strict=True)
    ]
    tables: list[np.ndarray | Summed] = []
    sent: list[np.ndarray | None] = []  # (what each clique passed up: its table's least)
    core, steps = eliminate(Problem.of(problem.choices, nudged, problem.edges), set(), tables,
                            sent)  # fmt: skip
    if core.labels:
        return None
    order = {v: k for k, (v, _, _) in enumerate(steps)}
    n = len(problem.labels)
    cliques: list[tuple[int, ...]] = [(v,) for v in range(n)]
    beliefs: list[np.ndarray | Summed] = [np.zeros(1) for _ in range(n)]
    near: list[list[int]] = [[] for _ in range(n)]
    root = list(range(n))  # each clique's tree: the problem's parts that share no edge
    constant = 0.0  # the own costs of variables with one choice, which folding drops
    for (v, others, _), table, up in zip(reversed(steps), reversed(tables), reversed(sent),
                                         strict=True):  # fmt: skip
        cliques[v] = (v, *others)
        if len(problem.choices[v]) == 1:
            constant += float(table[0])
        elif not others:
            beliefs[v] = table
        else:
            parent = min(others, key=order.__getitem__)
            root[v] = root[parent]
            near[v].append(parent)
            near[parent].append(v)
            assert up is not None
            outside = _onto(beliefs[parent], cliques[parent], others) - up
            if isinstance(table, Summed):
                beliefs[v] = table.plus(outside, tuple(range(1, table.ndim)))
            else:  # (in place: elimination's tables are its own)
                table += outside[None]
                beliefs[v] = table
    # each tree's min-marginals, plus the cheapest cost of every other tree and the constants
    least = {r: float(beliefs[r].min()) for r in set(root)}
    whole = sum(least.values()) + constant
    rest = tuple(whole - least[root[v]] for v in range(n))
    return Marginals(tuple(base), nudge, tuple(cliques), tuple(beliefs), rest,
                     tuple(tuple(x) for x in near))  # fmt: skip


def _onto(table: np.ndarray | Summed, clique: tuple[int, ...], keep: tuple[int, ...]) -> np.ndarray:
    """``table`` (axes: ``clique``) at its cheapest over every variable but ``keep``, with its
    axes in the order of ``keep``."""
    drop = tuple(k for k, u in enumerate(clique) if u not in keep)
    reduced = table.min(axis=drop)  # (none dropped: a copy of the table)
    left = [u for u in clique if u in keep]
    return reduced.transpose([left.index(u) for u in keep])


@dataclass(frozen=True, slots=True)
class Alternatives:
    """The cheapest plan with any one variable held at any choice, from the min-marginals of
    the problem with its identical parts folded, all but one of each group
    (:func:`~shardwise._program.fold.fold` with ``first_apart``): one layer of a stack held
    at a choice is the part kept apart held so, the other layers as they were. A variable of
    another layer takes the choices of its counterpart in the part kept apart.

    Attributes:
        marginals: the folded problem's min-marginals.
        folding: the folding (``None``: nothing folded).
        source: each variable's counterpart in the folded problem.
        swaps: for a variable of a folded part, that part, the part kept apart and the part
            the others folded into, each its variables in matching order.
        spread: the most the nudges add to a plan's cost.
    """

    marginals: Marginals
    folding: Folding | None
    source: tuple[int, ...]
    swaps: dict[int, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]
    spread: float

    def best(self, v: int) -> np.ndarray:
        """The cheapest cost with variable ``v`` at each choice (with the nudges)."""
        return self.marginals.best(self.source[v])

    def held(self, v: int, c: int) -> tuple[int, ...]:
        """A cheapest choice per variable with ``v`` at choice ``c``, nearest the best plan."""
        small = self.marginals.held(self.source[v], c)
        if self.folding is None:
            return small
        whole = list(self.folding.expand(small))
        if v in self.swaps:  # its part takes the choices of the part kept apart, and back
            part, first, rest = self.swaps[v]
            of = self.folding.of
            for a, f, r in zip(part, first, rest, strict=True):
                whole[a], whole[f] = small[of[f]], small[of[r]]
        return tuple(whole)


def alternatives(problem: Problem, base: Sequence[int], seconds: float) -> Alternatives | None:
    """:class:`Alternatives` around ``base``, a cheapest plan of ``problem`` that gives alike
    parts alike choices (as :func:`~shardwise._program.search.solve` finds it), or ``None``
    where dynamic programming alone does not solve ``problem``."""
    folding = fold(problem, first_apart=True)
    if folding is not None and any(
        base[a] != base[f]
        for parts in folding.groups
        for p in parts
        for a, f in zip(p, parts[0], strict=True)
    ):
        folding = None  # the best plan differs between alike parts: read it unfolded
    spread = NUDGE * abs(seconds)
    if folding is None:
        found = marginals(problem, base, seconds)
        n = len(base)
        return None if found is None else Alternatives(found, None, tuple(range(n)), {}, spread)
    small = marginals(folding.problem, [base[v] for v in folding.kept], seconds, folding.weights)
    if small is None:
        return None
    source = list(folding.of)
    swaps = {}
    for parts in folding.groups:
        for part in parts[1:]:
            for a, f in zip(part, parts[0], strict=True):
                source[a] = folding.of[f]
                swaps[a] = (part, parts[0], parts[1])
    return Alternatives(small, folding, tuple(source), swaps, spread)
