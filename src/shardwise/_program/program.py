"""Plan whole programs: a layout for every array of a JAX function, chosen by cost.

:func:`plan` traces the function (:mod:`~shardwise._program.graph`), costs every choice
(:mod:`~shardwise._program.problem`), finds the cheapest (:mod:`~shardwise._program.search`),
and puts the named baselines (:mod:`~shardwise._program.baselines`) beside it. The result, a
:class:`ProgramPlan`, runs (``sharded``) and checks itself against XLA (``verify``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax
from jax.sharding import Mesh

from shardwise._errors import ArgumentError, UserCodeError, as_users
from shardwise._model.mesh import MeshSpec
from shardwise._model.plan import check_program_extent
from shardwise._model.profile import Profile
from shardwise._model.profile_files import default_profile, load_profile
from shardwise._model.spec import Spec, SpecLike
from shardwise._model.units import parse_bytes
from shardwise._program.annotations import (
    Annotations,
    Call,
    annotated_pins,
    logical_constraints_recorded,
    read_annotations,
    with_activations,
)
from shardwise._program.constraints import check_respect, respected, traced_under
from shardwise._program.fold import prints_kept
from shardwise._program.graph import Graph, build
from shardwise._program.plans import PlannedLayout, ProgramPlan
from shardwise._program.problem import Problem, build_problem, effective_mesh
from shardwise._program.roles import Roles, roles
from shardwise._program.search import TIME_LIMIT_S, Solution, solve
from shardwise._program.solution import Predicted, predict
from shardwise._program.steps import StepCosts
from shardwise._program.top import baselines, best_plans, fixed_pins, peak, pinned
from shardwise._program.within import NothingFits, nothing_fits
from shardwise._program.writable import agrees
from shardwise._versions import context_mesh, sources_in_users_code
from shardwise._xla.lower import auto_twin, is_explicit

DEVICE = "device"
"""``plan``'s default budget: the profile's memory per device, where it gives one."""


def _profile(profile: Profile | str | None, mesh: MeshSpec) -> Profile:
    """As ``plan_einsum`` picks one: these devices' profile for a mesh of that size."""
    if isinstance(profile, Profile):
        return profile
    if profile is not None:
        return load_profile(profile)
    return default_profile(jax.devices()[0].platform, mesh.size)


def train_step(loss: Callable[..., Any], learning_rate: float = 0.01) -> Callable[..., Any]:
    """One SGD step of ``loss(params, *batch)``: returns the loss and the updated parameters."""

    def step(params: Any, *batch: Any) -> Any:
        value, grads = jax.value_and_grad(loss)(params, *batch)
        return value, jax.tree.map(lambda p, g: p - learning_rate * g, params, grads)

    step.__name__ = f"train_step({getattr(loss, '__name__', 'loss')})"
    return step


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
) -> ProgramPlan:
    """Plan a layout for every array of ``fn(*args)`` on ``mesh``; what ``fn`` raises while
    traced comes back as a :class:`UserCodeError` that says where.

    Args:
        fn: a JAX function; with ``train=True``, a scalar loss whose first argument holds the
            parameters (the plan is for one SGD step: ``value_and_grad`` and the update).
        args: arrays or ``jax.ShapeDtypeStruct`` leaves, in any pytrees.
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
            (``x``, ``params['w1']``).
        top: how many of the search's plans to keep: the best, and runners-up that lay out
            some input another way (each one's inputs differ).
        rules: Flax's logical axis rules (``[("batch", "data"), ("mlp", "model")]``) for the
            arguments' logical names; by default, the ``nn.logical_axis_rules`` in force.
        respect: ``"none"`` (the search is free; the plan ``"annotations"`` shows what the
            annotations and the arrays' shardings give), ``"annotations"`` (the inputs as
            annotated; ``fixed`` wins), ``"constraints"`` (the code's sharding constraints)
            or ``"names"`` (plans that rules over the annotations' logical names can write).

    >>> import jax.numpy as jnp
    >>> S = jax.ShapeDtypeStruct
    >>> p = plan(lambda x, w: x @ w, S((512, 256), "float32"), S((256, 1024), "float32"),
    ...          mesh="x=4", profile="cpu-2core", top=1)
    >>> p.chosen.name, p.optimal, len(p.plans) > 1
    ('search', True, True)
    """
    devices, spec = _given_mesh(mesh)
    prof = _profile(profile, spec)
    check_respect(respect, top)
    plan_under = functools.partial(_plan, fn, args, devices, spec, prof, fixed, train, top,
                                   time_limit, rules, respect)  # fmt: skip
    if budget == DEVICE and prof.memory_bytes is not None:
        return _within_device(plan_under, prof)
    return plan_under(None if budget == DEVICE else budget)


