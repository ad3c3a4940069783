"""How XLA's CPU partitioner scatters a partial sum, step by step along ``jnp.einsum``'s path.

An equation of three or more operands is contracted as ``jnp.einsum`` does it, pairwise along
opt_einsum's path (:func:`contraction_steps`); XLA partitions each step on its own, and where
a step's partial sum is over a mesh axis of two devices it may scatter it as an all-reduce of
a half and a permute (:func:`scatter_hops`), which the cost model then prices.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import opt_einsum  # type: ignore[import-untyped]  # (a dependency of JAX, untyped)

from shardwise._caches import cached
from shardwise._model.mesh import MeshSpec
from shardwise._model.op import Op
from shardwise._model.spec import Entry
from shardwise._model.strategy import Strategy

Step = tuple[tuple[int, ...], tuple[str, ...], str]
"""One step of an einsum: the places of its operands in the list of arrays left (each step
takes them out and puts its result at the end), their index strings, and its result's."""


@cached(maxsize=512)
def contraction_steps(op: Op, shapes: tuple[tuple[int, ...], ...]) -> tuple[Step, ...]:
    """The steps ``jnp.einsum`` computes ``op`` in: one for one or two operands, else one per
    pair along the path opt_einsum's ``"auto"`` optimizer picks for these (global) shapes, as
    JAX 0.10.2 calls it.

    >>> contraction_steps(Op.parse("ij,jk,kl->il"), ((4, 4), (4, 4), (4, 4)))
    (((1, 0), ('jk', 'ij'), 'ki'), ((1, 0), ('ki', 'kl'), 'il'))
    >>> contraction_steps(Op.parse("ab,ab,c->c"), ((2, 2), (2, 2), (4,)))
    (((1, 0), ('ab', 'ab'), ''), ((1, 0), ('', 'c'), 'c'))
    """
    if len(op.inputs) <= 2:
        return ((tuple(reversed(range(len(op.inputs)))), op.inputs[::-1], op.output),)
    _, contractions = opt_einsum.contract_path(
        op.equation, *shapes, shapes=True, einsum_call=True, use_blas=True, optimize="auto"
    )
    steps: list[Step] = []
    for contraction in contractions:
        inputs, _, result = str(contraction[2]).partition("->")
        places = tuple(int(k) for k in contraction[0])
        steps.append((places, tuple(inputs.split(",")), result))
    return tuple(steps)


@dataclass(frozen=True, slots=True)
class Hop:
    """A partial sum XLA's CPU partitioner scatters with a permute (see :func:`scatter_hops`).

    Attributes:
        axis: the mesh axis (of two devices) the step's own partial sum is over.
        idle: the mesh axis that held only replicas, whose major half splits the step's result.
        hop: the mesh axes the permute spans.
        result: the step's result indices.
        held: how the step's result is laid out: index → mesh axes.
        whole: whether the step is the whole einsum (one or two operands).
    """

    axis: str
    idle: str
    hop: tuple[str, ...]
    result: str
    held: Mapping[str, Entry]
    whole: bool


def scatter_hops(
    op: Op, shapes: tuple[tuple[int, ...], ...], mesh: MeshSpec, strategy: Strategy
) -> tuple[Hop, ...]:
    """The steps where XLA's CPU partitioner (jax 0.10.2) scatters a partial sum as an
    all-reduce of the half each device keeps and a permute that puts each half on its owner.

    It does so for a ``dot_general`` (an index contracted between its two operands, not a
    reduce of an index only one of them has) whose own partial sum is over one mesh axis of two
    devices, when its result is laid out with that axis on one of its dimensions and some
    other mesh axis holds only replicas across that step: it computes the half on that idle
    axis instead, and swaps halves (measured). The result of a step is laid out as the output
    is (the final step is the output), as far as that leaves the mesh axes of an index
    contracted later (which keeps its layout) alone: a dimension keeps the major axes of its
    output entry up to the first such axis.
    """
    layout = strategy.layout
    out_entries = dict(zip(op.output, strategy.out_spec.padded(len(op.output)), strict=True))
    steps = contraction_steps(op, shapes)
    arrays = [{i: layout.axes_of(i) for i in term} for term in op.inputs]
    hops: list[Hop] = []
    for places, inputs, result in steps:
        taken = [arrays.pop(k) for k in places]
        have: dict[str, Entry] = {}  # how the operands split each index (an intermediate's way)
        for array in taken:
            for i, e in array.items():
                if i not in have or e != layout.axes_of(i):
                    have[i] = e
        later = {a for i in result if i not in out_entries for a in layout.axes_of(i)}
        held: dict[str, Entry] = {}
        for i in result:
            entry = out_entries.get(i, layout.axes_of(i))
            cut = next(
                (k for k, a in enumerate(entry) if a in later and i in out_entries), len(entry)
            )
            held[i] = entry[:cut]
        arrays.append(held)
        if len(inputs) != 2:
            continue
        lhs, rhs = inputs
        summed = {i for i in (*lhs, *rhs) if i not in result}
        dotted = [i for i in summed if i in lhs and i in rhs]
        partial = {a for i in summed for a in layout.axes_of(i) if mesh.shape[a] > 1}
        dot_axes = {a for i in dotted for a in layout.axes_of(i) if mesh.shape[a] > 1}
        if len(partial) != 1 or partial != dot_axes:
            continue
        (axis,) = partial
        placed = {a for e in held.values() for a in e}
        if mesh.shape[axis] != 2 or axis not in placed:
            continue
        used = placed | {a for e in have.values() for a in e}
        idle = [a for a in mesh.names if a not in used and mesh.shape[a] % 2 == 0]
        if not idle:
            continue
        own = _dot_layout(result, held, have, axis, idle[0], (lhs, rhs), mesh)
        target = [held[i] for i in result]
        hops.append(
            Hop(
                axis,
                idle[0],
                _permuted_axes(mesh, own, target, idle[0]),
                result,
                held,
                len(steps) == 1,
            )
        )
    return tuple(hops)


