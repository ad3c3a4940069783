"""Find the cheapest choice for every variable of a :class:`Problem`.

- variables with one or two neighbours are eliminated exactly, as dynamic programming over a
  chain does; a problem whose edges form a forest (a chain of layers is one) is solved by that
  alone, and so is one whose every variable can then be folded into all its neighbours at
  once with small tables (:func:`~shardwise._program.eliminate.eliminate_wide`);
- what is left (cycles: residual connections, operands shared by several dots), and variables
  a memory budget or an excluded solution names, form an integer program solved by HiGHS (its
  linear relaxation first, with the dual simplex: where integral it is the optimum; else
  :func:`scipy.optimize.milp`): one binary per choice, and per edge one continuous variable
  per pair of choices whose marginals are the two ends' choices (exact when the binaries are
  integral; :mod:`~shardwise._program.integer`). HiGHS proves optimality or says it stopped
  at its time limit.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import numpy as np

from shardwise._program.eliminate import eliminate, eliminate_wide
from shardwise._program.fold import Print, fingerprint, fold
from shardwise._program.integer import Constraint, milp
from shardwise._program.local import Stacks, descend, neighbours
from shardwise._program.problem import Problem, Solution, total

TIME_LIMIT_S = 60.0
"""How long one solve's integer programs may run, all rounds together; past it the best
solution found is used and the plan says it is not proven optimal."""


def solve(
    problem: Problem,
    constraints: Sequence[Constraint] = (),
    exclude: Sequence[dict[int, int]] = (),
    time_limit: float = TIME_LIMIT_S,
    hint: Sequence[int] | None = None,
) -> Solution | None:
    """The cheapest feasible choice, or ``None`` where none fits the constraints.

    Identical parts (the layers of a stack) are solved once (:mod:`~shardwise._program.fold`;
    not under constraints, which count each part apart). Variables with at most two neighbours
    (and in no constraint) are eliminated exactly first, as dynamic programming over chains and
    trees does; what is left, if anything, is an integer program (its linear relaxation first:
    where that is integral, it is the optimum). ``hint``: a choice per variable close to the
    answer (a neighbouring problem's: memory priced a little higher), from which an integer
    program too large to solve whole picks its likeliest choices first (:func:`_core`).
    """
    start = time.perf_counter()
    folded, small = [], problem
    while not (constraints or exclude) and (folding := fold(small)) is not None:
        folded.append(folding)  # folded parts may make parts alike in turn
        small = folding.problem
        hint = None if hint is None else [hint[v] for v in folding.kept]
    if folded:
        found = _solve(small, (), (), time_limit, hint)
        assert found is not None  # only constraints make a problem infeasible
        whole = found.choice
        for folding in reversed(folded):
            whole = folding.expand(whole)
        seconds = time.perf_counter() - start
        return Solution(whole, total(problem, whole), found.optimal, found.method, seconds)
    return _solve(problem, constraints, exclude, time_limit, hint)


def _solve(
    problem: Problem,
    constraints: Sequence[Constraint],
    exclude: Sequence[dict[int, int]],
    time_limit: float,
    hint: Sequence[int] | None = None,
) -> Solution | None:
    start = time.perf_counter()
    protected = {v for c in constraints for v, _, _ in c.terms} | {v for e in exclude for v in e}
    core, steps = eliminate(problem, protected)
    method, optimal = "dynamic programming", True
    choice = [-1] * len(problem.labels)
    at = {label: k for k, label in enumerate(problem.labels)}
    of = [at[label] for label in core.labels]  # (each core variable's in the problem)
    free = not (constraints or exclude)  # (rows and exclusions are the integer program's)
    wide = eliminate_wide(core) if core.labels and free else None
    if wide is not None:  # (exact)
        steps += [(of[v], tuple(of[o] for o in near), best) for v, near, best in wide]
        method = WIDE
    elif core.labels:
        index = {p: k for k, p in enumerate(of)}  # (each problem variable's in the core)
        kept = _dominant(core, {index[v] for v in protected})
        ours = [Constraint(tuple((index[v], c, b) for v, c, b in x.terms), x.limit)
                for x in constraints]  # fmt: skip
        theirs = [{index[v]: c for v, c in e.items()} for e in exclude]
        given = None if hint is None else [hint[k] for k in of]
        found = _core(core, kept, ours, theirs, time_limit, given)
        if found is None:
            return None
        picked, optimal, method = found
        for k, c in zip(of, picked, strict=True):
            choice[k] = c
        if steps:
            method = f"dynamic programming + {method}"
    for v, near, best in reversed(steps):
        choice[v] = int(best[tuple(choice[n] for n in near)]) if near else int(best)
    seconds = time.perf_counter() - start
    return Solution(tuple(choice), total(problem, choice), optimal, method, seconds)


WIDE = "dynamic programming over cycles"
"""The method of a plan that :func:`~shardwise._program.eliminate.eliminate_wide` found
(exact; its runners-up come from local search, :func:`~shardwise._program.top.runners_up`)."""

MAX_PAIRS = 1_000_000
"""The most pairs of choices the integer program's edges may join (a variable each, before
equal rows merge): a mesh of four axes gives arrays thousands of layouts, and a transformer's
training step 132 edges of 84 million pairs, whose integer program ran the machine out of
memory. Past it each variable keeps its :func:`likeliest` choices, as many as fit."""

NARROWED = "over each array's likeliest layouts"
"""What the method of a plan found by integer programs over :func:`likeliest` choices says."""

ROUNDS = 4
"""How many integer programs over :func:`likeliest` choices :func:`_core` solves at most."""


def _core(
    core: Problem,
    kept: dict[int, list[int]],
    constraints: Sequence[Constraint],
    exclude: Sequence[dict[int, int]],
    time_limit: float,
    given: Sequence[int] | None = None,
) -> tuple[list[int], bool, str] | None:
    """The choices of what elimination left (``kept``: those no other dominates), whether
    proven optimal, and how found: one integer program where its edges join at most
    :data:`MAX_PAIRS` pairs of choices; else integer programs over each variable's
    :func:`likeliest` choices, first by a bound (or given the choices ``given``), then given
    the best plan found (each followed by a local search over every choice, where no budget
    or excluded plan binds it), until one finds no better plan."""
    near = neighbours(core)  # (once, for every round's choices and local search)
    keep = likeliest(core, kept, constraints, MAX_PAIRS, near, given)
    if keep is None:
        return _over(core, kept, constraints, exclude, time_limit)
    method = f"integer program (HiGHS) {NARROWED}"
    best: tuple[list[int], float] | None = None
    free = not (constraints or exclude)  # (a local search could break a budget)
    stacks = Stacks(near)
    deadline = time.perf_counter() + time_limit  # (the rounds share it)
    for _ in range(ROUNDS):
        if best is not None and time.perf_counter() >= deadline:
            break
        left = max(deadline - time.perf_counter(), 0.0)
        found = _over(core, keep, constraints, exclude, left, rounded=True)
        if found is None and not free:
            break
        picked = found[0] if found else [_cheapest(core, v, keep) for v in range(len(core.unary))]
        if free:
            picked = list(descend(core, picked, -1, near, stacks=stacks).choice)
        cost = total(core, picked)
        if best is not None and cost >= best[1] * (1 - 1e-12):
            break
        best = picked, cost
        keep = likeliest(core, kept, constraints, MAX_PAIRS, near, picked) or keep
    if best is None:
        return None
    local = ", each rounded and then improved by local search" if free else ""
    return best[0], False, method + local


def _cheapest(problem: Problem, v: int, keep: dict[int, list[int]]) -> int:
    """``v``'s choice among ``keep``'s of least cost of its own (where no relaxation is
    solved in time: a start for the local search)."""
    ix = keep.get(v, range(len(problem.unary[v])))
    return min(ix, key=lambda c: float(problem.unary[v][c]))


def likeliest(
    problem: Problem,
    kept: dict[int, list[int]],
    constraints: Sequence[Constraint],
    limit: int,
    near: Sequence[Sequence[tuple[int, np.ndarray]]],
    given: Sequence[int] | None = None,
) -> dict[int, list[int]] | None:
    """Where ``problem``'s edges (over the choices ``kept``) join more than ``limit`` pairs of
    choices, the likeliest of each variable's, as many as keep them within it: those whose own
    cost plus each edge's is least, the edge's at the neighbour's choice ``given``, or without
    one the least it could be (a bound from below); with the one ``given``, and the one that
    takes the fewest bytes in ``constraints`` (the budget's), so the smallest plan stays
    possible. ``None`` where the problem is within ``limit``. ``near``: :func:`neighbours`
    of ``problem``."""
    sizes = [len(kept[v]) if v in kept else len(u) for v, u in enumerate(problem.unary)]
    if sum(sizes[u] * sizes[v] for u, v in problem.edges) <= limit:
        return None
    allowed = [np.array(kept[v]) if v in kept else np.arange(n) for v, n in enumerate(sizes)]
    many = max(2, math.isqrt(limit // max(1, len(problem.edges))) - 2)  # (2: those also kept)
    smallest: dict[int, tuple[float, int]] = {}
    for x in constraints:
        for v, c, b in x.terms:
            smallest[v] = min(smallest.get(v, (b, c)), (b, c))
    out: dict[int, list[int]] = {}
    for v, ix in enumerate(allowed):
        if len(ix) <= many:
            if v in kept:
                out[v] = kept[v]
            continue
        edges = (m[ix].min(axis=1) if given is None else m[ix, given[u]] for u, m in near[v])
        best = ix[np.argsort(problem.unary[v][ix] + sum(edges, 0.0), kind="stable")[:many]]
        also = ([smallest[v][1]] if v in smallest else []) + ([given[v]] if given else [])
        out[v] = sorted({*best.tolist(), *also})
    return out


def _over(
    core: Problem,
    kept: dict[int, list[int]],
    constraints: Sequence[Constraint],
    exclude: Sequence[dict[int, int]],
    time_limit: float,
    rounded: bool = False,
) -> tuple[list[int], bool, str] | None:
    """The integer program of ``core`` over the choices ``kept``: its plan (the core's choices)
    and whether it is proven optimal; ``constraints`` and ``exclude`` over those choices (a
    dropped choice's terms go, as it cannot be chosen, and so does an excluded combination
    with one, as it cannot be made); ``rounded``: :func:`~.integer.milp`'s."""
    new = {v: {c: k for k, c in enumerate(ix)} for v, ix in kept.items()}

    def at(v: int, c: int) -> int | None:
        return new[v].get(c) if v in new else c

    ours = [Constraint(tuple((v, k, b) for v, c, b in x.terms if (k := at(v, c)) is not None),
                       x.limit) for x in constraints]  # fmt: skip
    theirs = [{v: at(v, c) for v, c in e.items()} for e in exclude]
    possible = [{v: k for v, k in e.items() if k is not None} for e in theirs
                if None not in e.values()]  # fmt: skip
    found = milp(core.restrict(kept), ours, possible, time_limit, rounded)
    if found is None:
        return None
    picked = [kept[v][c] if v in kept else c for v, c in enumerate(found[0])]
    return picked, found[1], "integer program (HiGHS)"


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
    each against its neighbours' choices as they stand. A variable with the same costs, the
    same edges (in the same order) and neighbours whose choices stand alike as one pruned
    before (a layer of a stack that does not fold, a chain's) keeps what that one kept, without
    comparing its choices again (costs and edges compared by their prints, as
    :mod:`~shardwise._program.fold` compares them)."""
    near = neighbours(problem)
    ends: list[list[tuple[tuple[int, int], int]]] = [[] for _ in problem.labels]  # (near's)
    for u, v in problem.edges:
        ends[u].append(((u, v), 0))
        ends[v].append(((u, v), 1))
    prints: dict[tuple[int, int], Print] = {}  # (each edge's, where a variable reads it)
    pruned: dict[tuple[object, ...], list[int]] = {}  # what a variable alike kept
    kept: dict[int, list[int]] = {}
    for v, unary in enumerate(problem.unary):
        if v in protected or len(unary) < 2:
            continue
        if len(unary) ** 2 * sum(m.shape[1] for _, m in near[v]) > DOMINANCE_WORK:
            continue  # (the comparisons would cost more than the choices they might drop)
        for e, _ in ends[v]:
            if e not in prints:
                prints[e] = fingerprint(problem.edges[e], None)
        key = (fingerprint(unary, None), *((prints[e], end, tuple(kept.get(a, ())))
                                           for (e, end), (a, _) in zip(ends[v], near[v],
                                                                       strict=True)))  # fmt: skip
        alive = pruned.get(key)
        if alive is None:
            alive = pruned[key] = _undominated(unary, [m[:, kept[a]] if a in kept else m
                                                       for a, m in near[v]])  # fmt: skip
        if len(alive) < len(unary):
            kept[v] = alive
    return kept


def _undominated(unary: np.ndarray, edges: list[np.ndarray]) -> list[int]:
    """The choices of a variable of costs ``unary`` that no other dominates, its edges'
    matrices ``edges`` (oriented from it), in order (:func:`_dominant`)."""
    worst = unary[:, None] - unary[None, :]  # worst[i, j]: i's cost over j's, at most
    for m in edges:
        worst = worst + (m[:, None, :] - m[None, :, :]).max(axis=2)
    tol = 1e-12 * max(float(np.abs(unary).max()), 1e-30)
    alive: list[int] = []
    for j in np.argsort(unary, kind="stable"):
        if not any(worst[i, j] <= tol for i in alive):
            alive.append(int(j))
    return sorted(alive)
