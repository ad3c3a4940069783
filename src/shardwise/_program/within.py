"""Plans within a memory budget: the integer program's memory rows checked before it runs
(a plan that keeps them without them is their optimum; rows no plan can keep), tightened as
plans over the budget by their peak are set aside, and the error where no plan fits."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from shardwise._errors import ArgumentError
from shardwise._model.mesh import MeshSpec
from shardwise._model.units import format_bytes
from shardwise._program.integer import Constraint
from shardwise._program.problem import Problem, Solution, total
from shardwise._program.search import solve


def solve_within(
    problem: Problem, constraints: list[Constraint], exclude: list[dict[int, int]],
    time_limit: float, unbounded: Solution | None = None,
) -> Solution | None:  # fmt: skip
    """:func:`~shardwise._program.search.solve` under ``constraints``: where nothing is
    excluded, the cheapest plan without them if it keeps them (then it is their optimum too,
    found by dynamic programming or the linear relaxation, where the integer program with
    memory rows takes branch and bound: 30 s of a small Llama's baselines under a budget),
    else the plan :func:`priced` finds; else, and once a plan has been set aside, the
    integer program (pricing after one gave Llama-3 8B's AdamW step a plan 0.9% slower than
    the integer program's, in 3.3 s against 5.8). ``unbounded``: ``solve(problem)``'s plan,
    where the caller has it (a plan within a device's memory is searched for after the plan
    without it: Llama-3 8B's AdamW step on 8 v5p chips had solved it again, 9 s)."""
    if any(least(c) > c.limit for c in constraints):
        return None  # (every plan holds more at some point: no need to search for one)
    if constraints and not exclude:
        free = unbounded if unbounded is not None else solve(problem, time_limit=time_limit)
        if free is not None and all(held(c, free) <= c.limit for c in constraints):
            return free
        found = priced(problem, constraints, free, time_limit) if free is not None else None
        if found is not None:
            return found
    return solve(problem, constraints, exclude, time_limit)


PRICES = tuple(2.0**k for k in range(-9, 12, 3))
"""The prices of memory :func:`priced` tries, cheapest first, as shares of the plan's time
over the budget (seconds per byte)."""
BISECTIONS = 4
"""How many prices :func:`priced` tries between the last too low and the first that keeps
the rows (each a solve: eight times apart, then within 14% of each other)."""


def priced(
    problem: Problem, constraints: list[Constraint], free: Solution, time_limit: float
) -> Solution | None:
    """A plan that keeps ``constraints``, found with memory priced into the costs instead of
    rows (a Lagrangian relaxation): each choice costs ``λ`` × the most bytes it holds at any
    constrained point beside its time, so every solve is the problem without rows (dynamic
    programming, no branch and bound). ``λ`` grows through :data:`PRICES` until the plan
    keeps the rows, then is bisected back (:data:`BISECTIONS`); ``None`` where no price
    does. Not proven the cheapest: on MaxText's 256B on two v5p slices, the integer
    program ran into its time limit with a plan 236 times slower (the search then found
    none in 160 s), while pricing found one that costs 0.3% more than the plan without a
    bound, each try a few seconds."""
    weight = [np.zeros(len(u)) for u in problem.unary]
    for c in constraints:
        at: dict[tuple[int, int], float] = {}
        for v, k, b in c.terms:
            at[(v, k)] = at.get((v, k), 0.0) + b
        for (v, k), b in at.items():
            weight[v][k] = max(weight[v][k], b)
    scale = free.seconds / max(c.limit for c in constraints)
    last = free.choice  # (each price's search starts from the one before's plan)

    def under(price: float) -> Solution | None:
        nonlocal last
        costs = tuple(u + price * scale * w for u, w in zip(problem.unary, weight, strict=True))
        costed = dataclasses.replace(problem, unary=costs)
        sol = solve(costed, time_limit=time_limit, hint=last)
        last = last if sol is None else sol.choice
        if sol is None or any(held(c, sol) > c.limit for c in constraints):
            return None
        return dataclasses.replace(sol, priced=costed)

    found, low, high = None, 0.0, 0.0
    for high in PRICES:
        if (found := under(high)) is not None:
            break
        low = high
    if found is None:
        return None
    for _ in range(BISECTIONS):  # (between the last price too low and the first that does)
        price = math.sqrt(low * high) if low else high / 8
        cheaper = under(price)
        if cheaper is None:
            low = price
        else:
            found, high = cheaper, price
    return dataclasses.replace(
        found, seconds=total(problem, found.choice), optimal=False,
        method=f"{found.method}, memory priced in",
    )  # fmt: skip


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