def _plan(
    fn: Callable[..., Any], args: tuple[Any, ...], devices: Mesh | None, spec: MeshSpec,
    prof: Profile, fixed: Mapping[str, SpecLike] | None, train: bool, top: int,
    time_limit: float, rules: Any, respect: str, budget: int | str | None,
    bound_baselines: bool = True,
) -> ProgramPlan:  # fmt: skip
    """:func:`plan` under ``budget`` (``None``: no limit); the baselines each at their
    cheapest within it, or with ``bound_baselines=False`` at their cheapest (marked where
    over it)."""
    limit = None if budget is None else parse_bytes(budget, "budget")
    name, graph, annotations = _read(fn, args, train, devices, spec, rules, respect)
    eff = effective_mesh(spec)
    role = roles(graph)  # once, for the keys here and every baseline
    fixed_specs, extra = _pins(graph, fixed, spec, role, annotations, respect)
    start = time.perf_counter()
    peaks: list[int] = []  # of the search's plans checked against the budget
    with collection_paused(), prints_kept():
        full = respected(graph, build_problem(graph, eff, prof), spec, respect, annotations)
        searchable = pinned(graph, full, fixed_specs)

        def peak_of(sol: Solution) -> int:
            peaks.append(peak(graph, searchable, sol, eff, prof))
            return peaks[-1]

        def writable(sol: Solution) -> bool:  # with "names", rules can write it
            return respect != "names" or agrees(sol)

        searched = best_plans(graph, searchable, eff, limit, top, time_limit, writable,
                              peak_of)  # fmt: skip
        baseline_limit = limit if bound_baselines else None
        solved, skipped = baselines(graph, full, eff, fixed_specs, baseline_limit, time_limit,
                                    role, extra)  # fmt: skip
        named = [("search" if k == 0 else f"search {k + 1}", searchable, sol)
                 for k, sol in enumerate(searched)]  # fmt: skip
        plans = _predictions(graph, [*named, *solved], StepCosts(graph, eff, prof), limit)
    plans.sort(key=lambda p: p.predicted.seconds)
    if searched:
        optimal, method = searched[0].optimal, searched[0].method
    else:  # under a budget only: the search always finds a plan without one
        fitting = [p for p in plans if not p.over_budget]
        if not fitting or respect == "names":
            raise _nothing_fits(name, graph, searchable, eff, prof, plans, peaks, limit)
        # the fastest baseline within it is the search's plan (runs, reports and verify
        # name the chosen plan "search")
        optimal, method = False, f"{fitting[0].name}'s plan, the fastest within the budget"
        plans.insert(plans.index(fitting[0]), dataclasses.replace(fitting[0], name="search"))
    return ProgramPlan(
        program=name, mesh=spec, profile=prof, train=train, graph=graph, ops=graph.ops,
        considered=searchable.considered, solve_seconds=time.perf_counter() - start,
        optimal=optimal, method=method, plans=tuple(plans), skipped=tuple(skipped),
        pinned=tuple(sorted(fixed_specs)), budget=limit, complete=not searchable.truncated,
        devices=devices, annotations=annotations, respect=respect,
    )  # fmt: skip


