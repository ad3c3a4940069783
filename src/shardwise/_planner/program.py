"""Plan whole programs: a layout for every array of a JAX function, chosen by cost.

:func:`plan` traces the function (:mod:`~shardwise._planner.graph`), costs every choice
(:mod:`~shardwise._planner.costs`), finds the cheapest (:mod:`~shardwise._planner.search`),
and puts the named baselines (:mod:`~shardwise._planner.baselines`) beside it. The result, a
:class:`ProgramPlan`, runs (``sharded``) and checks itself against XLA (``verify``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jax

from shardwise._errors import ArgumentError, SpecError
from shardwise._model.mesh import MeshSpec
from shardwise._model.profile import Profile, default_profile, load_profile
from shardwise._model.spec import Spec, SpecLike
from shardwise._planner.baselines import NAMES, baseline
from shardwise._planner.costs import Problem, build_problem, effective_mesh
from shardwise._planner.evaluate import (
    Layouts,
    Predicted,
    ProgramVerified,
    memory_constraints,
    predicted,
)
from shardwise._planner.graph import Graph, build
from shardwise._planner.report import ProgramReport, report
from shardwise._planner.search import TIME_LIMIT_S, Solution, descend, neighbours, solve
from shardwise._planner.verify import sharded, verify


@dataclass(frozen=True, slots=True)
class PlannedLayout:
    """One plan of a program: its name, the inputs' specs, every array's layout, the cost."""

    name: str
    in_specs: tuple[Spec, ...]
    layouts: Layouts
    predicted: Predicted
    verified: ProgramVerified | None = None


@dataclass(frozen=True, slots=True)
class ProgramPlan:
    """A program's best plan, the runners-up and the baselines, sorted by predicted time.

    Attributes:
        program: the function's name.
        mesh: the mesh planned for.
        profile: the device profile the costs come from.
        train: whether the program is a training step built from a loss.
        ops: ops in the traced program.
        considered: layouts and strategies looked at.
        solve_seconds: time the search took.
        optimal: whether the search proved its plan the cheapest.
        method: how it searched.
        plans: the search's plans and the baselines, cheapest first.
        skipped: baselines that do not apply, and why.
        spearman: rank correlation of predicted and measured times (after ``verify``).
    """

    program: str
    mesh: MeshSpec
    profile: Profile
    train: bool
    graph: Graph
    ops: int
    considered: int
    solve_seconds: float
    optimal: bool
    method: str
    plans: tuple[PlannedLayout, ...]
    skipped: tuple[tuple[str, str], ...] = ()
    spearman: float | None = None

    @property
    def chosen(self) -> PlannedLayout:
        """The search's plan."""
        return next(p for p in self.plans if p.name == "search")

    @property
    def in_specs(self) -> Any:
        """The chosen plan's input layouts as ``PartitionSpec``s, mirroring the arguments."""
        return self.specs_tree(self.chosen)

    def specs_tree(self, plan: PlannedLayout) -> Any:
        leaves = [s.to_partition_spec() for s in plan.in_specs]
        return jax.tree.unflatten(self.graph.tree, leaves)

    def get(self, name: str) -> PlannedLayout:
        """The plan called ``name`` (``search``, ``search 2``, a baseline's name)."""
        for p in self.plans:
            if p.name == name:
                return p
        raise ArgumentError(
            f"no plan named {name!r}; the plans are {', '.join(p.name for p in self.plans)}."
        )

    def sharded(self, name: str = "search", mesh: Any = None) -> Callable[..., Any]:
        """The program compiled to follow plan ``name`` on ``mesh`` (by default the planned
        mesh, built on the devices at hand): inputs placed by the plan's specs, and every
        intermediate constrained to its layout so XLA's partitioner follows the plan."""
        return sharded(self, self.get(name), mesh)

    def verify(self, repeat: int = 5, mesh: Any = None, on_step: Any = None) -> ProgramPlan:
        """Compile every plan here, compare its collectives and memory with the prediction,
        time it (median of ``repeat`` runs), and rank-correlate predicted and measured times."""
        return verify(self, repeat, mesh, on_step)

    def report(self, name: str = "search") -> ProgramReport:
        """Plan ``name`` op by op: layouts in and out, each collective and why, time shares,
        and the memory held per device over the program."""
        return report(self, name)

    def to_html(self, name: str = "search") -> str:
        """One self-contained HTML file (no network needed to view it): the plans compared,
        plan ``name`` op by op with every array drawn on the mesh and each collective's
        cause, and the memory held per device over the program."""
        from shardwise.render.report import program_html

        return program_html({"plan": self.to_json(), "report": self.report(name).to_json()})

    def _repr_html_(self) -> str:
        return self.to_html()

    def __rich__(self) -> Any:
        from rich.console import Group

        from shardwise.render.program import ops_view, plans_view

        return Group(plans_view(self), ops_view(self.report()))

    def __str__(self) -> str:
        from shardwise.render.terminal import plain_text

        return plain_text(self)

    def to_json(self) -> dict[str, Any]:
        """The JSON contract of ``shardwise plan --model/--function … --json``."""
        out: dict[str, Any] = {
            "program": self.program,
            "mesh": dict(self.mesh.axes),
            "profile": self.profile.name,
            "train": self.train,
            "ops": self.ops,
            "considered": self.considered,
            "solve_seconds": round(self.solve_seconds, 4),
            "optimal": self.optimal,
            "method": self.method,
            "chosen": "search",
            "plans": [self._plan_json(p) for p in self.plans],
            "skipped": [{"name": n, "why": w} for n, w in self.skipped],
        }
        if any(p.verified for p in self.plans):
            out["spearman"] = self.spearman
        return out

    def _plan_json(self, plan: PlannedLayout) -> dict[str, Any]:
        ranks = [len(self.graph.values[v].shape) for v in self.graph.inputs]
        leaves = [s.to_json(r) for s, r in zip(plan.in_specs, ranks, strict=True)]
        item: dict[str, Any] = {
            "name": plan.name,
            "in_specs": list(jax.tree.unflatten(self.graph.tree, leaves)),
            "predicted": plan.predicted.to_json(),
        }
        if plan.verified is not None:
            item["verified"] = plan.verified.to_json()
        return item


