"""Plan whole programs: a layout for every array of a JAX function, chosen by cost.

:func:`plan` reads the function once (:mod:`~shardwise._program.reading`: its graph and every
choice's cost), finds the cheapest (:mod:`~shardwise._program.search`), within a budget if any,
and puts the named baselines (:mod:`~shardwise._program.baselines`) beside it. The result, a
:class:`ProgramPlan`, runs (``sharded``) and checks itself against XLA (``verify``).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
from jax.sharding import Mesh

from shardwise._errors import ArgumentError
from shardwise._model.mesh import MeshSpec
from shardwise._model.profile import Profile
from shardwise._model.profile_files import default_profile, load_profile
from shardwise._model.profile_use import check_mesh
from shardwise._model.spec import SpecLike
from shardwise._model.units import format_bytes, parse_bytes
from shardwise._program.baseline_plans import baselines, seeded, solved_apart
from shardwise._program.beside import BESIDE_PAIRS, Beside
from shardwise._program.constraints import check_respect
from shardwise._program.fold import prints_kept
from shardwise._program.graph import Graph
from shardwise._program.plans import PlannedLayout, ProgramPlan
from shardwise._program.problem import Problem, Solution, effective_mesh
from shardwise._program.reading import Program, collection_paused, read_program
from shardwise._program.reading import train_step as train_step
from shardwise._program.search import TIME_LIMIT_S, solve
from shardwise._program.solution import Predicted, predict
from shardwise._program.stages import say
from shardwise._program.steps import StepCosts
from shardwise._program.top import best_plans, peak
from shardwise._program.within import NothingFits, nothing_fits
from shardwise._program.writable import agrees
from shardwise._versions import context_mesh

DEVICE = "device"
"""``plan``'s default budget: the profile's memory per device, where it gives one."""

PRICING_S = 120.0
"""The least time pricing the layouts gets (``plan``'s ``time_limit`` where longer): Llama-3
8B's AdamW step on a mesh of four axes prices in 27 s on a 2-core x86 machine (43-55 s in one
thread), and a minute had left it no margin on a machine a little slower, or with one core."""


def _profile(profile: Profile | str | None, mesh: MeshSpec) -> Profile:
    """As ``plan_einsum`` picks one: these devices' profile for a mesh of that size."""
    if isinstance(profile, Profile):
        return profile
    if profile is not None:
        return load_profile(profile)
    return default_profile(jax.devices()[0].platform, mesh.size)


