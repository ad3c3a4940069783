"""What XLA's CPU backend holds for 16-bit floats. It computes those of
:func:`~shardwise._versions.halves_cpu_computes_in_float32` (float16; bfloat16 too up to
jaxlib 0.11) in float32 (its float normalization), so each such array a program makes is a
float32 buffer. An argument of such a type keeps its own buffer and, beside it, the float32
copy XLA converts it to as the program starts, held until its last reader (seen in the
compiled HLO: a ``convert`` of each bfloat16 weight first, then float32 dots). Each copy a
step moves of a bfloat16 (a gather, a partial sum, a relayout) is counted at float32 with
every jaxlib (:func:`moved_widening`): its collectives run in float32 (a ``convert``, the
float32 collective, a ``convert`` back: seen with jaxlib 0.10.2 to 0.12.1); float16's run as
it is, and a dot reads the copy converted to float32. Where the backend computes
bfloat16 as it is (jaxlib 0.12), what a collective makes of it is a float32 buffer beside
the arrays held at two bytes (:func:`converted_move`,
:func:`~shardwise._program.sums.collected_halves`); its convolutions, and a dot whose
operand's transpose XLA folds into it, computed in float32 there too, are counted at two
bytes. On GPUs and TPUs both types are computed as they are.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shardwise._caches import per_object
from shardwise._model.mesh import MeshSpec
from shardwise._model.spec import Spec
from shardwise._program.graph import Graph
from shardwise._program.moves import shard_bytes
from shardwise._program.walk import made_by
from shardwise._versions import halves_cpu_computes_in_float32

if TYPE_CHECKING:
    from shardwise._program.solution import Layouts

COMPUTED_WIDE = halves_cpu_computes_in_float32()
"""Those XLA's CPU backend computes in float32, with the installed jaxlib."""


def widening(dtype: str, cpu: bool) -> int:
    """How many times its own bytes an array of ``dtype`` made on the devices takes: twice
    for those of :data:`COMPUTED_WIDE` on CPU (float16; bfloat16 too up to jaxlib 0.11),
    else once.

    >>> widening("float16", True), widening("float16", False), widening("float32", True)
    (2, 1, 1)
    """
    return 2 if cpu and str(dtype) in COMPUTED_WIDE else 1


def moved_widening(dtype: str, cpu: bool) -> int:
    """How many times its own bytes a copy of an array of ``dtype`` that a collective moves
    takes (a gather, a partial sum, a relayout): twice for bfloat16 on CPU, with every
    jaxlib, else once. The CPU backend runs float16's collectives as it is (seen in the
    compiled HLO with jaxlib 0.10.2: a float16 MLP's ``f16[256,512]`` all-gather of a weight's
    gradient, its ``f16`` all-to-alls, and the ``f16[64,64]`` all-reduce of a float32 dot's
    partial sums converted first); a dot that reads such a copy reads it converted to float32
    (:func:`~shardwise._program.copies.read_copy`). Counted at float32, 100 of the 120 plans
    of the libraries' models cast to float16 had been within 20% of XLA's memory (Haiku's
    MLP's FSDP plan at 0.66x); 111 are now.

    >>> moved_widening("bfloat16", True), moved_widening("float16", True)
    (2, 1)
    """
    return 2 if cpu and str(dtype) == "bfloat16" else 1


def converted_move(held: int, moved: int, dtype: str, cpu: bool) -> int:
    """The bytes a collective's move of an array of ``dtype`` holds at once beyond its result,
    where the CPU backend moves it in float32 (:func:`moved_widening`) but computes it as it
    is (:func:`widening`: bfloat16 with jaxlib 0.12), and an op that computes it reads it:
    ``held`` and ``moved`` are the bytes per device of the array before and after the move,
    at its own type. XLA converts the block to float32, moves it, then converts the float32
    result back: the copy beside the float32 result, then that result beside the converted
    one (seen in the compiled HLO with jaxlib 0.12.1: a bfloat16 weight's ``f32[32,256]``
    convert, its ``f32[64,256]`` all-gather, then the ``bf16[64,256]`` a dot reads). None
    where the two widenings agree.

    >>> converted_move(100, 400, "float32", True), converted_move(100, 400, "bfloat16", False)
    (0, 0)
    """
    if moved_widening(dtype, cpu) <= widening(dtype, cpu):
        return 0
    return max(2 * held + 2 * moved, 3 * moved) - moved