def _within_device(plan_with: Callable[..., ProgramPlan], prof: Profile) -> ProgramPlan:
    """``plan_with(budget)`` within the profile's memory per device: the plan without a
    bound where its choice fits (no plan is faster, and no peak is computed in the search),
    else the plan within the memory, else the one without a bound, saying that none fits."""
    assert prof.memory_bytes is not None
    free = plan_with(None)
    if free.chosen.predicted.memory_bytes <= prof.memory_bytes:
        return free
    try:  # (the baselines as they are: re-solving them within it took tens of seconds)
        return plan_with(int(prof.memory_bytes), bound_baselines=False)
    except NothingFits as e:
        why = f"{e} (the {prof.name} profile's memory; the fastest plan is shown)"
        return dataclasses.replace(free, over_memory=why)


@contextlib.contextmanager
def collection_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused within (where it runs): the planner makes
    millions of small tuples, lists and dicts, and the collections they set off walk every
    object alive, the traced program's and JAX's included (a third of the time planning a
    24-layer transformer's training step took). What the planner makes is freed by reference
    counts; a cycle made meanwhile is collected once the collector runs again. The user's
    function is traced with the collector running."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


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


def _read(
    fn: Callable[..., Any],
    args: Any,
    train: bool,
    devices: Mesh | None,
    spec: MeshSpec,
    rules: Any,
    respect: str,
) -> tuple[str, Graph, Annotations]:
    """The program's name and graph, and what its arguments and code say of its layout.
    Traced under the mesh's abstract form where no JAX mesh is given, so that the code's
    constraints are in the trace; where they name axes this mesh lacks (planning a function
    for another mesh than its constraints'), traced with no mesh, as they were then not
    asked, unless ``respect="constraints"``."""
    annotations = read_annotations(args, rules)
    calls: list[Call] = []
    try:
        with traced_under(devices, spec), logical_constraints_recorded(calls):
            name, graph = _traced(fn, args, train, devices)
    except UserCodeError:
        if respect == "constraints" or devices is not None:
            raise
        calls.clear()
        with logical_constraints_recorded(calls):
            name, graph = _traced(fn, args, train, devices)
    return name, graph, with_activations(annotations, graph, calls)


def _pins(
    graph: Graph,
    fixed: Mapping[str, SpecLike] | None,
    mesh: MeshSpec,
    role: Roles,
    annotations: Annotations,
    respect: str,
) -> tuple[dict[int, Spec], dict[str, dict[int, Spec] | str]]:
    """The inputs every plan of the search keeps (``fixed``, PRNG keys, and the annotations'
    layouts with ``respect="annotations"``), and the plan of the annotations to compare
    (or why there is none) with ``respect="none"``."""
    pins = fixed_pins(graph, fixed, mesh)
    for k in role.keys:  # a PRNG key is never split: every device draws the same bits
        pins.setdefault(k, Spec())
    annotated = annotated_pins(annotations, graph, mesh, pins)
    if respect != "annotations":
        return pins, ({"annotations": annotated} if annotations and respect == "none" else {})
    if isinstance(annotated, str):
        raise ArgumentError(
            f"respect='annotations', but {annotated}; plan with respect='none', or annotate "
            "the parameters"
        )
    return annotated, {}


def _traced(
    fn: Callable[..., Any], args: Any, train: bool, devices: Mesh | None
) -> tuple[str, Graph]:
    """The program's name and graph (of its training step with ``train``), traced under
    ``devices`` where given (so code that names mesh axes bare, as explicit sharding does,
    finds them): what ``fn`` raises is the user's, said as such; a program past what XLA can
    count is refused."""
    name = getattr(fn, "__name__", "program")
    traced = as_users(fn, name)
    step = train_step(traced) if train else traced

    def under(mesh: Mesh | None) -> Graph:
        with (
            jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext(),
            sources_in_users_code(),
        ):
            return build(step, args, name, signature=fn)

    try:
        graph = under(devices)
    except UserCodeError as e:
        # on Explicit axes ``with_sharding_constraint`` asserts the layout an array already
        # has (Flax's logical constraints call it); the abstract arguments have none, so it
        # is traced on the mesh's Auto twin, where it is a constraint: the plan's layout
        # replaces it when the plan runs
        if (
            devices is None
            or not is_explicit(devices)
            or not isinstance(e.__cause__, AssertionError)
        ):
            raise
        graph = under(auto_twin(devices))
    check_program_extent([(v.name, v.shape, v.dtype) for v in graph.values], name)
    return name, graph


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