def plan(
    fn: Callable[..., Any],
    *args: Any,
    mesh: Any = None,
    profile: Profile | str | None = None,
    budget: int | str | None = DEVICE,
    fixed: Mapping[str, SpecLike] | None = None,
    train: bool = False,
    top: int = 5,
    time_limit: float = TIME_LIMIT_S,
    rules: Any = None,
    respect: str = "none",
    donate_argnums: int | Sequence[int] | None = (),
) -> ProgramPlan:
    """Plan a layout for every array of ``fn(*args)`` on ``mesh``; what ``fn`` raises while
    traced comes back as a :class:`UserCodeError` that says where.

    Args:
        fn: a JAX function; with ``train=True``, a scalar loss whose first argument holds the
            parameters (the plan is for one SGD step: ``value_and_grad`` and
            ``p - 0.01 * g``, its program returning ``(loss, new params)``; to train with your
            optimizer, plan your own step without ``train``).
        args: ``fn``'s arguments, by position: arrays or ``jax.ShapeDtypeStruct`` leaves, in
            any pytrees. ``plan`` takes no keyword arguments for ``fn`` (its keywords are its
            own: ``mesh``, ``top``, …): bind a setting first, as ``jax.jit``'s static
            arguments are, ``plan(functools.partial(fn, scale=2.0), x, w)``. An array bound
            so is a constant of the program, not planned: pass arrays by position.
        mesh: a mesh description (``"data=2,model=4"``; it need not exist here) or a JAX
            ``Mesh`` (Auto, Explicit or mixed axes); default: the one ``jax.set_mesh`` set.
        profile: a device profile name or object; default: the devices at hand.
        budget: memory per device (bytes, or text like ``"16GiB"``): the search's plans fit
            it; a baseline that does not is marked over budget, never chosen. Where no plan
            fits, an :class:`ArgumentError` names the smallest one found. By default
            (``"device"``) the profile's memory per device, where it gives one: the
            fastest plan if it fits, else the fastest that fits, else the fastest, with
            :attr:`ProgramPlan.over_memory` saying that none fits. ``None``: no limit.
        fixed: input name → spec, pinned (e.g. ``{"x": "data"}``); names as in the report
            (``x``, ``params['w1']``), or with dots as ``--args`` writes them (``params.w1``).
        top: how many of the search's plans to keep: the best, and runners-up that lay out
            some input another way (each one's inputs differ).
        time_limit: seconds for the solver, which gives its best plan found by then
            (under a budget, for the runners-up's search as a whole; where it runs out,
            :attr:`ProgramPlan.method` says so); and for pricing the layouts, at least two
            minutes (a mesh of four axes gives an array thousands of layouts: pricing past
            it stops with an :class:`ArgumentError` saying what to do).
        rules: Flax's logical axis rules (``[("batch", "data"), ("mlp", "model")]``) for the
            arguments' logical names; by default, the ``nn.logical_axis_rules`` in force.
        respect: ``"none"`` (the search is free; the plan ``"annotations"`` shows what the
            annotations and the arrays' shardings give), ``"annotations"`` (the inputs as
            annotated; ``fixed`` wins), ``"constraints"`` (the code's sharding constraints)
            or ``"names"`` (plans that rules over the annotations' logical names can write).
        donate_argnums: the arguments whose buffers the results may take, as ``jax.jit``'s
            (a training step's parameters and optimizer state, ``(0, 1)``): a result of the
            same shape, type and layout is counted in that buffer, and ``sharded`` donates.

    >>> import jax.numpy as jnp
    >>> S = jax.ShapeDtypeStruct
    >>> p = plan(lambda x, w: x @ w, S((512, 256), "float32"), S((256, 1024), "float32"),
    ...          mesh="x=4", profile="cpu-2core", top=1)
    >>> p.chosen.name, p.optimal, len(p.plans) > 1
    ('search', True, True)
    >>> import functools
    >>> def scaled(x, w, scale=1.0):
    ...     return x @ w * scale
    >>> plan(functools.partial(scaled, scale=2.0), S((512, 256), "float32"),
    ...      S((256, 1024), "float32"), mesh="x=4", profile="cpu-2core", top=1).chosen.name
    'search'
    """
    devices, spec = _given_mesh(mesh)
    prof = _profile(profile, spec)
    check_mesh(prof, spec)
    check_respect(respect, top)
    with collection_paused():  # (once: JAX's trace too; cycles it makes are freed after)
        read = read_program(fn, args, train, devices, spec, prof, fixed, rules, respect,
                            donate_argnums, max(time_limit, PRICING_S))  # fmt: skip
        plan_under = functools.partial(_plan, read, devices, spec, prof, train, top,
                                       time_limit, respect, best=[])  # fmt: skip
        if budget == DEVICE and prof.memory_bytes is not None:
            return _within_device(plan_under, prof)
        return plan_under(None if budget == DEVICE else budget)