def held_dtype(dtype: str, cpu: bool) -> str:
    """The type of the buffer that holds an array of ``dtype`` made on the devices.

    >>> held_dtype("float16", True), held_dtype("bfloat16", False)
    ('float32', 'bfloat16')
    """
    return "float32" if widening(dtype, cpu) == 2 else str(dtype)


def made_halves(graph: Graph, arrays: list[int]) -> list[bool]:
    """Whether each of ``arrays`` is a 16-bit float the program makes that the CPU backend
    computes in float32 (:data:`COMPUTED_WIDE`): not an argument, nor a result (those keep
    buffers of their own type)."""
    kept = set(graph.inputs) | {v for v in graph.outputs if v is not None}
    return [v not in kept and graph.values[v].dtype in COMPUTED_WIDE for v in arrays]


def argument_copies(
    graph: Graph, lay: Layouts, mesh: MeshSpec, fused: frozenset[tuple[int, ...]] = frozenset()
) -> dict[tuple[int, Spec], tuple[int, int]]:
    """The bytes of the float32 copy of each 16-bit float argument that some op computes
    with in the argument's own layout, and the last point such an op reads it, by (argument,
    layout): made as the program starts, freed after that op (an elementwise op, the update of
    a training step, reads the argument itself: seen, the bfloat16 weights' float32 copies
    freed after their last dot, where the model had held them to the update and put a
    bfloat16 step at 1.3-1.8x its memory). Only of the types the backend computes in float32
    (:data:`COMPUTED_WIDE`: with jaxlib 0.12 a bfloat16 argument has none, its dots read it as
    it is). One that every op reads in another layout is converted and moved as the program
    starts: its moved copies are counted at float32 where the steps read them
    (:func:`moved_widening`); a conversion to another type is itself the copy, and a dot that
    makes float32 (``preferred_element_type``) reads 16-bit operands as they are (seen: one
    fused dot of the bfloat16 arguments, no copy), as does a dot ``fused`` into a reduction
    (:func:`~shardwise._program.sums.into_reduce`: its fusion reads bfloat16)."""
    halves = {a for a in graph.inputs if graph.values[a].dtype in COMPUTED_WIDE}
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


@per_object(maxsize=8)
def converted_arguments(graph: Graph) -> frozenset[int]:
    """The arrays the program converts an argument to (``w.astype(jnp.float32)``: a Flax
    module computing in float32 with bfloat16 parameters), but those it returns or makes in a
    loop: XLA's CPU backend converts them as the program starts, before any other op, and
    holds each until its last reader (seen in the compiled HLO of a 2-block NNX GPT with
    bfloat16 parameters: every kernel's float32 ``wrapped_convert`` before the first layer's
    attention, where counting each at its own layer had put every plan at 1.94x XLA's memory).
    Computed once per graph.

    >>> import jax, jax.numpy as jnp
    >>> from shardwise._program.graph import build
    >>> S = jax.ShapeDtypeStruct
    >>> g = build(lambda x, w: jnp.tanh(x @ w.astype(jnp.float32)),
    ...           [S((8, 4), "float32"), S((4, 4), "bfloat16")])
    >>> [g.values[v].shape for v in converted_arguments(g)]
    [(4, 4)]
    """
    inputs = set(graph.inputs)
    results = {v for v in graph.outputs if v is not None}
    spans = [(loop.start, loop.end) for loop in graph.loops]
    return frozenset(
        v
        for v, source in graph.made_from.items()
        if source in inputs
        and v not in results
        and made_by(graph.values[v].name) == "convert_element_type"
        and not any(start < graph.born[v] <= end for start, end in spans)
    )