def _profile(profile: Profile | str | None, mesh: MeshSpec) -> Profile:
    """As ``plan_einsum`` picks one: these devices' profile for a mesh of that size."""
    if isinstance(profile, Profile):
        return profile
    if profile is not None:
        return load_profile(profile)
    return default_profile(jax.devices()[0].platform, mesh.size)


def _fixed(graph: Graph, fixed: Mapping[str, SpecLike] | None, mesh: MeshSpec) -> dict[int, Spec]:
    out: dict[int, Spec] = {}
    for name, raw in (fixed or {}).items():
        if name not in graph.names:
            raise ArgumentError(
                f"fixed names {name!r}, which is not an input; the inputs are "
                f"{', '.join(graph.names)}."
            )
        k = graph.names.index(name)
        value = graph.values[graph.inputs[k]]
        spec = Spec.parse(raw, f"the fixed spec of {name}")
        spec.validate(mesh, value.shape, f"{name} (shape {value.shape})")
        out[k] = spec.canonical()
    return out


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
    mesh: Any,
    profile: Profile | str | None = None,
    budget: int | None = None,
    fixed: Mapping[str, SpecLike] | None = None,
    train: bool = False,
    top: int = 5,
    time_limit: float = TIME_LIMIT_S,
) -> ProgramPlan:
    """Plan a layout for every array of ``fn(*args)`` on ``mesh``.

    Args:
        fn: a JAX function; with ``train=True``, a scalar loss whose first argument holds the
            parameters (the plan is for one SGD step: ``value_and_grad`` and the update).
        args: arrays or ``jax.ShapeDtypeStruct`` leaves, in any pytrees.
        mesh: a mesh description (``"data=2,model=4"``; it need not exist here) or a ``Mesh``.
        profile: a device profile name or object; default: the devices at hand.
        budget: bytes of memory per device; plans that need more are refused.
        fixed: input name → spec, pinned (e.g. ``{"x": "data"}``); names as in the report
            (``x``, ``params['w1']``).
        top: how many of the search's plans to keep: the best, and runners-up that lay out
            some input another way (each one's inputs differ).

    >>> import jax.numpy as jnp
    >>> S = jax.ShapeDtypeStruct
    >>> p = plan(lambda x, w: x @ w, S((512, 256), "float32"), S((256, 1024), "float32"),
    ...          mesh="x=4", profile="cpu-2core", top=1)
    >>> p.chosen.name, p.optimal, len(p.plans) > 1
    ('search', True, True)
    """
    spec = MeshSpec.parse(mesh)
    prof = _profile(profile, spec)
    if top < 1:
        raise ArgumentError(f"top is {top}; give 1 or more plans to keep.")
    name = getattr(fn, "__name__", "program")
    graph = build(train_step(fn) if train else fn, args, name, signature=fn)
    eff = effective_mesh(spec)
    fixed_specs = _fixed(graph, fixed, spec)
    start = time.perf_counter()
    plans, skipped = [], []
    full = build_problem(graph, eff, prof)
    searchable = _pinned(graph, full, fixed_specs)
    searched = _search(graph, searchable, eff, budget, top, time_limit)
    for k, sol in enumerate(searched):
        name_k = "search" if k == 0 else f"search {k + 1}"
        plans.append(_planned(name_k, graph, searchable, sol, eff, prof))
    for base in NAMES:
        pins = baseline(base, graph, eff, fixed_specs)
        if isinstance(pins, str):
            skipped.append((base, pins))
            continue
        problem = _pinned(graph, full, pins)
        limits = memory_constraints(graph, problem, budget, eff) if budget else []
        result = solve(problem, limits, time_limit=time_limit)
        if result is None:
            skipped.append((base, "it does not fit the memory budget"))
            continue
        plans.append(_planned(base, graph, problem, result, eff, prof))
    plans.sort(key=lambda p: p.predicted.seconds)
    return ProgramPlan(
        program=name,
        mesh=spec,
        profile=prof,
        train=train,
        graph=graph,
        ops=graph.ops,
        considered=searchable.considered,
        solve_seconds=time.perf_counter() - start,
        optimal=searched[0].optimal,
        method=searched[0].method,
        plans=tuple(plans),
        skipped=tuple(skipped),
    )


