"""What one solution of a program's planning problem means: each array's layout, each dot's
strategy, and the prediction (time, collectives with the op and source line behind each,
FLOPs, and per-device memory at its peak, from :mod:`~shardwise._program.memory`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from shardwise._model.cost import PredictedCollective
from shardwise._model.mesh import MeshSpec
from shardwise._model.profile import Profile
from shardwise._model.spec import Spec
from shardwise._model.strategy import Strategy
from shardwise._program.explain import Tally, retally
from shardwise._program.graph import Graph
from shardwise._program.memory import peak_bytes
from shardwise._program.overlap import overlapped_seconds
from shardwise._program.problem import Problem
from shardwise._program.remat import alike, merged_steps
from shardwise._program.steps import StepCosts, map_specs


@dataclass(frozen=True, slots=True)
class ProgramPrediction:
    """A plan's predicted cost per device."""

    seconds: float
    memory_bytes: int
    flops: float
    collectives: tuple[PredictedCollective, ...]
    step_seconds: tuple[float, ...] = ()
    """Each step's time (all its repeats): its own work and the moves it makes."""
    elementwise_seconds: float = 0.0
    """The elementwise ops' time: :attr:`seconds` is this plus every step's."""
    overlapped_seconds: float = math.nan
    """The step time where collectives run beside compute, as XLA runs them on GPUs and TPUs
    (:mod:`~shardwise._program.overlap`); on a CPU, :attr:`seconds`."""

    def to_json(self) -> dict[str, object]:
        return {
            "seconds": self.seconds,
            "overlapped_seconds": self.overlapped_seconds,
            "memory_bytes": self.memory_bytes,
            "flops": self.flops,
            "collectives": [c.to_json() for c in self.collectives],
        }


@dataclass(frozen=True, slots=True)
class Layouts:
    """A solution read back: each array's spec, and by each step's place in the jaxpr the
    layouts its operands are read in and its result is made in (a dot's strategy; a map's
    operand with the dimensions it needs whole, and its result; whole for an opaque op), and
    for a scan's slicing and stacking, by (the scan's place, the stacked array), the layout
    the stack is read in and the one each slice is made in (slicing), or the one the stack is
    made in (stacking)."""

    specs: dict[int, Spec]
    steps: dict[tuple[int, ...], tuple[tuple[Spec, ...], Spec]]
    scans: dict[tuple[tuple[int, ...], int], tuple[Spec, Spec]] = field(default_factory=dict)


def chosen(problem: Problem, choice: Sequence[int], kind: str) -> dict[int, Any]:
    """What ``choice`` picks for each variable of ``kind``: a spec by class root
    (``"class"``), a strategy by step index (``"dot"``)."""
    return {
        label[1]: problem.choices[k][c]
        for k, (label, c) in enumerate(zip(problem.labels, choice, strict=True))
        if label[0] == kind
    }


def read(
    graph: Graph, problem: Problem, choice: Sequence[int], mesh: MeshSpec,
    near: Layouts | None = None,
) -> Layouts:  # fmt: skip
    """The layouts ``choice`` gives each array and step; a map's are ``near``'s (a plan's
    of the same graph) where it reads its operand in the same layout."""
    by_class = chosen(problem, choice, "class")
    specs: dict[int, Spec] = {v: by_class[root] for v, root in enumerate(graph.classes)}
    steps: dict[tuple[int, ...], tuple[tuple[Spec, ...], Spec]] = {}
    for k, strategy in chosen(problem, choice, "dot").items():
        step = graph.steps[k]
        assert isinstance(strategy, Strategy) and step.op is not None
        steps[step.key] = (strategy.in_specs(step.op), strategy.out_spec)
    scans: dict[tuple[tuple[int, ...], int], tuple[Spec, Spec]] = {}
    for step in graph.steps:
        if step.role in ("scan slice", "scan stack"):
            whole, mapped, _ = map_specs(graph, step, specs[step.inputs[0]], mesh)
            stack = step.inputs[0] if step.role == "scan slice" else step.output
            scans[(step.key, stack)] = (whole, mapped)
        elif step.kind == "map" and not step.implicit:
            src = specs[step.inputs[0]]
            if near is not None and near.specs[step.inputs[0]] is src:
                steps[step.key] = near.steps[step.key]
                continue
            whole, mapped, _ = map_specs(graph, step, src, mesh)
            steps[step.key] = ((whole,), mapped)
        elif step.kind == "opaque":
            steps[step.key] = ((Spec(),) * len(step.inputs), Spec())
    return Layouts(specs, steps, scans)


