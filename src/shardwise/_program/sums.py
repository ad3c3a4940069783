"""The buffers of partial sums: where a dot's contracted letters are split, each device makes
partial sums of its result, which an all-reduce (or a reduce-scatter) adds up. XLA gives them
a buffer of their own beside the sum, and combines the all-reduces of a training step's
weight gradients into one after the backward pass.
"""

from __future__ import annotations

import numpy as np

from shardwise._model.spec import Spec
from shardwise._program.graph import Graph
from shardwise._program.nodes import Step


def partial_layout(step: Step, ins: tuple[Spec, ...]) -> Spec | None:
    """The layout of a dot's partial sums, from the layouts it reads its operands in: where
    it makes its result scattered, they are a buffer of their own before the scatter (an
    all-reduce and a slice on CPU, a reduce-scatter elsewhere)."""
    if step.kind != "dot" or step.op is None or step.read_as_einsum:
        return None  # (an op read as an einsum keeps its partial sums' layout)
    axes: dict[str, tuple[str, ...]] = {}
    for term, spec in zip(step.op.inputs, ins, strict=True):
        for letter, entry in zip(term, spec.padded(len(term)), strict=True):
            axes[letter] = axes.get(letter) or tuple(entry)
    return Spec(tuple(axes.get(i, ()) for i in step.op.output)).canonical()


def to_outputs(graph: Graph) -> set[int]:
    """The classes of arrays that only elementwise ops, transposes and reshapes take to the
    program's outputs (a weight's gradient, transposed, then the update)."""
    found = {graph.find(v) for v in graph.outputs if v is not None}
    for step in reversed(graph.steps):
        if step.prim in ("transpose", "reshape") and graph.find(step.output) in found:
            found.add(graph.find(step.inputs[0]))
    return found


def combined(partials: list[tuple[int, int, int]], points: np.ndarray) -> None:
    """The partial sums of the results that go only to the program's outputs (a training
    step's weight gradients), summed by one all-reduce after the last of them: XLA combines
    their all-reduces, so each one's partial sums are held from its dot to the last such dot,
    and there the sums of those it then slices are made beside them (seen in the compiled
    HLO of a data-parallel step: one all-reduce of a tuple of every gradient, at the end)."""
    if not partials:
        return
    end = max(at for at, _, _ in partials)
    for at, size, copies in partials:
        points[at : end + 1] += size
        points[end] += (copies - 1) * size


def summed(step: Step, ins: tuple[Spec, ...]) -> bool:
    """Whether a dot's contracted letters are split, so that its partial sums are summed over
    devices after it."""
    assert step.op is not None
    return any(
        entry and letter not in step.op.output
        for term, spec in zip(step.op.inputs, ins, strict=True)
        for letter, entry in zip(term, spec.padded(len(term)), strict=True)
    )
