"""The miscompile guard of planned programs: each dot a plan splits a contracted index of must be
summed over the mesh axes that split it before the compiled program uses its result whole, as
an einsum's program is checked (:func:`~shardwise._xla.check.dot_problems`). It reads the
compiled program's text: no compile of its own."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from shardwise._errors import ShapeError
from shardwise._xla.check import DotTerms, dot_problems, ensure_dots_summed

if TYPE_CHECKING:
    from shardwise._program.plans import PlannedLayout, ProgramPlan


def plan_dots(plan: ProgramPlan, chosen: PlannedLayout) -> Iterator[DotTerms]:
    """Each dot of the program as ``chosen`` lays it out: its source line, its terms, and the
    mesh axes that split its contracted indices in the layouts it reads its operands in."""
    graph = plan.graph
    for step in graph.steps:
        out = math.prod(graph.values[step.output].shape)
        if step.kind == "opaque" and step.prim == "dot_general" and step.flops and out:
            # a dot with a constant operand, done whole on each device (its FLOPs are twice
            # its result's elements times the terms it sums)
            terms = round(step.flops / (2 * out))
            yield DotTerms(step.source, terms, (), step.backward, step.prim)
            continue
        if step.kind != "dot" or step.op is None or step.key not in chosen.layouts.steps:
            continue
        op = step.op
        try:
            sizes = op.sizes([graph.values[v].shape for v in step.inputs])
        except ShapeError:
            continue  # (an operand the graph does not hold: nothing to check it by)
        reads = chosen.layouts.steps[step.key][0]
        split = [
            axis
            for term, spec in zip(op.inputs, reads, strict=False)
            for index, entry in zip(term, spec.padded(len(term)), strict=True)
            if index in op.contracted
            for axis in entry
            if plan.mesh.shape[axis] > 1
        ]
        terms = math.prod(sizes[i] for i in op.contracted)
        axes = tuple(dict.fromkeys(split))
        yield DotTerms(step.source, terms, axes, step.backward, repr(op.equation))


def ensure_summed(plan: ProgramPlan, chosen: PlannedLayout, compiled: Any, platform: str) -> None:
    """Raise :class:`~shardwise.MiscompileError` if ``compiled``, the program of plan
    ``chosen``, leaves out a sum one of its dots needs."""
    problems = dot_problems(
        compiled.as_text() or "", tuple(plan_dots(plan, chosen)), plan.mesh.shape, platform
    )
    others = [p.name for p in plan.plans if p.name != chosen.name and not p.over_budget]
    ensure_dots_summed(
        problems,
        f"plan {chosen.name!r} of {plan.program} on mesh {plan.mesh.describe()}",
        "Run another of its plans with plan.sharded(name) "
        f"({', '.join(repr(n) for n in others) or 'none is left'})",
    )
