"""One plan of a program read op by op: what each op reads and makes, in which layouts, the
collectives it causes and why, its share of the predicted time, and the per-device memory held
at every point of the program.

This is the data the terminal, JSON and HTML reports of ``shardwise plan`` draw; it is pure
(no JAX calls, no rendering).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shardwise._model.cost import PredictedCollective
from shardwise._model.spec import Spec
from shardwise._program.explain import dims_of, layout_text
from shardwise._program.memory import held_curve
from shardwise._program.nodes import Step

if TYPE_CHECKING:
    from shardwise._program.plans import PlannedLayout, ProgramPlan


@dataclass(frozen=True, slots=True)
class ArrayView:
    """One array as an op sees it: its name, shape, the layout it is held in, and the layout
    the op reads (or makes) it in; ``dims`` names its dimensions (einsum letters, or
    ``d0, d1…``)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    held: Spec
    used: Spec
    dims: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        rank = len(self.shape)
        return {
            "name": self.name,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "dims": list(self.dims),
            "held": self.held.to_json(rank),
            "used": self.used.to_json(rank),
            "held_text": layout_text(self.held, self.dims),
            "used_text": layout_text(self.used, self.dims),
        }


@dataclass(frozen=True, slots=True)
class OpRow:
    """One op of the program that computes or moves data.

    Attributes:
        step: its place among the graph's steps.
        op: the primitive, with a dot's einsum (``dot_general ab,bc->ac``).
        source: ``file:line`` of the user's code.
        module: the library module that made it (``MLP/Dense_0``), where the library says.
        mirrors: for an op of a training step's backward pass, the forward op at the same
            line it is the transpose of (``dot_general at models.py:34``); else ``""``.
        inputs, output: the arrays it reads and makes.
        collectives: what it causes, with the reason for each.
        seconds: its predicted time (all repeats), and ``share`` of the plan's total.
        repeat: how many times it runs (a scan's length).
        at: its program point (the x axis of the memory curve).
    """

    step: int
    op: str
    source: str
    mirrors: str
    inputs: tuple[ArrayView, ...]
    output: ArrayView
    collectives: tuple[PredictedCollective, ...]
    seconds: float
    share: float
    repeat: int
    at: int
    module: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "op": self.op,
            "source": self.source,
            "module": self.module,
            "mirrors": self.mirrors,
            "inputs": [a.to_json() for a in self.inputs],
            "output": self.output.to_json(),
            "collectives": [c.to_json() for c in self.collectives],
            "seconds": self.seconds,
            "share": self.share,
            "repeat": self.repeat,
            "at": self.at,
        }


@dataclass(frozen=True, slots=True)
class MemoryCurve:
    """Bytes held per device at every program point, the peak, and what is held there."""

    points: tuple[int, ...]
    peak: int
    at: int
    alive: tuple[tuple[str, int], ...]

    @property
    def others(self) -> int:
        """The bytes at the peak that are not the arrays listed: the copies that moves make,
        partial sums, and the buffers steps make for their operands and results."""
        return max(0, self.peak - sum(b for _, b in self.alive))

    def to_json(self) -> dict[str, Any]:
        return {
            "points": list(self.points),
            "peak": self.peak,
            "at": self.at,
            "alive": [{"name": n, "bytes": b} for n, b in self.alive],
            "others": self.others,
        }


@dataclass(frozen=True, slots=True)
class ProgramReport:
    """One plan of a :class:`ProgramPlan` op by op, with its memory over the program.

    Its time adds up: :attr:`seconds` is the rows' seconds, plus :attr:`maps_seconds` (the
    layout maps that cause no collective: transposes, reshapes, slices, which only read and
    write), plus :attr:`elementwise_seconds`. :attr:`not_modelled` names the primitives
    planned whole because shardwise has no rule for them."""

    program: str
    plan: str
    mesh: tuple[tuple[str, int], ...]
    train: bool
    rows: tuple[OpRow, ...]
    memory: MemoryCurve
    seconds: float
    maps_seconds: float = 0.0
    elementwise_seconds: float = 0.0
    not_modelled: tuple[str, ...] = ()

    def __rich__(self) -> Any:
        from shardwise.render.program import ops_view

        return ops_view(self)

    def __str__(self) -> str:
        from shardwise.render.terminal import plain_text

        return plain_text(self)

    def to_json(self) -> dict[str, Any]:
        return {
            "program": self.program,
            "plan": self.plan,
            "mesh": [[a, n] for a, n in self.mesh],
            "train": self.train,
            "seconds": self.seconds,
            "maps_seconds": self.maps_seconds,
            "elementwise_seconds": self.elementwise_seconds,
            "not_modelled": list(self.not_modelled),
            "rows": [r.to_json() for r in self.rows],
            "memory": self.memory.to_json(),
        }


