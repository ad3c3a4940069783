"""What XLA's CPU backend holds for 16-bit floats: it computes bfloat16 and float16 in float32
(its float normalization), so each such array a program makes is a float32 buffer, and so is
each copy a step makes of one (a gather, a partial sum, a relayout). An argument of such a type
keeps its own buffer and, beside it, the float32 copy XLA converts it to as the program
starts, held until its last reader (seen in the compiled HLO: a ``convert`` of each bfloat16
weight first, then float32 dots). On GPUs and TPUs both types are computed as they are.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shardwise._model.mesh import MeshSpec
from shardwise._model.spec import Spec
from shardwise._program.graph import Graph
from shardwise._program.moves import shard_bytes

if TYPE_CHECKING:
    from shardwise._program.solution import Layouts

HALVES = frozenset({"bfloat16", "float16"})
"""The types XLA's CPU backend computes in float32."""


def widening(dtype: str, cpu: bool) -> int:
    """How many times its own bytes an array of ``dtype`` made on the devices takes: twice
    for bfloat16 and float16 on CPU, else once.

    >>> widening("bfloat16", True), widening("bfloat16", False), widening("float32", True)
    (2, 1, 1)
    """
    return 2 if cpu and str(dtype) in HALVES else 1


def held_dtype(dtype: str, cpu: bool) -> str:
    """The type of the buffer that holds an array of ``dtype`` made on the devices.

    >>> held_dtype("bfloat16", True), held_dtype("bfloat16", False)
    ('float32', 'bfloat16')
    """
    return "float32" if widening(dtype, cpu) == 2 else str(dtype)


def made_halves(graph: Graph, arrays: list[int]) -> list[bool]:
    """Whether each of ``arrays`` is a 16-bit float the program makes: not an argument, nor
    a result (those keep buffers of their own type)."""
    kept = set(graph.inputs) | {v for v in graph.outputs if v is not None}
    return [v not in kept and graph.values[v].dtype in HALVES for v in arrays]


def argument_copies(
    graph: Graph, lay: Layouts, mesh: MeshSpec, fused: frozenset[tuple[int, ...]] = frozenset()
) -> dict[tuple[int, Spec], tuple[int, int]]:
    """The bytes of the float32 copy of each 16-bit float argument that some op computes
    with in the argument's own layout, and the last point such an op reads it, by (argument,
    layout): made as the program starts, freed after that op (an elementwise op, the update of
    a training step, reads the argument itself: seen, the bfloat16 weights' float32 copies
    freed after their last dot, where the model had held them to the update and put a
    bfloat16 step at 1.3-1.8x its memory). One that every op reads in another layout is
    converted and moved as the program starts: its moved copies are counted at float32 where
    the steps read them (:func:`widening`); a conversion to another type is itself the copy,
    and a dot that makes float32 (``preferred_element_type``) reads 16-bit operands as they
    are (seen: one fused dot of the bfloat16 arguments, no copy), as does a dot ``fused`` into
    a reduction (:func:`~shardwise._program.sums.into_reduce`: its fusion reads bfloat16)."""
    halves = {a for a in graph.inputs if graph.values[a].dtype in HALVES}
    if not halves:
        return {}
    out: dict[tuple[int, Spec], tuple[int, int]] = {}
    for step in graph.steps:
        if (
            step.prim.startswith("convert_element_type")
            or step.key in fused
            or (step.prim == "dot_general" and graph.values[step.output].dtype == "float32")
        ):
            continue
        found = lay.steps.get(step.key)
        for j, a in enumerate(step.inputs):
            if a not in halves:
                continue
            held = lay.specs[a].canonical()
            if found is None or j >= len(found[0]) or found[0][j].canonical() == held:
                at = graph.born[step.output]  # (read in a loop: held until the loop ends)
                at = max([at, *(loop.end for loop in graph.loops if loop.start < at <= loop.end)])
                until = max(at, out.get((a, held), (0, 0))[1])
                out[(a, held)] = (2 * shard_bytes(graph.values[a], lay.specs[a], mesh), until)
    return out
