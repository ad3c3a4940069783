"""A program's plans, as :func:`~shardwise._program.program.plan` returns them: the search's
best, its runners-up and the baselines, each with every array's layout and its prediction,
and what can be done with them (run, place arguments, verify, tune, report)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
from jax.sharding import Mesh, PartitionSpec

from shardwise._errors import ArgumentError
from shardwise._model.logical import LogicalRules, rules_for
from shardwise._model.mesh import MeshSpec
from shardwise._model.profile import Profile
from shardwise._model.spec import Spec
from shardwise._program.annotations import (
    NO_ANNOTATIONS,
    Annotations,
    avoided,
    first_reader,
    named_arrays,
)
from shardwise._program.emit import plain, regex_rules, shardings
from shardwise._program.graph import Graph
from shardwise._program.problem import MAX_CHOICES
from shardwise._program.report import ProgramReport, report
from shardwise._program.solution import Layouts, ProgramPrediction
from shardwise._program.verify import place, same_programs, sharded, tune, verify
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
    """Whether its predicted peak memory per device is over the plan's budget (shown, to
    compare, not run by ``verify``: :attr:`ProgramPlan.runnable`)."""

    @property
    def searched(self) -> bool:
        """Whether the search found it (``search``, ``search 2``…), not a baseline."""
        return self.name == "search" or self.name.startswith("search ")


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
        ordered: of the pairs of plans whose measured times differ by more than 25% (the
            machine tells them apart), the share the prediction orders alike; and
            ``ordered_pairs``, how many such pairs there are (after ``verify``).
        chosen_name: the plan :attr:`chosen` names: the search's (``"search"``), or after
            ``tune`` the one that ran fastest on the devices at hand.
        tuned: whether ``tune`` chose by measuring.
        pinned: the inputs ``fixed`` pins, by position.
        budget: bytes of memory per device the plans were made for (``None``: no limit); a
            plan over it is marked :attr:`PlannedLayout.over_budget`.
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
    ordered: float | None = None
    ordered_pairs: int = 0
    chosen_name: str = "search"
    tuned: bool = False
    pinned: tuple[int, ...] = ()
    budget: int | None = None
    complete: bool = True
    devices: Mesh | None = None
    """The JAX mesh the plan was made for, where it was given one (or one was set with
    ``jax.set_mesh``): :meth:`sharded`, :meth:`place` and :meth:`verify` use it by default."""
    annotations: Annotations = NO_ANNOTATIONS
    """What the arguments said about their layout (Flax's annotations, arrays' shardings)."""
    respect: str = "none"
    """What the plans hold fixed of what the model says: ``"none"`` (the search chose every
    layout), ``"annotations"`` (the inputs as annotated), ``"constraints"`` (every array the
    code constrains as it asks) or ``"names"`` (plans rules over the model's names write)."""
    over_memory: str | None = None
    """Why no plan fits a device's memory, where the plan was made within the profile's
    memory by default (``budget="device"``) and none fit: the plans are then the search's
    without a bound, the chosen one the fastest. ``None``: the chosen plan fits, or the
    profile gives no memory."""
    donate_argnums: tuple[int, ...] = ()
    """The arguments whose buffers the results may take (``jax.jit``'s ``donate_argnums``):
    the memory counts a result written over one as held in its buffer, and :meth:`sharded`
    donates them."""

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

    def logical_rules(self, name: str | None = None) -> LogicalRules:
        """The ordered logical axis rules that give the annotated parameters their layouts in
        the plan called ``name`` (default: the chosen one), checked by resolving each
        parameter's names again as Flax does; names the plan lays out two ways that no rules
        reconcile are in ``conflicts``, never resolved silently.

        >>> import flax.linen as nn, shardwise
        >>> S = jax.ShapeDtypeStruct
        >>> w = nn.LogicallyPartitioned(S((256, 1024), "float32"), ("embed", "mlp"))
        >>> p = shardwise.plan(lambda w, x: x @ w.value, w, S((64, 256), "float32"), mesh="model=4",
        ...          profile="cpu-2core", fixed={"w.value": "-,model"})
        >>> p.logical_rules().to_flax()
        (('embed', None), ('mlp', 'model'))
        """
        chosen = self.get(name) if name is not None else self.chosen
        return rules_for(
            named_arrays(self.annotations, self.graph, chosen.in_specs, chosen.layouts.specs)
        )

    def rule_reasons(self, name: str | None = None) -> list[tuple[str, Any, str, str]]:
        """Each rule of :meth:`logical_rules` with why: ``(logical name, mesh axes, the first
        array so named, the op that first reads it)`` — the op whose cost set the layout."""
        made = self.logical_rules(name)
        first: dict[str, tuple[str, str]] = {}
        for k, a in self.annotations.by_input.items():
            for n in a.names:
                if isinstance(n, str) and n not in first:
                    first[n] = (self.graph.names[k], first_reader(self.graph, k))
        return [(n, axes, *first.get(n, ("", ""))) for n, axes in made.rules]

    def to_regex(self, name: str | None = None) -> tuple[tuple[str, PartitionSpec], ...]:
        """Plan ``name`` (default: the chosen one) as rules by path, as EasyDeL takes them:
        ordered ``(regex, PartitionSpec)`` pairs where the first regex that ``re.search``
        finds in an input leaf's path gives that leaf its layout, for every input (annotated
        or not). A path is the argument's name, then each key of the leaf's pytree path,
        joined with ``/`` (``params/Dense_0/kernel``, ``opt_state/0/mu/w``; a Flax box's or
        NNX variable's ``value`` left out). One regex covers the leaves whose last path
        components (digits generalised) all have its spec; ``.*`` ends the rules.

        >>> import jax.numpy as jnp, shardwise
        >>> x, w = jnp.ones((64, 8)), {"w": jnp.ones((8, 32))}
        >>> p = shardwise.plan(lambda x, w: x @ w["w"], x, w, mesh="x=4", profile="cpu-2core",
        ...                    fixed={"x": "x", "w['w']": "-"})
        >>> p.to_regex()
        (('(?:^|/)x$', P('x',)), ('.*', P()))
        """
        return regex_rules(self.get(name) if name is not None else self.chosen, self.graph)

    def shardings(self, name: str | None = None, mesh: Any = None) -> dict[str, Any]:
        """The ``NamedSharding`` of every input leaf in plan ``name`` (default: the chosen
        one) on ``mesh`` (default: the plan's), with its axes Auto, for your own ``jax.jit``
        of code that names no layouts (:meth:`place` and :meth:`sharded` keep Explicit axes
        Explicit), by argument: ``{name: pytree}``, each pytree mirroring that argument, so
        parameters and optimizer state come apart (``shardings()["params"]``)."""
        chosen = self.get(name) if name is not None else self.chosen
        return shardings(self, chosen, mesh)

    def annotations_compared(self) -> dict[str, Any] | None:
        """The plan of the annotations beside the search's (``None`` without one): its time and
        memory as ratios of the search's, and the collectives it causes that the search's plan
        avoids (matched by kind, axes and line), each with its count and bytes."""
        names = [p.name for p in self.plans]
        if "annotations" not in names or "search" not in names:
            return None
        mine, search = self.get("annotations").predicted, self.get("search").predicted
        if search.seconds <= 0 or search.memory_bytes <= 0:
            return None
        return {
            "time_ratio": mine.seconds / search.seconds,
            "memory_ratio": mine.memory_bytes / search.memory_bytes,
            "avoided": avoided(mine.collectives, search.collectives),
        }

    def same_programs(self) -> dict[str, str]:
        """Each plan that is the same program as one listed before it (the same inputs' and
        inner layouts and predicted collectives: a baseline that is the search's plan), by
        name, with that plan's name.

        >>> from shardwise import plan
        >>> from shardwise._program.models import model
        >>> fn, args = model("mlp", batch=64, hidden=32, ffn=64)
        >>> plan(fn, *args, mesh="x=8", profile="cpu-2core", top=1).same_programs()
        {'data-parallel': 'search'}
        """
        return same_programs(self.plans)

    def get(self, name: str) -> PlannedLayout:
        """The plan called ``name`` (``search``, ``search 2``, a baseline's name)."""
        for p in self.plans:
            if p.name == name:
                return p
        why = dict(self.skipped).get(name)  # (a baseline not made says why)
        raise ArgumentError(
            (f"no plan {name!r}: it was skipped, {why}; " if why else f"no plan named {name!r}; ")
            + f"the plans are {', '.join(p.name for p in self.plans)}."
        )

    @property
    def runnable(self) -> tuple[PlannedLayout, ...]:
        """The plans ``verify`` runs, ``tune`` picks from: within budget, or all if none fits."""
        return tuple(p for p in self.plans if not p.over_budget or self.over_memory)

    def fastest_measured(self) -> PlannedLayout | None:
        """The verified plan that ran fastest, of those that keep the inputs ``fixed`` pins
        (a baseline may lay them out its own way); ``None`` before :meth:`verify`."""
        search = self.get("search").in_specs
        keeps = [
            p for p in self.runnable
            if p.verified is not None
            and all(p.in_specs[k].canonical() == search[k].canonical() for k in self.pinned)
        ]  # fmt: skip
        return min(
            keeps, key=lambda p: p.verified.seconds if p.verified else math.inf, default=None
        )

    def sharded(self, name: str | None = None, mesh: Any = None) -> Callable[..., Any]:
        """The program compiled to follow plan ``name`` (by default the chosen one) on ``mesh``
        (by default the planned mesh, built on the devices at hand): inputs placed by the
        plan's specs, every intermediate constrained to its layout for XLA to follow."""
        return sharded(self, self.get(name or self.chosen_name), mesh)

    def place(self, args: Any, name: str | None = None, mesh: Any = None) -> Any:
        """The arguments (parameters, optimizer state, a batch: the pytrees the plan was made
        for, as a tuple) laid out as plan ``name`` (by default the chosen one) says, on
        ``mesh`` (by default the plan's), without ever being whole on one device. Place them
        once, and :meth:`sharded` runs on them without moving them.

        >>> import jax.numpy as jnp
        >>> from shardwise import plan
        >>> p = plan(lambda x, w: x @ w, jnp.ones((8, 4)), jnp.ones((4, 16)), mesh="x=2", top=1)
        >>> x, w = p.place((jnp.ones((8, 4)), jnp.ones((4, 16))))
        >>> x.sharding.spec == p.in_specs[0], w.sharding.spec == p.in_specs[1]
        (True, True)
        """
        return place(self, self.get(name or self.chosen_name), args, mesh)

    def verify(self, repeat: int = 5, mesh: Any = None, on_step: Any = None) -> ProgramPlan:
        """Compile every plan here, compare its collectives and memory with the prediction,
        time it (median of ``repeat`` runs), and rank-correlate predicted and measured times."""
        return verify(self, repeat, mesh, on_step)

    def tune(self, repeat: int = 5, mesh: Any = None, on_step: Any = None) -> ProgramPlan:
        """:meth:`verify`, then choose the plan that ran fastest (of those that keep the
        inputs ``fixed`` pinned): where the cost model cannot tell plans apart, the devices
        at hand decide. :attr:`chosen`, :meth:`sharded`, :meth:`report` and the JSON's
        ``"chosen"`` then name that plan."""
        return tune(self, repeat, mesh, on_step)

    def report(self, name: str | None = None) -> ProgramReport:
        """Plan ``name`` (by default the chosen one) op by op: layouts in and out, each
        collective and why, time shares, and the memory held per device over the program."""
        return report(self, name or self.chosen_name)

    def to_html(self, name: str | None = None) -> str:
        """One self-contained HTML file (no network needed to view it): the plans compared, each
        with its layouts and, a click away, its view op by op (every array drawn on the mesh, each
        collective's cause, the memory per device); plan ``name`` (default: chosen) shown open."""
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

        return program_html({"plan": self.to_json(), "report": self.report().to_json()}, page=False)

    def __rich__(self) -> Any:
        from rich.console import Group

        from shardwise.render.program import ops_view, plans_view

        return Group(plans_view(self), ops_view(self.report()))

    def __str__(self) -> str:
        from shardwise.render.terminal import plain_text

        return plain_text(self)

    def to_json(self) -> dict[str, Any]:
        """The JSON contract of ``shardwise plan --model/--function … --json``."""
        same = self.same_programs()
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
            "plans": [self._plan_json(p, same.get(p.name)) for p in self.plans],
            "skipped": [{"name": n, "why": w} for n, w in self.skipped],
            "budget_bytes": self.budget,
            "over_memory": self.over_memory,
            "complete": self.complete,
            "respect": self.respect,
            "donate_argnums": list(self.donate_argnums),
        }
        compared = self.annotations_compared()
        if compared is not None:
            out["annotations"] = compared
        if any(a.logical for a in self.annotations.by_input.values()):
            out["logical_rules"] = {
                "rules": [[n, list(a) if isinstance(a, tuple) else a, array, op]
                          for n, a, array, op in self.rule_reasons()],
                "conflicts": [c.describe() for c in self.logical_rules().conflicts],
            }  # fmt: skip
        if any(p.verified for p in self.plans):
            out["spearman"] = self.spearman
            out["ordered"] = {"share": self.ordered, "pairs": self.ordered_pairs}
            out["chosen_vs_fastest"] = self.chosen_vs_fastest
        return out

    @property
    def chosen_vs_fastest(self) -> float | None:
        """The chosen plan's measured time over the fastest measured (after ``verify``)."""
        fastest, chosen = self.fastest_measured(), self.chosen.verified
        if fastest is None or fastest.verified is None or chosen is None:
            return None
        return round(chosen.seconds / fastest.verified.seconds, 4)

    def _plan_json(self, plan: PlannedLayout, twin: str | None = None) -> dict[str, Any]:
        ranks = [len(self.graph.values[v].shape) for v in self.graph.inputs]
        leaves = [s.to_json(r) for s, r in zip(plan.in_specs, ranks, strict=True)]
        item: dict[str, Any] = {
            "name": plan.name,
            "in_specs": plain(jax.tree.unflatten(self.graph.tree, leaves)),
            "predicted": plan.predicted.to_json(),
            "over_budget": plan.over_budget,
        }
        if twin is not None:  # (the same program: compiled and timed once)
            item["same_program_as"] = twin
        if plan.verified is not None:
            item["verified"] = plan.verified.to_json()
        return item
