"""Enumerate index layouts: every way to give each mesh axis to at most one einsum index.

Pure functions; no devices needed.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from shardwise._caches import cached
from shardwise._model.mesh import MeshSpec
from shardwise._model.op import Op
from shardwise._model.spec import Layout, Spec

MAX_LAYOUTS = 8**5
"""The most index layouts the planner enumerates for one einsum: every einsum of up to 7
indices on a mesh of up to 5 axes is planned completely (``(indices + 1) ** axes`` layouts).
The count grows exponentially with the mesh's axes (3**20 for a two-index einsum on 20 axes),
so past this bound the planner ranks ``MAX_LAYOUTS`` of them, spread evenly over all, and its
report says that it stopped early."""


def layout_count(op: Op, mesh: MeshSpec) -> int:
    """How many index layouts there are before the divisibility filter: each mesh axis goes to
    one of the indices, or to none (an axis of size 1, which splits nothing, to none).

    >>> layout_count(Op.parse("nd,nd->n"), MeshSpec.parse("x=2,y=4"))
    9
    """
    return int((len(op.indices) + 1) ** len(mesh.splitting))


def layouts(indices: str, sizes: Mapping[str, int], mesh: MeshSpec) -> Iterator[Layout]:
    """Every layout in which each mesh axis splits at most one index, evenly.

    An index may take several axes (in mesh order); an axis may be left unused
    (the data are replicated along it), and one of size 1 is. There are
    ``(len(indices) + 1) ** axes`` assignments before the divisibility filter.

    >>> [lay.describe() for lay in layouts("nd", {"n": 4, "d": 3}, MeshSpec.parse("x=2"))]
    ['replicated', 'n=x']
    """
    axes = mesh.splitting
    for pick in itertools.product([None, *indices], repeat=len(axes)):
        layout = _layout(axes, pick)
        if _divides(layout.assignment, sizes, mesh):
            yield layout


def _layout(axes: tuple[tuple[str, int], ...], pick: tuple[str | None, ...]) -> Layout:
    """The layout in which mesh axis ``k`` splits index ``pick[k]`` (none where ``None``)."""
    assignment: dict[str, tuple[str, ...]] = {}
    for (axis, _), index in zip(axes, pick, strict=True):
        if index is not None:
            assignment[index] = (*assignment.get(index, ()), axis)
    return Layout(tuple(sorted(assignment.items())))


@dataclass(frozen=True, slots=True)
class Strategy:
    """A way to shard an einsum: an index layout and the output's layout.

    The output either keeps the layout's axes on its indices (partial sums over the axes of
    contracted indices are all-reduced, so it is replicated over them), or also puts those
    axes on one output index (the partial sums are reduce-scattered).
    """

    layout: Layout
    out_spec: Spec

    def in_specs(self, op: Op) -> tuple[Spec, ...]:
        """Each operand's spec under the layout."""
        return _in_specs(self.layout, op.inputs)

    def describe(self, op: Op) -> str:
        """e.g. ``'n=x,d=y → out x'``."""
        return f"{self.layout.describe()} → out {self.out_spec.describe()}"

    def to_json(self, op: Op) -> dict[str, object]:
        return {
            "layout": {i: list(a) for i, a in self.layout.assignment},
            "in_specs": [
                s.to_json(len(t)) for s, t in zip(self.in_specs(op), op.inputs, strict=True)
            ],
            "out_spec": self.out_spec.to_json(len(op.output)),
        }


@cached(maxsize=1 << 16)
def _in_specs(layout: Layout, inputs: tuple[str, ...]) -> tuple[Spec, ...]:
    """:meth:`Strategy.in_specs`, once per layout and operands (a program plan asks for the
    same few many thousand times)."""
    return tuple(layout.spec_for(t) for t in inputs)


def reduce_axes(op: Op, layout: Layout, mesh: MeshSpec) -> tuple[str, ...]:
    """Mesh axes that split a contracted index, in mesh order."""
    used = {a for i in op.contracted for a in layout.axes_of(i)}
    return tuple(a for a in mesh.names if a in used)