def predicted(
    graph: Graph,
    problem: Problem,
    choice: Sequence[int],
    mesh: MeshSpec,
    profile: Profile,
    shared: bool = True,
    costs: StepCosts | None = None,
) -> tuple[Layouts, ProgramPrediction]:
    """The layouts of a solution and their predicted cost: each step's time and collectives,
    each collective attributed to the step that causes it, with the reason
    (:class:`~shardwise._program.explain.Tally`), and the elementwise ops' time. A move that
    XLA makes once for two readers is counted once (``shared=False`` counts it for each, as the
    solver's matrices do). ``costs``: the graph's step costs on ``mesh`` under ``profile``,
    shared by the plans of one program (each step alike costed once)."""
    costs = StepCosts(graph, mesh, profile) if costs is None else costs
    found = predict(graph, problem, choice, costs, shared)
    return found.lay, found.prediction


class Predicted(NamedTuple):
    """:func:`predicted`'s layouts and prediction, with what a plan near it reuses: the
    tally, the dots' strategies and each class's elementwise time (in root order)."""

    lay: Layouts
    prediction: ProgramPrediction
    tally: Tally
    strategies: dict[int, Any]
    elementwise: list[float]


def predict(
    graph: Graph,
    problem: Problem,
    choice: Sequence[int],
    costs: StepCosts,
    shared: bool = True,
    near: Predicted | None = None,
) -> Predicted:
    """:func:`predicted`, the same, from the prediction of a plan ``near`` it (of the same
    graph, costs and ``shared``, tallied in full) where given: only the steps and classes
    that this plan lays out otherwise are costed again
    (:func:`~shardwise._program.explain.retally`). A checkpoint's recomputed dot that XLA
    merges with the forward pass's (:func:`~shardwise._program.remat.twins`) takes no time."""
    mesh = costs.mesh
    lay = read(graph, problem, choice, mesh, None if near is None else near.lay)
    strategies = chosen(problem, choice, "dot")
    if near is None or near.tally.prior is not None or near.tally.shared != shared:
        tally = Tally(graph, lay, costs, shared)
        for k in range(len(graph.steps)):
            tally.step(k, strategies.get(k))
    else:
        tally = retally(near.tally, lay, strategies, near.strategies)
    roots = sorted(set(graph.classes))
    if near is None:
        elementwise = [costs.elementwise(root, lay.specs[root]) for root in roots]
    else:
        was = near.lay.specs
        elementwise = [
            kept if lay.specs[root] == was[root] else costs.elementwise(root, lay.specs[root])
            for root, kept in zip(roots, near.elementwise, strict=True)
        ]
    memory = peak_bytes(graph, lay, mesh, costs.profile.platform)
    total = sum(elementwise)
    merged = merged_steps(graph, lambda k, f: alike(graph, lay, k, f))
    ran = tally.without({k for k in merged if graph.steps[k].kind == "dot"})
    seconds = sum(ran.seconds) + total
    overlapped = (
        overlapped_seconds(graph, ran, total) if costs.profile.overlaps_collectives else seconds
    )
    prediction = ProgramPrediction(
        seconds, memory, ran.flops, ran.collectives(), tuple(ran.seconds), total, overlapped
    )
    return Predicted(lay, prediction, tally, strategies, elementwise)
