"""Plan whole programs: a layout for every array of a JAX function, chosen by cost.

:func:`plan` traces the function (:mod:`~shardwise._program.graph`), costs every choice
(:mod:`~shardwise._program.problem`), finds the cheapest (:mod:`~shardwise._program.search`),
and puts the named baselines (:mod:`~shardwise._program.baselines`) beside it. The result, a
:class:`ProgramPlan`, runs (``sharded``) and checks itself against XLA (``verify``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jax

from shardwise._errors import ArgumentError, as_users
from shardwise._model.mesh import MeshSpec
from shardwise._model.plan import check_program_extent
from shardwise._model.profile import Profile
from shardwise._model.profile_files import default_profile, load_profile
from shardwise._model.spec import Spec, SpecLike
from shardwise._model.units import parse_bytes
from shardwise._program.graph import Graph, build
from shardwise._program.problem import MAX_CHOICES, Problem, build_problem, effective_mesh
from shardwise._program.report import ProgramReport, report
from shardwise._program.search import TIME_LIMIT_S, Solution, solve
from shardwise._program.solution import Layouts, ProgramPrediction, predicted
from shardwise._program.top import baselines, best_plans, fixed_pins, nothing_fits, peak, pinned
from shardwise._program.verify import sharded, tune, verify
from shardwise._xla.verified import Verified


@dataclass(frozen=True, slots=True)
class PlannedLayout:
    """One plan of a program: its name, the inputs' specs, every array's layout, the cost."""

    name: str
    in_specs: tuple[Spec, ...]
    layouts: Layouts
    predicted: ProgramPrediction
    verified: Verified | None = None
    over_budget: bool = False
    """Whether its predicted peak memory per device is over the plan's budget: only a
    baseline can be (it is shown, to compare, but never chosen nor run by ``verify``)."""


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
        chosen_name: the plan :attr:`chosen` names: the search's (``"search"``), or after
            ``tune`` the one that ran fastest on the devices at hand.
        tuned: whether ``tune`` chose by measuring.
        pinned: the inputs ``fixed`` pins, by position.
        budget: bytes of memory per device the plans were made for (``None``: no limit);
            every plan of the search fits it, and a baseline that does not is marked
            :attr:`PlannedLayout.over_budget`.
        complete: whether the search looked at every layout of every array and dot;
            ``False`` where some had more than :data:`~shardwise._program.problem.MAX_CHOICES`
            and it kept that many, spread evenly (:attr:`stopped_early` says so in words).
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
    chosen_name: str = "search"
    tuned: bool = False
    pinned: tuple[int, ...] = ()
    budget: int | None = None
    complete: bool = True

    @property
    def stopped_early(self) -> str | None:
        """Why not every layout was looked at, or ``None`` when every one was."""
        if self.complete:
            return None
        return (
            f"some arrays or dots have more than {MAX_CHOICES:,} layouts on this mesh; the "
            f"search looked at {MAX_CHOICES:,} of each, spread evenly, so a better plan may "
            "exist. Plan a mesh with fewer axes (merge axes, e.g. x=2,y=2 as xy=4)."
        )

    @property
    def chosen(self) -> PlannedLayout:
        """The plan to run: the search's, or after :meth:`tune` the fastest measured."""
        return self.get(self.chosen_name)

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

    def fastest_measured(self) -> PlannedLayout | None:
        """The verified plan that ran fastest, of those that keep the inputs ``fixed`` pins
        (a baseline may lay them out its own way); ``None`` before :meth:`verify`."""
        search = self.get("search").in_specs
        keeps = [
            p for p in self.plans
            if p.verified is not None and not p.over_budget
            and all(p.in_specs[k].canonical() == search[k].canonical() for k in self.pinned)
        ]  # fmt: skip
        return min(
            keeps, key=lambda p: p.verified.seconds if p.verified else math.inf, default=None
        )

    def sharded(self, name: str | None = None, mesh: Any = None) -> Callable[..., Any]:
        """The program compiled to follow plan ``name`` (by default the chosen one) on
        ``mesh`` (by default the planned mesh, built on the devices at hand): inputs placed by
        the plan's specs, and every intermediate constrained to its layout so XLA's
        partitioner follows the plan."""
        return sharded(self, self.get(name or self.chosen_name), mesh)

    def verify(self, repeat: int = 5, mesh: Any = None, on_step: Any = None) -> ProgramPlan:
        """Compile every plan here, compare its collectives and memory with the prediction,
        time it (median of ``repeat`` runs), and rank-correlate predicted and measured times."""
        return verify(self, repeat, mesh, on_step)

    def tune(self, repeat: int = 5, mesh: Any = None, on_step: Any = None) -> ProgramPlan:
        """:meth:`verify`, then choose the plan that ran fastest (of those that keep the
        inputs ``fixed`` pinned): where the cost model cannot tell plans apart, the devices
        at hand decide. :attr:`chosen`, :meth:`sharded`,
        :meth:`report` and the JSON's ``"chosen"`` then name that plan."""
        return tune(self, repeat, mesh, on_step)

    def report(self, name: str | None = None) -> ProgramReport:
        """Plan ``name`` (by default the chosen one) op by op: layouts in and out, each
        collective and why, time shares, and the memory held per device over the program."""
        return report(self, name or self.chosen_name)

    def to_html(self, name: str | None = None) -> str:
        """One self-contained HTML file (no network needed to view it): the plans compared, each
        with its layouts and, a click away, its view op by op (every array drawn on the mesh,
        each collective's cause, the memory held per device over the program); plan ``name``
        (by default the chosen one) is shown open."""
        from shardwise.render.report import program_html

        shown = self.report(name).to_json()
        plans = {
            p.name: {
                "layouts": [
                    f"{n}: {s.describe()}"
                    for n, s in zip(self.graph.names, p.in_specs, strict=True)
                ],
                "report": shown if p.name == shown["plan"] else self.report(p.name).to_json(),
            }
            for p in self.plans
        }
        return program_html({"plan": self.to_json(), "report": shown, "plans": plans})

    def _repr_html_(self) -> str:
        """The report of :meth:`to_html` as one element to show inside a page (a notebook's
        cell): its styles and script touch nothing outside it."""
        from shardwise.render.report import program_html

        shown = self.report().to_json()
        return program_html({"plan": self.to_json(), "report": shown}, page=False)

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
            "chosen": self.chosen_name,
            "tuned": self.tuned,
            "plans": [self._plan_json(p) for p in self.plans],
            "skipped": [{"name": n, "why": w} for n, w in self.skipped],
            "budget_bytes": self.budget,
            "complete": self.complete,
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
            "over_budget": plan.over_budget,
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
    budget: int | str | None = None,
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
        budget: memory per device (bytes, or text like ``"16GiB"``): the search's plans fit
            it; a baseline that does not is marked over budget, never chosen. Where no plan
            fits, an :class:`ArgumentError` names the smallest one found.
        fixed: input name → spec, pinned (e.g. ``{"x": "data"}``); names as in the report
            (``x``, ``params['w1']``).
        top: how many of the search's plans to keep: the best, and runners-up that lay out
            some input another way (each one's inputs differ).

    What ``fn`` raises while traced comes back as a :class:`UserCodeError` that says where.

    >>> import jax.numpy as jnp
    >>> S = jax.ShapeDtypeStruct
    >>> p = plan(lambda x, w: x @ w, S((512, 256), "float32"), S((256, 1024), "float32"),
    ...          mesh="x=4", profile="cpu-2core", top=1)
    >>> p.chosen.name, p.optimal, len(p.plans) > 1
    ('search', True, True)
    """
    limit, spec = None if budget is None else parse_bytes(budget, "budget"), MeshSpec.parse(mesh)
    prof = _profile(profile, spec)
    if top < 1:
        raise ArgumentError(f"top is {top}; give 1 or more plans to keep.")
    name, graph = _traced(fn, args, train)
    eff = effective_mesh(spec)
    fixed_specs = fixed_pins(graph, fixed, spec)
    start = time.perf_counter()
    full = build_problem(graph, eff, prof)
    searchable = pinned(graph, full, fixed_specs)
    peaks: list[int] = []  # of the search's plans checked against the budget

    def fits(sol: Solution) -> bool:
        peaks.append(peak(graph, searchable, sol, eff, prof))
        return limit is None or peaks[-1] <= limit

    searched = best_plans(graph, searchable, eff, limit, top, time_limit, fits)
    plans = [
        _planned("search" if k == 0 else f"search {k + 1}", graph, searchable, sol, eff, prof)
        for k, sol in enumerate(searched)
    ]
    solved, skipped = baselines(graph, full, eff, fixed_specs, limit, time_limit)
    plans += [_planned(b, graph, pb, sol, eff, prof, limit) for b, pb, sol in solved]
    if not searched:  # under a budget only: the search always finds a plan without one
        raise _nothing_fits(name, graph, searchable, eff, prof, plans, peaks, limit)
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
        pinned=tuple(sorted(fixed_specs)),
        budget=limit,
        complete=not searchable.truncated,
    )


def _traced(fn: Callable[..., Any], args: Any, train: bool) -> tuple[str, Graph]:
    """The program's name and graph (of its training step with ``train``): what ``fn`` raises
    is the user's, said as such; a program past what XLA can count is refused."""
    name = getattr(fn, "__name__", "program")
    traced = as_users(fn, name)
    graph = build(train_step(traced) if train else traced, args, name, signature=fn)
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


def _planned(
    name: str,
    graph: Graph,
    problem: Problem,
    sol: Solution,
    mesh: MeshSpec,
    profile: Profile,
    limit: int | None = None,
) -> PlannedLayout:
    """The plan ``sol`` names, over budget where its predicted peak is over ``limit``."""
    layouts, pred = predicted(graph, problem, sol.choice, mesh, profile)
    in_specs = tuple(layouts.specs[v] for v in graph.inputs)
    over = limit is not None and pred.memory_bytes > limit
    return PlannedLayout(name, in_specs, layouts, pred, over_budget=over)
