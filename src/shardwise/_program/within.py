"""Plans within a memory budget: the integer program's memory rows checked before it runs
(a plan that keeps them without them is their optimum; rows no plan can keep), tightened as
plans over the budget by their peak are set aside, and the error where no plan fits."""

from __future__ import annotations

import dataclasses

from shardwise._errors import ArgumentError
from shardwise._model.mesh import MeshSpec
from shardwise._model.units import format_bytes
from shardwise._program.integer import Constraint
from shardwise._program.problem import Problem
from shardwise._program.search import Solution, solve


def solve_within(
    problem: Problem, constraints: list[Constraint], exclude: list[dict[int, int]],
    time_limit: float,
) -> Solution | None:  # fmt: skip
    """:func:`~shardwise._program.search.solve` under ``constraints``: where nothing is
    excluded, the cheapest plan without them if it keeps them (then it is their optimum too,
    found by dynamic programming or the linear relaxation, where the integer program with
    memory rows takes branch and bound: 30 s of a small Llama's baselines under a budget)."""
    if any(least(c) > c.limit for c in constraints):
        return None  # (every plan holds more at some point: no need to search for one)
    if constraints and not exclude:
        free = solve(problem, time_limit=time_limit)
        if free is not None and all(held(c, free) <= c.limit for c in constraints):
            return free
    return solve(problem, constraints, exclude, time_limit)


def least(c: Constraint) -> float:
    """The fewest bytes any plan holds at constraint ``c``'s program point: each variable's
    smallest choice there (a baseline that keeps the weights whole holds at least them)."""
    smallest: dict[int, float] = {}
    for v, _, b in c.terms:
        smallest[v] = min(smallest.get(v, b), b)
    return sum(smallest.values())


def held(c: Constraint, sol: Solution) -> float:
    """The bytes ``sol`` holds at constraint ``c``'s program point."""
    return sum(b for v, k, b in c.terms if sol.choice[v] == k)


def tightened(constraints: list[Constraint], sol: Solution, share: float) -> list[Constraint]:
    """``constraints`` with every limit at most ``share`` of what ``sol`` holds at its
    fullest constrained point (``share`` < 1: a plan over the budget by its peak, though
    within these constraints), so that the next plan holds less there.

    >>> c = [Constraint(((0, 0, 8.0), (0, 1, 2.0)), 10.0)]
    >>> tightened(c, Solution((0,), 1.0, True, "dp", 0.0), 0.5)[0].limit
    4.0
    """
    most = max((held(c, sol) for c in constraints), default=0.0)
    return [dataclasses.replace(c, limit=min(c.limit, most * share)) for c in constraints]


class NothingFits(ArgumentError):
    """No plan of a program fits the memory budget (the message names the smallest found)."""


def nothing_fits(
    name: str, mesh: MeshSpec, limit: int, found: list[tuple[int, str]]
) -> ArgumentError:
    """The error for a budget no plan fits, naming the smallest of the plans ``found``
    (peak bytes, and a baseline's name or ``""`` for one of the search's)."""
    need, which = min(found)
    return NothingFits(
        f"no plan of {name} fits in {format_bytes(limit)} ({limit:,} bytes) per device on "
        f"mesh {mesh.describe()}: the smallest plan found"
        + (f", {which}," if which else "")
        + f" needs {format_bytes(need)} ({need:,} bytes). Give a larger budget "
        "(--device-memory from the command line), a mesh with more devices, or smaller inputs."
    )