def _dot_layout(
    result: str,
    held: Mapping[str, Entry],
    have: Mapping[str, Entry],
    axis: str,
    idle: str,
    inputs: tuple[str, str],
    mesh: MeshSpec,
) -> list[Entry]:
    """The dot's own layout of a step's result: on each dimension the axes its operands split
    it with, then the rest of its entry in mesh order, with the ``idle`` axis's half for
    ``axis``."""
    lhs, rhs = inputs
    own: list[Entry] = []
    for i in result:
        kept = tuple(a for a in held[i] if a in have.get(i, ()))
        rest = [idle if a == axis else a for a in held[i] if a not in kept]
        own.append(kept + tuple(sorted(rest, key=mesh.names.index)))
    # where ``axis`` goes to a batch dimension, the dot splits the other split batch
    # dimensions' axes first and the half last, in their order (as XLA does on a 2×2×2 mesh)
    batch = [k for k, i in enumerate(result) if i in lhs and i in rhs and held[i]]
    scattered = next((k for k in batch if axis in held[result[k]]), None)
    if scattered is not None:
        group = [own[k] for k in batch if k != scattered] + [own[scattered]]
        if len({math.prod(mesh.shape[a] for a in e) for e in group}) == 1:
            for k, e in zip(batch, group, strict=True):
                own[k] = e
    return own


def _permuted_axes(
    mesh: MeshSpec, source: Sequence[Entry], target: Sequence[Entry], idle: str
) -> tuple[str, ...]:
    """The mesh axes a permute spans that moves an array laid out as ``source`` (where ``idle``
    stands for its major half, two devices) to ``target``, the other devices holding replicas
    in mesh order in both: the device at each place of the one tiling sends to the device at
    that place of the other.

    >>> _permuted_axes(MeshSpec.parse("x=2,y=2,z=2"), [("x",), ()], [("z",), ()], "x")
    ('x', 'y', 'z')
    >>> _permuted_axes(MeshSpec.parse("x=2,y=2,z=2"), [("y", "z")], [("y", "x")], "z")
    ('x', 'z')
    >>> _permuted_axes(MeshSpec.parse("x=2,y=4"), [("y",)], [("x",)], "y")
    ('x', 'y')
    """
    # every mesh axis as factors, in mesh order; the idle one split into its major half and rest
    factors: list[tuple[str, int]] = []
    for a in mesh.names:
        n = mesh.shape[a]
        factors += [(a, 2), (a, n // 2)] if a == idle and n > 2 else [(a, n)]
    places = {a: [k for k, (b, _) in enumerate(factors) if b == a] for a in mesh.names}

    def order(entries: Sequence[Entry], half: bool) -> list[int]:
        tiled = [
            k
            for e in entries
            for a in e
            for k in (places[a][:1] if half and a == idle else places[a])
        ]
        return tiled + [k for k in range(len(factors)) if k not in tiled]

    iota = np.arange(mesh.size).reshape([n for _, n in factors])
    source_ids = iota.transpose(order(source, True)).reshape(-1)
    target_ids = iota.transpose(order(target, False)).reshape(-1)
    sizes = [mesh.shape[a] for a in mesh.names]
    src, dst = np.unravel_index(source_ids, sizes), np.unravel_index(target_ids, sizes)
    return tuple(a for a, u, v in zip(mesh.names, src, dst, strict=True) if (u != v).any())