def _plan(
    read: Program, devices: Mesh | None, spec: MeshSpec, prof: Profile, train: bool,
    top: int, time_limit: float, respect: str, budget: int | str | None,
    baselines_of: ProgramPlan | None = None, best: list[Solution] | None = None,
) -> ProgramPlan:  # fmt: skip
    """:func:`plan` of the program ``read`` under ``budget`` (``None``: no limit); the
    baselines each at their cheapest within it, or, given ``baselines_of``, those of that
    plan (marked where over it). ``best``: the search's best plan without a budget, kept
    there by the plan without one, for the search within one (not solved again)."""
    limit = None if budget is None else parse_bytes(budget, "budget")
    graph, searchable, eff = read.graph, read.searchable, effective_mesh(spec)
    start = time.perf_counter()
    peaks: list[int] = []  # of the search's plans checked against the budget
    with prints_kept():

        def peak_of(sol: Solution) -> int:
            peaks.append(peak(graph, searchable, sol, eff, prof))
            return peaks[-1]

        def writable(sol: Solution) -> bool:  # with "names", rules can write it
            return respect != "names" or agrees(sol)

        # the baselines (none where given), solved beside the search where the problem is large
        tasks = [] if baselines_of is not None else baselines(
            graph, read.full, eff, read.pins, limit, time_limit, read.role, read.extra)  # fmt: skip
        large = sum(m.size for m in read.full.edges.values()) >= BESIDE_PAIRS
        pending = Beside(tasks, alone=not large)
        within = "" if limit is None else f" within {format_bytes(limit)} per device"
        say(f"searching for the fastest plans{within}")
        try:
            searched = best_plans(graph, searchable, eff, limit, top, time_limit, writable,
                                  peak_of, best[0] if best else None)  # fmt: skip
            if limit is None and best is not None:
                best[:] = searched[:1]
        except BaseException:
            pending.cancel()  # (no baseline is wanted now)
            raise
        named = _named(searchable, searched)
        costs = StepCosts(graph, eff, prof)
        if baselines_of is None:
            say("solving the baselines")
            solved, skipped = solved_apart(pending.results())
            faster = seeded(searchable, solved, searched[0]) if searched and limit is None else None
            if faster is not None:  # (the search's first, its last plan dropped past top)
                searched = [faster, *searched][:top]
                named = _named(searchable, searched)
            plans = _predictions(graph, [*named, *solved], costs, limit)
        else:
            base = [p for p in baselines_of.plans if not p.searched]
            plans = [*_predictions(graph, named, costs, limit), *_marked(base, limit)]
            skipped = list(baselines_of.skipped)
    plans.sort(key=lambda p: p.predicted.seconds)
    if searched:
        optimal, method = searched[0].optimal, searched[0].method
        plans, method = _fastest_searched(plans, method)
    else:  # under a budget only: the search always finds a plan without one
        fitting = [p for p in plans if not p.over_budget]
        if not fitting or respect == "names":
            raise _nothing_fits(read.name, graph, searchable, eff, prof, plans, peaks, limit)
        # the fastest baseline within it is the search's plan (runs, reports and verify
        # name the chosen plan "search")
        optimal, method = False, f"{fitting[0].name}'s plan, the fastest within the budget"
        plans.insert(plans.index(fitting[0]), dataclasses.replace(fitting[0], name="search"))
    return ProgramPlan(
        program=read.name, mesh=spec, profile=prof, train=train, graph=graph, ops=graph.ops,
        considered=searchable.considered, solve_seconds=time.perf_counter() - start,
        optimal=optimal, method=method, plans=tuple(plans), skipped=tuple(skipped),
        pinned=tuple(sorted(read.pins)), budget=limit, complete=not searchable.truncated,
        devices=devices, annotations=read.annotations, respect=respect,
        donate_argnums=read.donate_argnums,
    )  # fmt: skip


def _named(problem: Problem, searched: list[Solution]) -> list[tuple[str, Problem, Solution]]:
    """The search's plans by name: ``search``, ``search 2``, …"""
    return [("search" if k == 0 else f"search {k + 1}", problem, sol)
            for k, sol in enumerate(searched)]  # fmt: skip


def _fastest_searched(plans: list[PlannedLayout], method: str) -> tuple[list[PlannedLayout], str]:
    """``plans`` (sorted by predicted time) with the search's plans named by their predicted
    time, the fastest ``"search"`` (the chosen one): a runner-up predicted faster than the
    search's best (the solver's costs, or its memory pricing under a budget, are not the
    prediction's) takes its name. Under a budget the search's best had been chosen at 123 µs
    where a runner-up, within the budget too, was predicted at 121 µs."""
    found = [p.name for p in plans if p.searched]
    if found[0] == "search":
        return plans, method
    rank = {name: "search" if k == 0 else f"search {k + 1}" for k, name in enumerate(found)}
    renamed = [dataclasses.replace(p, name=rank.get(p.name, p.name)) for p in plans]
    return renamed, f"{method}; its plans ranked as predicted"


