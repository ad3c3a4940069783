"""The baselines' plans: each named baseline's inputs pinned (:mod:`.baselines`) and the
rest of the program laid out as cheaply as it can be, under a budget its cheapest plan within
it; and the search's plan seeded from a baseline's where that costs less."""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable, Mapping

from shardwise._errors import SpecError
from shardwise._model.mesh import MeshSpec
from shardwise._model.spec import Spec
from shardwise._program.baselines import NAMES, baseline
from shardwise._program.graph import Graph
from shardwise._program.local import descend
from shardwise._program.memory import memory_constraints
from shardwise._program.pins import pinned
from shardwise._program.problem import Problem, Solution, total
from shardwise._program.roles import Roles
from shardwise._program.search import solve
from shardwise._program.within import solve_within

Baseline = tuple[str, Problem, Solution] | tuple[str, str]
"""A baseline solved (its name, pinned problem and solution), or one that does not apply (its
name and why)."""


def baselines(
    graph: Graph,
    full: Problem,
    mesh: MeshSpec,
    fixed: dict[int, Spec],
    limit: int | None,
    time_limit: float,
    role: Roles,
    extra: Mapping[str, dict[int, Spec] | str] | None = None,
) -> list[Callable[[], Baseline]]:
    """The work of each baseline (each named one, then ``extra``: more plans by name, each
    its pinned inputs or why it does not apply), to do in any order, each giving its
    :data:`Baseline`: its cheapest plan within ``limit`` where one fits and else its cheapest
    (its predicted peak then says it is over budget). ``role``: the inputs' roles."""
    named = [(base, baseline(base, graph, mesh, fixed, role)) for base in NAMES]
    return [
        functools.partial(_baseline, base, pins, graph, full, mesh, limit, time_limit)
        for base, pins in [*named, *(extra or {}).items()]
    ]


def _baseline(
    base: str, pins: dict[int, Spec] | str, graph: Graph, full: Problem, mesh: MeshSpec,
    limit: int | None, time_limit: float,
) -> Baseline:  # fmt: skip
    """One of :func:`baselines`' work."""
    if isinstance(pins, str):
        return base, pins
    try:
        problem = pinned(graph, full, pins, mesh)
    except SpecError as e:
        return base, str(e)
    limits = [] if limit is None else memory_constraints(graph, problem, limit, mesh)
    result = solve_within(problem, limits, [], time_limit)
    if result is None:  # shown all the same, at its own cheapest, marked over budget
        result = solve(problem, time_limit=time_limit)
        assert result is not None  # only constraints make a problem infeasible
    return base, problem, result


def solved_apart(
    done: list[Baseline],
) -> tuple[list[tuple[str, Problem, Solution]], list[tuple[str, str]]]:
    """The baselines ``done`` (:func:`baselines`' work), those solved and those that do not
    apply (with why), each in their order."""
    solved = [b for b in done if len(b) == 3]
    skipped = [b for b in done if len(b) == 2]
    return solved, skipped


def seeded(
    problem: Problem, solved: list[tuple[str, Problem, Solution]], best: Solution
) -> Solution | None:
    """Where the search's ``best`` plan of ``problem`` is not proven optimal (a mesh of four
    axes: integer programs over each array's likeliest layouts) and a baseline's plan, each
    of ``solved``, costs less, a local search from the cheapest such one (the search never
    chooses a plan slower than a baseline it could take); ``None`` where none costs less."""
    if best.optimal:
        return None
    start = time.perf_counter()
    index = [{c: k for k, c in enumerate(choices)} for choices in problem.choices]
    found: tuple[float, str, list[int]] | None = None
    for name, base, sol in solved:
        choice = [index[v].get(base.choices[v][c], -1) for v, c in enumerate(sol.choice)]
        cost = total(problem, choice) if -1 not in choice else math.inf
        if cost < (found or (best.seconds,))[0]:
            found = cost, name, choice
    if found is None:
        return None
    cost, name, choice = found
    local = descend(problem, choice, -1, cost=cost)
    method = f"local search from the {name} plan (cheaper than what {best.method} found)"
    return dataclasses.replace(local, method=method, solve_seconds=time.perf_counter() - start)
