"""The planner: enumerate every strategy, predict its cost, rank them, and verify against XLA.

``rank`` is pure (no devices). ``verify`` compiles the top strategies on the devices at
hand, compares the predicted collectives with the compiled HLO's, runs each, and reports
the rank correlation between predicted and measured time.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from jax.sharding import Mesh

from shardwise._model.cost import Prediction, predict
from shardwise._model.mesh import MeshSpec
from shardwise._model.op import Op, as_shapes
from shardwise._model.plan import Plan, check_extent
from shardwise._model.profile import Profile
from shardwise._model.profile_use import check_platform
from shardwise._model.strategy import MAX_LAYOUTS, Strategy, layout_count, strategies
from shardwise._model.units import format_bytes, format_seconds
from shardwise._runtime.hostmem import Staging, staged
from shardwise._runtime.timing import median_seconds, spearman
from shardwise._xla.explain import compile_plan
from shardwise._xla.hlo import collectives
from shardwise._xla.lower import place
from shardwise._xla.meshes import platform
from shardwise._xla.verified import Verified, collectives_match


@dataclass(frozen=True, slots=True)
class Candidate:
    """A strategy with its predicted (and, after ``verify``, measured) cost."""

    strategy: Strategy
    predicted: Prediction
    verified: Verified | None = None


@dataclass(frozen=True, slots=True)
class Refused:
    """A strategy the memory budget does not allow."""

    strategy: Strategy
    predicted: Prediction
    reason: str


@dataclass(frozen=True, slots=True)
class PlanReport:
    """Every strategy for one einsum on one mesh, ranked by predicted time, best first."""

    op: Op
    mesh: MeshSpec
    shapes: tuple[tuple[int, ...], ...]
    dtype: str
    profile: Profile
    considered: int
    strategies: tuple[Candidate, ...]
    refused: tuple[Refused, ...]
    budget: int | None = None
    spearman: float | None = None
    complete: bool = True
    """Whether every layout was considered; ``False`` when the mesh has more layouts than
    :data:`~shardwise._model.strategy.MAX_LAYOUTS` and the planner stopped at that bound."""

    @property
    def stopped_early(self) -> str | None:
        """Why not every strategy was considered, or ``None`` when every one was."""
        if self.complete:
            return None
        return (
            f"the planner stopped after {MAX_LAYOUTS:,} of "
            f"{layout_count(self.op, self.mesh):,} index layouts (its limit), spread evenly "
            "over them; the ranking covers only those. Plan a mesh with fewer axes (merge "
            "axes, e.g. x=2,y=2 as xy=4), or an equation with fewer indices."
        )

    @property
    def valid(self) -> int:
        """Strategies that divide evenly (ranked and refused alike)."""
        return len(self.strategies) + len(self.refused)

    @property
    def best(self) -> Candidate:
        """The chosen strategy: the best predicted within the budget."""
        return self.strategies[0]

    def why(self) -> str:
        """One sentence on why the best strategy was chosen."""
        best = self.best
        p = best.predicted
        comm = (
            ", ".join(f"{c.kind} over {','.join(c.mesh_axes)}" for c in p.collectives)
            or "no collectives"
        )
        runner_up = ""
        if len(self.strategies) > 1:
            second = self.strategies[1].predicted.seconds
            if second <= p.seconds:  # (an empty einsum: nothing to do in any layout)
                runner_up = ", as fast as the next"
            else:
                ratio = second / p.seconds if p.seconds else float("inf")
                runner_up = f", {ratio:.2f}× faster than the next"
        return (
            f"{best.strategy.describe(self.op)}: predicted {format_seconds(p.seconds)} "
            f"({p.bound}-bound, {comm}, {format_bytes(p.memory_bytes)} per device){runner_up}; "
            f"best of {len(self.strategies)} strategies within budget on profile "
            f"{self.profile.name}"
            + ("" if self.complete else f" (of {MAX_LAYOUTS:,} layouts only)")
        )

    def to_json(self) -> dict[str, Any]:
        def item(c: Candidate) -> dict[str, Any]:
            data = {**c.strategy.to_json(self.op), "predicted": c.predicted.to_json()}
            if c.verified is not None:
                data["verified"] = c.verified.to_json()
            return data

        data: dict[str, Any] = {
            "equation": self.op.equation,
            "mesh": self.mesh.shape,
            "shapes": [list(s) for s in self.shapes],
            "dtype": self.dtype,
            "profile": self.profile.name,
            "budget_bytes": self.budget,
            "considered": self.considered,
            "complete": self.complete,
            "stopped_early": self.stopped_early,
            "valid": self.valid,
            "chosen": 0 if self.strategies else None,
            "why": self.why() if self.strategies else None,
            "strategies": [item(c) for c in self.strategies],
            "refused": [
                {
                    **r.strategy.to_json(self.op),
                    "predicted": r.predicted.to_json(),
                    "reason": r.reason,
                }
                for r in self.refused
            ],
        }
        if self.spearman is not None or any(c.verified for c in self.strategies):
            data["spearman"] = self.spearman
        return data


def rank(
    op: Op,
    shapes: Sequence[Sequence[int]],
    mesh: MeshSpec,
    dtype: str,
    profile: Profile,
    budget: int | None = None,
) -> PlanReport:
    """Enumerate, predict and rank every strategy (pure: no devices).

    >>> from shardwise._model.profile import BUILTIN
    >>> r = rank(Op.parse("nd,nd->n"), [(4000, 10000)] * 2, MeshSpec.parse("x=2,y=4"),
    ...          "float32", BUILTIN["h100"])
    >>> r.best.strategy.describe(r.op), r.valid
    ('n=(x,y) → out (x,y)', 12)
    """
    shapes_t = as_shapes(shapes)
    sizes = op.sizes(shapes_t)
    check_extent(op, shapes_t, dtype)
    considered, valid = strategies(op, sizes, mesh, MAX_LAYOUTS)
    ranked: list[Candidate] = []
    refused: list[Refused] = []
    for s in valid:
        p = predict(op, shapes_t, dtype, mesh, s, profile)
        if budget is not None and p.memory_bytes > budget:
            refused.append(
                Refused(
                    s,
                    p,
                    (
                        f"needs {format_bytes(p.memory_bytes)} per device, over the budget of "
                        f"{format_bytes(budget)}"
                    ),
                )
            )
        else:
            ranked.append(Candidate(s, p))
    ranked.sort(
        key=lambda c: (
            c.predicted.seconds,
            c.predicted.memory_bytes,
            len(c.predicted.collectives),
            c.strategy.describe(op),
        )
    )
    refused.sort(key=lambda r: r.predicted.memory_bytes)
    return PlanReport(
        op,
        mesh,
        shapes_t,
        dtype,
        profile,
        considered,
        tuple(ranked),
        tuple(refused),
        budget,
        complete=layout_count(op, mesh) <= MAX_LAYOUTS,
    )


def _random(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """Uniform numbers in [0, 1) of ``dtype``, drawn in that precision where NumPy can: a
    float64 draw converted touches three times the memory of a float32 one."""
    kind = np.dtype(dtype)
    if kind in (np.float32, np.float64):
        return rng.random(shape, dtype=kind)
    return rng.random(shape, dtype=np.float32).astype(kind)


def verify(
    report: PlanReport,
    mesh: Mesh,
    top: int | None = None,
    repeat: int = 5,
    on_step: Callable[[int, int], None] | None = None,
) -> PlanReport:
    """Compile, compare and time the ``top`` best strategies on ``mesh`` (a JAX mesh).

    Time is the median of ``repeat`` runs after one warm-up, on random data, one strategy
    after another: each holds its own placement of the operands, and holding every
    strategy's at once, as taking turns would, costs more than the timing. The strategy that
    holds the most is placed first, and each later one in its host buffers (on CPU devices).

    Raises:
        ArgumentError: when the report's profile is for another platform than ``mesh``'s
            devices (its predictions are of what XLA does there).
    """
    check_platform(report.profile, platform(mesh), "verifying")
    chosen = report.strategies[: top or len(report.strategies)]
    rng = np.random.default_rng(0)
    arrays = [_random(rng, s, report.dtype) for s in report.shapes]
    done: dict[int, Candidate] = {}
    # the layout that holds the most first: each later one is placed in its buffers
    order = sorted(range(len(chosen)), key=lambda k: -chosen[k].predicted.memory_bytes)
    with staged() as staging:
        for step, k in enumerate(order):
            if on_step is not None:
                on_step(step, len(chosen))
            done[k] = _verified(report, chosen[k], mesh, arrays, repeat, staging)
    rest = report.strategies[len(done) :]
    ranked = [done[k] for k in range(len(chosen))]
    rho = spearman(
        [c.predicted.seconds for c in ranked], [c.verified.seconds for c in ranked if c.verified]
    )
    return dataclasses.replace(report, strategies=(*ranked, *rest), spearman=rho)


def _verified(
    report: PlanReport,
    cand: Candidate,
    mesh: Mesh,
    arrays: list[np.ndarray],
    repeat: int,
    staging: Staging,
) -> Candidate:
    """``cand`` compiled, its collectives compared with the HLO's, and timed on ``arrays``
    (placed from ``staging``, and its buffers freed for the next)."""
    s = cand.strategy
    plan = Plan.make(
        report.op,
        report.shapes,
        mesh=report.mesh,
        dtype=report.dtype,
        in_specs=list(s.in_specs(report.op)),
        out_specs=s.out_spec,
    )
    compiled = compile_plan(plan, mesh)
    found = tuple(collectives(compiled.as_text() or "", report.mesh.shape))
    match = collectives_match(cand.predicted.collectives, found, by_bytes=False)
    placed = place(plan, mesh, arrays)
    try:
        seconds = median_seconds(functools.partial(compiled, *placed), repeat)
    finally:
        staging.recycle(placed)
    return dataclasses.replace(cand, verified=Verified(match, seconds, found))
