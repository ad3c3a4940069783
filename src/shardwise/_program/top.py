"""The search's plans of a program: the cheapest, and runners-up that lay out some input
another way; and each one's peak against a memory budget (the baselines' plans:
:mod:`.baseline_plans`)."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping

import numpy as np

from shardwise._model.mesh import MeshSpec
from shardwise._model.profile import Profile
from shardwise._program.fold import fold
from shardwise._program.graph import Graph
from shardwise._program.integer import Constraint
from shardwise._program.local import Stacks, at_rest, moved, neighbours, settle
from shardwise._program.marginals import Alternatives, alternatives
from shardwise._program.memory import memory_constraints, peak_bytes
from shardwise._program.pins import input_vars
from shardwise._program.problem import Problem, Solution, total
from shardwise._program.search import NARROWED, solve
from shardwise._program.solution import read
from shardwise._program.within import held, solve_within, tightened

TRIES_PAST_TOP = 20
"""How many more plans than ``top`` the search may find and set aside under a budget because
their predicted peak (every buffer counted) is over it, though the integer program's memory
constraints (the fullest program points) let them through."""


def best_plans(
    graph: Graph,
    problem: Problem,
    mesh: MeshSpec,
    budget: int | None,
    top: int,
    time_limit: float,
    fits: Callable[[Solution], bool] = lambda sol: True,
    peak_of: Callable[[Solution], int] | None = None,
    unbounded: Solution | None = None,
) -> list[Solution]:
    """Up to ``top`` plans of ``problem``, the cheapest first: the search's best, then
    :func:`runners_up`; under a memory ``budget``, each next one by an integer program that
    excludes the input layouts already found (a local move may break the budget); only those
    that ``fits`` (with ``respect="names"``, rules can write them) and whose ``peak_of``
    (every buffer counted) is within the budget: none, where none is.

    The integer program's memory constraints count the arrays at the fullest program points,
    not every buffer, so a plan can pass them and be over the budget: each one set aside
    tightens them by the share it was over (a Llama's AdamW step on a TPU had set aside 21
    plans, 45 s of integer programs, none fitting, while FSDP's fit in half the budget).
    A plan set aside leaves the ones after it not proven optimal. ``unbounded``: the search's
    best plan without a budget, where found already.

    Under a budget ``time_limit`` bounds the whole search once a plan is found: each next
    integer program gets what is left of it, and none starts after it (its plan's method
    says so). Each had taken the whole limit: Llama-3 8B's AdamW step on 8 v5p chips ran
    for more than 15 minutes, its runners-up one branch and bound after another."""
    inputs = sorted(set(input_vars(graph, problem)))
    if budget is None:
        first = solve(problem, time_limit=time_limit)
        assert first is not None  # only constraints make a problem infeasible
        return [first, *(s for s in runners_up(problem, inputs, first, top - 1, time_limit)
                         if fits(s))]  # fmt: skip
    # a local move may break a budget: find each next plan by excluding the ones found, one
    # integer program each
    constraints = memory_constraints(graph, problem, budget, mesh)
    found: list[Solution] = []
    exclude: list[dict[int, int]] = []
    deadline = time.perf_counter() + time_limit
    most = budget

    def below(sol: Solution) -> bool:  # the budget, by its peak (every buffer counted)
        return peak_of is None or peak_of(sol) <= most

    for _ in range(top + TRIES_PAST_TOP):
        left = deadline - time.perf_counter()
        if found and left <= 0:
            break
        seconds = min(time_limit, left) if found else time_limit
        sol = solve_within(problem, constraints, exclude, seconds, unbounded)
        if sol is None:
            break
        exclude.append({v: sol.choice[v] for v in inputs})
        need = peak_of(sol) if peak_of is not None else 0
        if need <= budget and fits(sol):
            proven = sol.optimal and len(exclude) == len(found) + 1
            found.append(dataclasses.replace(sol, optimal=proven))
            if sol.priced is not None and NARROWED in sol.method and len(found) < top:
                more = _priced_runners_up(problem, inputs, sol, constraints, top - len(found),
                                          lambda s: fits(s) and below(s), time_limit)  # fmt: skip
                found += more
                exclude += [{v: s.choice[v] for v in inputs} for s in more]
            if len(found) == top:
                break
        elif need > budget:
            constraints = tightened(constraints, sol, budget / need)
    if 0 < len(found) < top and time.perf_counter() >= deadline:
        note = f"; runners-up cut short by the time limit ({time_limit:g} s)"
        found[0] = dataclasses.replace(found[0], method=found[0].method + note)
    return found


def _priced_runners_up(
    problem: Problem, inputs: list[int], best: Solution, constraints: list[Constraint],
    count: int, keeps: Callable[[Solution], bool], time_limit: float,
) -> list[Solution]:  # fmt: skip
    """Up to ``count`` runners-up of ``best``, a plan found with memory priced in
    (:func:`~shardwise._program.within.priced`) by integer programs over each array's
    likeliest layouts (a problem too large to solve whole, where an integer program with the
    plans found excluded is no exact next plan either): the :func:`runners_up` of the problem
    it was found in, the cheapest there first, that keep the memory rows ``constraints`` and
    ``keeps`` (the budget by their peak), each costed in ``problem``. Llama-3 8B's AdamW step
    on 8 v5p chips had found none in the 22 s its time limit left, one such integer program
    after another; it finds two in under a second."""
    assert best.priced is not None
    costed, method = best.priced, best.method.removesuffix(", memory priced in")
    start = dataclasses.replace(best, seconds=total(costed, best.choice), method=method)
    out: list[Solution] = []
    for sol in runners_up(costed, inputs, start, count + TRIES_PAST_TOP, time_limit):
        if all(held(c, sol) <= c.limit for c in constraints) and keeps(sol):
            out.append(dataclasses.replace(sol, seconds=total(problem, sol.choice),
                                           optimal=False, method=best.method))  # fmt: skip
            if len(out) == count:
                break
    return out


def runners_up(
    problem: Problem, inputs: list[int], best: Solution, count: int, time_limit: float
) -> list[Solution]:
    """For each input, the best plan that lays it out another way, cheapest first: what the
    best plan's choice for that input is worth (then each input's second best, and so on).

    Where dynamic programming solved the problem, each is exact, read from the min-marginals
    of one pass over the problem (:mod:`~shardwise._program.marginals`), and the first of
    them is the second-best plan overall (it must lay out some input differently). Where an
    integer program or dynamic programming over cycles did, each is found by local search
    from the best plan (:func:`~shardwise._program.local.descend`): one integer program per
    input layout took seconds (a 2-layer transformer's training step has 113), and the
    min-marginals of the wide tables of 24 layers' training step about eight times as long
    as the local search."""
    if count < 1:
        return []
    exact = best.method == "dynamic programming"
    found = alternatives(problem, best.choice, best.seconds) if exact else None
    if found is not None:
        return _held(problem, inputs, best, count, found)
    position = {u: k for k, u in enumerate(inputs)}
    layouts = [best.choice[v] for v in inputs]  # the inputs' choices
    seen = {tuple(layouts)}
    searches = _Searches(problem, best)
    out: list[tuple[int, float, dict[int, int], float]] = []
    for v in inputs:
        others = []
        for cost, changes, seconds in searches.of(v):
            key = _with(list(layouts), position, changes)
            if key not in seen:
                seen.add(key)
                others.append((cost, changes, seconds))
        others.sort(key=lambda found: found[0])
        out += [(rank, *found) for rank, found in enumerate(others)]
    # each input's best alternative first, then each one's second best, ...
    kept = sorted(out, key=lambda r: r[:2])[:count]
    chosen = [_with(list(best.choice), range(len(best.choice)), changes) for *_, changes, _ in kept]
    return [
        Solution(x, total(problem, x), False, "local search", seconds)
        for x, (*_, seconds) in zip(chosen, kept, strict=True)
    ]


_Near = list[list[tuple[int, np.ndarray]]]
Found = list[tuple[float, dict[int, int], float]]
"""Plans near the best: each one's cost, its changes to the best plan (variable → choice)
and how long its search took."""


class _Searches:
    """:func:`runners_up`'s local searches from the best plan, each variable held at each of
    its other choices, made once per layer of a stack:

    - a variable of an identical part (:func:`~shardwise._program.fold.fold`) whose twin in
      its group's first part was searched already: the twin's searches, mirrored (swapping two
      identical parts changes no cost);
    - a variable outside the identical parts (the residual stream every block reads): searched
      in the folded problem, where the parts settle as one, each change then made in every
      part it stands for.

    Both only where the best plan lays the parts of each group out alike (as a folded solve
    does); otherwise each search runs in the whole problem."""

    def __init__(self, problem: Problem, best: Solution) -> None:
        self.problem, self.best = problem, best
        self.twins: dict[int, tuple[int, dict[int, int]]] = {}
        self.found: dict[int, Found] = {}
        self.near = neighbours(problem)
        self.stacks = Stacks(self.near)
        self.folded: tuple[Problem, Solution, _Near, Stacks, dict[int, list[int]]] | None = None
        self.index: dict[int, int] = {}  # a variable outside the parts: its folded variable
        self.rest: dict[int, bool] = {}  # :meth:`resting`, by the problem's id
        folding = fold(problem)
        if folding is None:
            return
        small = tuple(best.choice[v] for v in folding.kept)
        if folding.expand(small) != best.choice:
            return
        parted: set[int] = set()
        for parts in folding.groups:
            for part in parts[1:]:
                swap = {**dict(zip(parts[0], part, strict=True)),
                        **dict(zip(part, parts[0], strict=True))}  # fmt: skip
                self.twins.update((b, (a, swap)) for a, b in zip(parts[0], part, strict=True))
            parted.update(u for part in parts for u in part)
        members: dict[int, list[int]] = {}
        for u, f in enumerate(folding.of):
            members.setdefault(f, []).append(u)
        self.index = {v: f for f, v in enumerate(folding.kept) if v not in parted}
        near = neighbours(folding.problem)
        self.folded = (folding.problem, dataclasses.replace(best, choice=small), near,
                       Stacks(near), members)  # fmt: skip

    def resting(self, problem: Problem, best: Solution, near: _Near, stacks: Stacks) -> bool:
        """Whether the searches from ``best`` (of ``problem``, the whole or the folded) may
        pass over the variables no change reaches (:func:`~.local.settle`'s ``at_rest``):
        ``best`` is not proven optimal (an integer program over each array's likeliest
        layouts), so each search starts from every variable, and it is a local optimum
        (:func:`~.local.at_rest`, checked once per problem)."""
        if id(problem) not in self.rest:
            self.rest[id(problem)] = not best.optimal and at_rest(problem, best.choice, near,
                                                                  stacks)  # fmt: skip
        return self.rest[id(problem)]

    def of(self, v: int) -> Found:
        """The searches with variable ``v`` held at each of its other choices."""
        twin, swap = self.twins.get(v, (-1, {}))
        if twin in self.found:
            self.found[v] = [
                (cost, {swap.get(u, u): c for u, c in changes.items()}, seconds)
                for cost, changes, seconds in self.found[twin]
            ]
        elif self.folded is not None and v in self.index:
            small, best, near, stacks, members = self.folded
            rest = self.resting(small, best, near, stacks)
            found = _alternatives(small, best, self.index[v], near, stacks, rest)
            self.found[v] = [
                (cost, {u: c for f, c in changes.items() for u in members[f]}, seconds)
                for cost, changes, seconds in found
            ]
        else:
            rest = self.resting(self.problem, self.best, self.near, self.stacks)
            self.found[v] = _alternatives(self.problem, self.best, v, self.near, self.stacks,
                                          rest)  # fmt: skip
        return self.found[v]


def _alternatives(
    problem: Problem,
    best: Solution,
    v: int,
    near: _Near,
    stacks: Stacks,
    rest: bool = False,
) -> Found:
    """For each other choice of variable ``v``, the best plan local search finds from
    ``best`` with ``v`` held there (``rest``: ``best`` is a local optimum, :func:`at_rest`)."""
    found, base = [], list(best.choice)
    for c in range(len(problem.choices[v])):
        if c == best.choice[v]:
            continue
        begin = time.perf_counter()
        cost = best.seconds + moved(problem, best.choice, v, c, near)
        base[v] = c
        queue = [u for u, _ in near[v]] if best.optimal else list(range(len(base)))
        saved, was = settle(problem, base, v, queue, near, stacks, rest)
        changes = {u: base[u] for u in (v, *was)}
        base[v] = best.choice[v]
        for u, old in was.items():
            base[u] = old
        found.append((cost - saved, changes, time.perf_counter() - begin))
    return found


def _with(
    values: list[int], position: Mapping[int, int] | range, changes: dict[int, int]
) -> tuple[int, ...]:
    """``values`` (one per variable in ``position``) with the ``changes`` made to them."""
    for u, c in changes.items():
        if u in position:
            values[position[u]] = c
    return tuple(values)


def _held(
    problem: Problem, inputs: list[int], best: Solution, count: int, found: Alternatives
) -> list[Solution]:
    """:func:`runners_up` where dynamic programming solved ``problem``: each input held at
    each other choice costs its min-marginal, so the plans are read in that order, each only
    as far as it is needed: until ``count`` inputs have their cheapest alternative. Plans that
    cost the same (within what the nudges add: the same change at any layer of a stack) come
    in input order. A plan whose input layouts an earlier input's alternative has
    (holding that input at its choice there) is the same plan, and is left out."""
    begin = time.perf_counter()
    base, position = best.choice, {v: k for k, v in enumerate(inputs)}
    plans: dict[tuple[int, int], tuple[int, ...]] = {}

    def plan(v: int, c: int) -> tuple[int, ...]:
        if (v, c) not in plans:
            plans[(v, c)] = found.held(v, c)
        return tuple(plans[(v, c)][u] for u in inputs)

    costs = sorted(
        (float(cost), position[v], c)
        for v in inputs
        for c, cost in enumerate(found.best(v))
        if c != base[v]
    )
    order, group, start = [], 0, -math.inf
    for cost, k, c in costs:  # costs closer than the nudges can make them are one cost
        if cost > start + found.spread:
            group, start = group + 1, cost
        order.append((group, k, c))
    kept: list[tuple[int, int, int, int]] = []  # rank, cost's group, input position, choice
    ranks = [0] * len(inputs)
    for group, k, c in sorted(order):
        if sum(r == 0 for r, *_ in kept) == count:
            break
        key = plan(inputs[k], c)
        if any(j < k and plan(inputs[j], key[j]) == key for j in _changed(key, base, inputs)):
            continue  # an earlier input's alternative
        kept.append((ranks[k], group, k, c))
        ranks[k] += 1
    seconds = time.perf_counter() - begin
    chosen = [plans[(inputs[k], c)] for *_, k, c in sorted(kept)[:count]]
    return [Solution(x, total(problem, x), True, "dynamic programming", seconds) for x in chosen]


def _changed(key: tuple[int, ...], base: tuple[int, ...], inputs: list[int]) -> list[int]:
    """The positions of the inputs ``key`` lays out otherwise than ``base``."""
    return [j for j, u in enumerate(inputs) if key[j] != base[u]]


def peak(graph: Graph, problem: Problem, sol: Solution, mesh: MeshSpec, profile: Profile) -> int:
    """A solution's predicted peak bytes per device."""
    return peak_bytes(graph, read(graph, problem, sol.choice, mesh), mesh, profile.platform)
