"""The miscompile guard of planned programs: each dot a plan splits a contracted index of must be
summed over the mesh axes that split it before the compiled program uses its result whole, as
an einsum's program is checked (:func:`~shardwise._xla.check.dot_problems`). It reads the
compiled program's text: no compile of its own (but where the persistent compilation cache
gave a program another source's lines, :func:`~shardwise._xla.located.hlo_with_lines`)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from shardwise._errors import ShapeError
from shardwise._program.rules import rule_of
from shardwise._xla.check import DotTerms, dot_problems, ensure_dots_summed, jaxpr_dots
from shardwise._xla.located import hlo_with_lines

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
        batched = bool(op.batch) if step.prim == "dot_general" else None
        yield DotTerms(step.source, terms, axes, step.backward, repr(op.equation), batched)
    yield from opaque_dots(plan.graph.closed.jaxpr)


def opaque_dots(jaxpr: Any) -> Iterator[DotTerms]:
    """The dots inside the ops that the planner reads whole (a ``while``'s body), as dots
    every device computes whole: a compiled contraction that sums all of one's terms is that
    dot, not a split of a dot on the same line (a loop's ``x @ w1`` on the line of an ``@ w2``
    twice its size would be refused as ``@ w2`` split in two). A call's, a scan's and a
    ``cond``'s dots are steps of the graph."""
    for eqn in jaxpr.eqns:
        rule = rule_of(eqn.primitive.name)
        bodies = [
            getattr(inner, "jaxpr", inner)
            for value in eqn.params.values()
            for inner in (value if isinstance(value, tuple | list) else (value,))
            if hasattr(getattr(inner, "jaxpr", inner), "eqns")
        ]
        if not bodies:
            continue
        if rule.kind in ("call", "scan", "cond"):  # (inlined: its dots are steps of the graph)
            for body in bodies:
                yield from opaque_dots(body)
            continue
        for body in bodies:
            for dot in jaxpr_dots(body):
                yield DotTerms(dot.source, dot.terms, (), dot.backward, batched=dot.batched)


def ensure_summed(
    plan: ProgramPlan, chosen: PlannedLayout, lowered: Any, compiled: Any, platform: str
) -> str:
    """Raise :class:`~shardwise.MiscompileError` if ``compiled`` (``lowered`` compiled), the
    program of plan ``chosen``, leaves out a sum one of its dots needs; else the program's
    text as the check read it (its own source lines, :func:`hlo_with_lines`)."""
    dots = tuple(plan_dots(plan, chosen))
    text = hlo_with_lines(lowered, compiled, dots)
    problems = dot_problems(text, dots, plan.mesh.shape, platform)
    others = [p.name for p in plan.runnable if p.name != chosen.name]
    ensure_dots_summed(
        problems,
        f"plan {chosen.name!r} of {plan.program} on mesh {plan.mesh.describe()}",
        "Run another of its plans with plan.sharded(name) "
        f"({', '.join(repr(n) for n in others) or 'none is left'})",
    )
    return text