def memory_curve(plan: ProgramPlan, chosen: PlannedLayout) -> MemoryCurve:
    """Per-device bytes held at each program point under ``chosen``'s layouts
    (:func:`~shardwise._program.solution.held_curve`), and the arrays held at the peak."""
    held = held_curve(plan.graph, chosen.layouts, plan.mesh, plan.profile.platform)
    points = held.points
    if not len(points):
        return MemoryCurve((0,), 0, 0, ())
    at = int(points.argmax())
    # the arrays the curve holds there; a temporary (one XLA may put in a result's buffer
    # before that is made) is counted with the step's copies, among the others: listed, they
    # had added up past the peak, results not yet made among them
    there = held.lives.alive(at) & ~held.lives.temporary
    alive = sorted(
        (
            (plan.graph.values[v].name, int(held.sizes[k]))
            for k, v in enumerate(held.arrays)
            if there[k]
        ),
        key=lambda item: -item[1],
    )
    return MemoryCurve(tuple(int(p) for p in points), int(points[at]), at, tuple(alive))


def _mirrors(steps: Sequence[Step], step: Step) -> str:
    if not step.backward:
        return ""
    for other in steps:
        if not other.backward and other.source == step.source and other.kind == step.kind:
            return f"{other.prim} at {other.source}"
    return f"an op at {step.source}" if step.source else "a forward op"


def _view(plan: ProgramPlan, chosen: PlannedLayout, step: Step, position: int, used: Spec) -> Any:
    graph = plan.graph
    v = step.output if position < 0 else step.inputs[position]
    value = graph.values[v]
    dims = dims_of(step, position, len(value.shape))
    names = tuple(f"d{k}" for k in range(dims)) if isinstance(dims, int) else tuple(dims)
    return ArrayView(value.name, value.shape, value.dtype, chosen.layouts.specs[v], used, names)


def report(plan: ProgramPlan, name: str) -> ProgramReport:
    """Plan ``name`` of ``plan`` op by op: a row per dot, per opaque op, and per map that
    causes a collective (the other maps' time is summed in :attr:`ProgramReport.maps_seconds`)."""
    chosen = plan.get(name)
    graph = plan.graph
    by_step: dict[int, list[PredictedCollective]] = {}
    for c in chosen.predicted.collectives:
        by_step.setdefault(c.step, []).append(c)
    total = chosen.predicted.seconds or 1.0
    rows = []
    maps = 0.0
    for k, step in enumerate(graph.steps):
        seconds = chosen.predicted.step_seconds[k]
        if step.kind == "map" and k not in by_step:
            maps += seconds
            continue
        specs = chosen.layouts.specs
        ins, out = chosen.layouts.steps.get(
            step.key, (tuple(specs[a] for a in step.inputs), specs[step.output])
        )
        op = f"{step.prim} {step.op.equation}" if step.op is not None else step.prim
        if not step.modelled:
            op += " (not modelled: planned whole)"
        rows.append(
            OpRow(
                step=k,
                op=op,
                source=step.source,
                module=step.module,
                mirrors=_mirrors(graph.steps, step),
                inputs=tuple(_view(plan, chosen, step, p, s) for p, s in enumerate(ins)),
                output=_view(plan, chosen, step, -1, out),
                collectives=tuple(by_step.get(k, ())),
                seconds=seconds,
                share=seconds / total,
                repeat=step.repeat,
                at=graph.born[step.output],
            )
        )
    return ProgramReport(
        program=plan.program,
        plan=name,
        mesh=plan.mesh.axes,
        train=plan.train,
        rows=tuple(rows),
        memory=memory_curve(plan, chosen),
        seconds=chosen.predicted.seconds,
        maps_seconds=maps,
        elementwise_seconds=chosen.predicted.elementwise_seconds,
        not_modelled=graph.not_modelled,
    )