def summed_axes(
    op: Op, layout: Layout, mesh: MeshSpec, sizes: Mapping[str, int]
) -> tuple[str, ...]:
    """The mesh axes ``layout``'s partial sums are summed over: those of its reduced
    indices but an axis of size 1. Where a contracted index is empty, as ``jnp.einsum``
    computes: each operand is summed first over the indices only it has (an empty one to
    zeros, summing nothing), then the operands over the indices they share (nothing, if one
    of those or of the output's is empty). Seen in the HLO: ``li,lk->`` with ``i`` empty
    sums over ``k``'s axes and ``l``'s, ``ij,jk->`` with ``j`` empty over none."""
    contracted = set(op.contracted)
    shared = {i for i in contracted if sum(i in term for term in op.inputs) > 1}
    kept = {i for term in op.inputs for i in term if i not in contracted - shared}
    summed = shared if all(sizes[i] for i in kept) else set()
    for term in op.inputs:
        if all(sizes[i] for i in term):  # (an operand summed alone over its own indices)
            summed |= {i for i in term if i in contracted - shared}
    return tuple(
        a for a in reduce_axes(op, layout, mesh)
        if mesh.shape[a] > 1 and any(a in layout.axes_of(i) for i in summed)
    )  # fmt: skip


def output_choices(op: Op, layout: Layout, mesh: MeshSpec) -> list[Spec]:
    """The output layouts that matter for ``layout``: keep it, or scatter the partial sums onto
    one output index that the layout leaves unsplit."""
    base = layout.spec_for(op.output)
    axes = reduce_axes(op, layout, mesh)
    choices = [base]
    if axes:
        entries = base.padded(len(op.output))
        for d in range(len(op.output)):
            if not entries[d]:
                scattered = list(entries)
                scattered[d] = axes
                choices.append(Spec(tuple(scattered)).canonical())
    return choices


def strategies(
    op: Op, sizes: Mapping[str, int], mesh: MeshSpec, limit: int = MAX_LAYOUTS
) -> tuple[int, list[Strategy]]:
    """Every strategy of ``limit`` layouts (all of them unless :func:`layout_count` is larger,
    else ``limit`` spread evenly over them, so that every mesh axis is tried on every index),
    and how many were considered before the divisibility filter. A mesh axis of size 1
    splits no index (a layout naming it would be the one without it).

    >>> op = Op.parse("nd,nd->n")
    >>> considered, valid = strategies(op, {"n": 8, "d": 6}, MeshSpec.parse("x=2"))
    >>> considered, [s.describe(op) for s in valid]
    (4, ['replicated → out replicated', 'n=x → out x', 'd=x → out replicated', 'd=x → out x'])
    """
    considered = 0
    valid: list[Strategy] = []
    choices = [None, *op.indices]
    axes = mesh.splitting
    for pick in _picks(choices, len(axes), limit):
        layout = _layout(axes, pick)
        outs = output_choices(op, layout, mesh)
        considered += len(outs)
        if not _divides(layout.assignment, sizes, mesh):
            continue
        out_sizes = [sizes[i] for i in op.output]
        for out in outs:
            if all(
                n % math.prod(mesh.shape[a] for a in e) == 0
                for n, e in zip(out_sizes, out.padded(len(op.output)), strict=True)
            ):
                valid.append(Strategy(layout, out))
    return considered, valid


def _picks(choices: list[str | None], axes: int, limit: int) -> Iterator[tuple[str | None, ...]]:
    """Each mesh axis's index (or ``None``): every combination, or ``limit`` of them spread
    evenly over all of them (read as numbers in base ``len(choices)``).

    >>> [p for p in _picks(["a", "b"], 2, 2)]
    [('a', 'a'), ('b', 'a')]
    """
    total = len(choices) ** axes
    if total <= limit:
        yield from itertools.product(choices, repeat=axes)
        return
    for k in range(limit):
        n, pick = k * total // limit, []
        for _ in range(axes):
            n, digit = divmod(n, len(choices))
            pick.append(choices[digit])
        yield tuple(reversed(pick))


def _divides(
    assignment: tuple[tuple[str, tuple[str, ...]], ...], sizes: Mapping[str, int], mesh: MeshSpec
) -> bool:
    return all(sizes[i] % math.prod(mesh.shape[a] for a in axes) == 0 for i, axes in assignment)