def _marked(plans: Sequence[PlannedLayout], limit: int | None) -> list[PlannedLayout]:
    """``plans``, each marked over budget where its memory is over ``limit``."""
    return [
        dataclasses.replace(p, over_budget=limit is not None and p.predicted.memory_bytes > limit)
        for p in plans
    ]


def _within_device(plan_with: Callable[..., ProgramPlan], prof: Profile) -> ProgramPlan:
    """``plan_with(budget)`` within the profile's memory per device: the plan without a
    bound where its choice fits (no plan is faster, and no peak is computed in the search),
    else the plan within the memory, else the one without a bound, saying that none fits."""
    assert prof.memory_bytes is not None
    free = plan_with(None)
    if free.chosen.predicted.memory_bytes <= prof.memory_bytes:  # (a baseline may not fit)
        limit = int(prof.memory_bytes)
        return dataclasses.replace(free, budget=limit, plans=tuple(_marked(free.plans, limit)))
    try:  # (the baselines as they are: re-solving them within it took tens of seconds)
        return plan_with(int(prof.memory_bytes), baselines_of=free)
    except NothingFits as e:
        why = f"{e} (the {prof.name} profile's memory; the fastest plan is shown)"
        limit = int(prof.memory_bytes)  # (each plan marked over it, as where one fits)
        return dataclasses.replace(free, over_memory=why, budget=limit,
                                   plans=tuple(_marked(free.plans, limit)))  # fmt: skip


def _given_mesh(mesh: Any) -> tuple[Mesh | None, MeshSpec]:
    """The JAX mesh ``mesh`` is (``None`` for a description of one) and its shape; where no
    mesh is given, the one set with ``jax.set_mesh``."""
    if mesh is None:
        mesh = context_mesh()
        if mesh is None:
            raise ArgumentError(
                "no mesh to plan for: pass mesh= (a description like 'data=2,model=4', or a "
                "jax Mesh), or set one first with jax.set_mesh(mesh)."
            )
    return (mesh if isinstance(mesh, Mesh) else None), MeshSpec.parse(mesh)


def _nothing_fits(
    name: str,
    graph: Graph,
    problem: Problem,
    mesh: MeshSpec,
    profile: Profile,
    shown: list[PlannedLayout],
    peaks: list[int],
    limit: int | None,
) -> ArgumentError:
    """:func:`~shardwise._program.top.nothing_fits`, naming the smallest of the baselines
    ``shown``, the search's plans set aside (their ``peaks``) and its plan without the budget."""
    assert limit is not None
    cheapest = solve(problem)  # without the budget
    assert cheapest is not None  # only constraints make a problem infeasible
    found = [(p.predicted.memory_bytes, p.name) for p in shown]
    found += [(need, "") for need in (*peaks, peak(graph, problem, cheapest, mesh, profile))]
    return nothing_fits(name, mesh, limit, found)


def _predictions(
    graph: Graph,
    named: list[tuple[str, Problem, Solution]],
    costs: StepCosts,
    limit: int | None,
) -> list[PlannedLayout]:
    """Each solution's plan (by name, with its problem), each after the first costed from
    the first one's prediction: only what it lays out otherwise is costed anew
    (:func:`predict`; the runners-up differ from the best plan in a layer or two), and a plan
    that chooses what an earlier one did is its prediction again. A
    plan over ``limit`` is marked over budget (a baseline: the search keeps only plans whose
    peak is within it)."""
    say("predicting each plan's time and memory")
    out: list[PlannedLayout] = []
    first: Predicted | None = None
    seen: dict[tuple[Any, ...], Predicted] = {}  # a baseline may be the search's plan
    for name, problem, sol in named:
        key = tuple(choices[c] for choices, c in zip(problem.choices, sol.choice, strict=True))
        found = seen.get(key) or predict(graph, problem, sol.choice, costs, near=first)
        first, seen[key] = first or found, found
        layouts, pred = found.lay, found.prediction
        in_specs = tuple(layouts.specs[v] for v in graph.inputs)
        over = limit is not None and pred.memory_bytes > limit
        out.append(PlannedLayout(name, in_specs, layouts, pred, over_budget=over))
    return out