def _pinned(graph: Graph, problem: Problem, pins: Mapping[int, Spec]) -> Problem:
    """``problem`` with the inputs in ``pins`` fixed to their specs."""
    keep: dict[int, list[int]] = {}
    for k, spec in pins.items():
        root = graph.find(graph.inputs[k])
        var = _input_vars(graph, problem)[k]
        if var in keep:
            continue
        choices = problem.choices[var]
        if spec not in choices:
            raise SpecError(
                f"{graph.names[k]} cannot be laid out as {spec.describe()} on this mesh: its "
                f"shape {graph.values[root].shape} does not divide."
            )
        keep[var] = [choices.index(spec)]
    return problem.restrict(keep)


def _search(
    graph: Graph,
    problem: Problem,
    mesh: MeshSpec,
    budget: int | None,
    top: int,
    time_limit: float,
) -> list[Solution]:
    constraints = memory_constraints(graph, problem, budget, mesh) if budget else []
    first = solve(problem, constraints, time_limit=time_limit)
    if first is None:
        raise ArgumentError(
            f"no plan fits in {budget:,} bytes per device on mesh {mesh.describe()}; give a "
            "larger budget (--device-memory from the command line) or a larger mesh."
        )
    found = [first]
    inputs = sorted(set(_input_vars(graph, problem)))
    if constraints:
        # a local move may break a budget: find each next plan by excluding the ones found,
        # one integer program each
        exclude = [{v: first.choice[v] for v in inputs}]
        while len(found) < top:
            more = solve(problem, constraints, exclude, time_limit)
            if more is None:
                break
            found.append(more)
            exclude.append({v: more.choice[v] for v in inputs})
        return found
    return found + _runners_up(problem, inputs, first, top - 1, time_limit)


def _input_vars(graph: Graph, problem: Problem) -> list[int]:
    """The variable of each input's class, in input order."""
    var_of = {label: k for k, label in enumerate(problem.labels)}
    return [var_of[("class", graph.find(v))] for v in graph.inputs]


def _runners_up(
    problem: Problem, inputs: list[int], best: Solution, count: int, time_limit: float
) -> list[Solution]:
    """For each input, the best plan that lays it out another way, cheapest first: what the
    best plan's choice for that input is worth (then each input's second best, and so on).

    Where dynamic programming solved the problem, each is solved exactly, and the first of
    them is the second-best plan overall (it must lay out some input differently). Where an
    integer program did (cycles), each is found by local search from the best plan
    (:func:`~shardwise._planner.search.descend`): one integer program per input layout took
    seconds (a 2-layer transformer's training step has 113)."""
    if count < 1:
        return []
    exact = best.method == "dynamic programming"
    near = neighbours(problem)
    seen = {tuple(best.choice[v] for v in inputs)}
    out: list[tuple[int, float, Solution]] = []
    for v in inputs:
        alternatives = []
        for c in range(len(problem.choices[v])):
            if c == best.choice[v]:
                continue
            if exact:
                sol = solve(problem.restrict({v: [c]}), time_limit=time_limit)
            else:
                start = list(best.choice)
                start[v] = c
                sol = descend(problem, start, v, near, settled=best.optimal)
            if sol is None:
                continue
            choice = list(sol.choice)
            choice[v] = c
            key = tuple(choice[u] for u in inputs)
            if key not in seen:
                seen.add(key)
                alternatives.append(dataclasses.replace(sol, choice=tuple(choice)))
        alternatives.sort(key=lambda sol: sol.seconds)
        out += [(rank, sol.seconds, sol) for rank, sol in enumerate(alternatives)]
    # each input's best alternative first, then each one's second best, ...
    return [sol for _, _, sol in sorted(out, key=lambda r: r[:2])[:count]]


def _planned(
    name: str, graph: Graph, problem: Problem, sol: Solution, mesh: MeshSpec, profile: Profile
) -> PlannedLayout:
    layouts, pred = predicted(graph, problem, sol.choice, mesh, profile)
    in_specs = tuple(layouts.specs[v] for v in graph.inputs)
    return PlannedLayout(name, in_specs, layouts, pred)
