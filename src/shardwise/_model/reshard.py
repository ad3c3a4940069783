"""Resharding: what moving an array from one layout to another costs, and the one layout that
operands which disagree should be moved to before they meet.

Pure functions; no devices needed.

When the operands of an einsum split a shared index differently (one splits ``j`` over ``x``,
another leaves it whole), something must move data before each device can compute its block.
XLA's SPMD partitioner chooses that itself, and with JAX 0.10.2 on CPU it can choose wrongly:
``jnp.einsum("abc,abc->", u, v)`` with ``u`` laid out ``P("x", "y")`` and ``v``
``P("x", None, "y")`` on a ``x=2,y=4`` mesh loses the partial sum over ``x`` and returns half
the answer (openxla/xla#40034 is a related report). shardwise therefore never hands XLA a
contraction whose operands disagree: it picks one agreed :class:`~shardwise._model.spec.Layout`
(:func:`agreed_layout`, the cheapest by the cost model) and reshards every operand to it first.

Per mesh axis of size ``p`` a resharding is, as XLA emits it:

- the axis starts splitting a dimension it did not split: a **local slice**, free (done first,
  so what follows moves smaller blocks);
- the axis moves from one dimension to another: an **all-to-all** over it (the shard's size
  is unchanged);
- the axis stops splitting a dimension: an **all-gather** over it (the result is ``p`` times
  the shard);
- a dimension ends up split by the right axes in the wrong order (``(y, x)`` for ``(x, y)``,
  or after a slice along what should be the major axis): a **collective-permute** of the
  shard.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from shardwise._caches import cached
from shardwise._errors import SpecError
from shardwise._model.collective import wire_itemsize
from shardwise._model.cost import PredictedCollective, predict, ring_seconds
from shardwise._model.mesh import MeshSpec
from shardwise._model.op import Op
from shardwise._model.plan import layout_from_specs
from shardwise._model.profile import Profile
from shardwise._model.spec import Entry, Layout, Spec
from shardwise._model.strategy import Strategy, output_choices

MAX_CANDIDATES = 4096
"""Most candidate layouts :func:`agreed_layout` costs; past it, disagreeing indices are
gathered (left whole), which is always valid."""


@dataclass(frozen=True, slots=True)
class Move:
    """One step of a resharding: ``kind`` over mesh ``axis`` (``None`` for the final slice),
    and the layout the array has after it."""

    kind: str
    axis: str | None
    spec: Spec


@cached(maxsize=1 << 14)
def reshard_moves(src: Spec, dst: Spec, rank: int) -> tuple[Move, ...]:
    """The steps that move an array of ``rank`` dimensions from ``src`` to ``dst``, each one
    that XLA's partitioner carries out as exactly one collective.

    Each dimension keeps the axes its layout shares with the target as a prefix; the others
    leave it minor-most first: to the dimension that takes that axis next (an all-to-all), or to
    no dimension (an all-gather). Then the target's missing axes are appended (a local slice).
    Applied one constraint per step, XLA emits exactly these collectives: checked for every pair
    of layouts of 2-D and 3-D arrays on meshes ``8``, ``2×4``, ``4×2`` and ``2×2×2``, where a
    single constraint from ``src`` to ``dst`` brings other collectives in 31 of 72 cases on
    ``2×4`` (a permute, or an all-gather of the whole array).

    >>> [(m.kind, m.axis, m.spec.describe()) for m in reshard_moves(
    ...     Spec.parse("(x,y)"), Spec.parse("y"), 2)]
    [('all-gather', 'y', 'x'), ('all-gather', 'x', 'replicated'), ('slice', None, 'y')]
    >>> [(m.kind, m.axis, m.spec.describe()) for m in reshard_moves(
    ...     Spec.parse("x,y"), Spec.parse("y,x"), 2)]
    [('all-gather', 'x', '-,y'), ('all-to-all', 'y', 'y'), ('slice', None, 'y,x')]
    """
    return tuple(Move(kind, axis, Spec(after).canonical()) for kind, axis, after in
                 move_path(src, dst, rank))  # fmt: skip


Path = list[tuple[str, str | None, tuple[Entry, ...]]]
""":func:`reshard_moves` as plain tuples: each move's kind, axis and the entries (one per
dimension) the array has after it."""


def move_path(src: Spec, dst: Spec, rank: int) -> Path:
    """:func:`reshard_moves` without its :class:`Spec` values, the moves' layouts as padded
    entries: a mesh of four axes has millions of pairs of layouts to price, each moved so."""
    current = [list(e) for e in src.padded(rank)]
    target = dst.padded(rank)
    at = {a: (d, i) for d, e in enumerate(target) for i, a in enumerate(e)}
    moves: Path = []
    changed = True
    while changed:
        changed = False
        for d in range(rank):
            cur, want = current[d], target[d]
            k, n = 0, min(len(cur), len(want))
            while k < n and cur[k] == want[k]:  # (the prefix it keeps)
                k += 1
            if len(cur) <= k:
                continue
            axis = cur.pop()
            to, i = at.get(axis, (d, 0))  # (the dimension that takes it next, if any)
            if to != d and len(current[to]) == i and tuple(current[to]) == target[to][:i]:
                current[to].append(axis)
                moves.append(("all-to-all", axis, tuple(tuple(e) for e in current)))
            else:
                moves.append(("all-gather", axis, tuple(tuple(e) for e in current)))
            changed = True
    if not moves or moves[-1][2] != target:
        moves.append(("slice", None, target))
    return moves


def all_to_alls_first(src: Spec, dst: Spec, rank: int) -> Spec | None:
    """The layout the all-to-alls that open a move from ``src`` to ``dst`` leave an array
    in, before any all-gather (``None``: the move opens with none). XLA makes these moves of
    a scan's layer on the whole stack, once, before the loop.

    >>> all_to_alls_first(Spec.parse("x"), Spec.parse("-,x"), 2).describe()
    '-,x'
    >>> all_to_alls_first(Spec.parse("x"), Spec.parse("replicated"), 2) is None
    True
    """
    mid = None
    for kind, _, after in move_path(src, dst, rank):
        if kind == "all-gather":
            break
        if kind == "all-to-all":
            mid = after
    return None if mid is None else Spec(mid).canonical()


def reshard_collectives(
    src: Spec,
    dst: Spec,
    shape: Sequence[int],
    dtype: str,
    mesh: MeshSpec,
    profile: Profile,
) -> tuple[PredictedCollective, ...]:
    """The collectives that move an array of ``shape`` from layout ``src`` to ``dst`` along
    :func:`reshard_moves` (an axis of size 1 moves nothing).

    >>> from shardwise._model.profile import BUILTIN
    >>> mesh, cpu = MeshSpec.parse("x=2,y=4"), BUILTIN["cpu-2core"]
    >>> [(c.kind, c.mesh_axes, c.bytes) for c in reshard_collectives(
    ...     Spec.parse("x,y"), Spec.parse("-,y"), (8, 8), "float32", mesh, cpu)]
    [('all-gather', ('x',), 64)]
    >>> [(c.kind, c.mesh_axes, c.bytes) for c in reshard_collectives(
    ...     Spec.parse("x"), Spec.parse("-,x"), (8, 8), "float32", mesh, cpu)]
    [('all-to-all', ('x',), 128)]
    >>> reshard_collectives(Spec.parse(None), Spec.parse("x,y"), (8, 8), "float32", mesh, cpu)
    ()
    """
    width = wire_itemsize(dtype, profile.platform)
    out: list[PredictedCollective] = []
    before = src
    for move in reshard_moves(src, dst, len(shape)):
        if move.axis is not None and mesh.shape[move.axis] > 1:
            held = move.spec if move.kind == "all-gather" else before
            n = width * math.prod(
                size // math.prod(mesh.shape[a] for a in e)
                for size, e in zip(shape, held.padded(len(shape)), strict=True)
            )
            seconds = ring_seconds(move.kind, (move.axis,), n, mesh, profile)
            out.append(PredictedCollective(move.kind, (move.axis,), n, seconds))
        before = move.spec
    return tuple(out)


def common_layout(op: Op, in_specs: Sequence[Spec]) -> Layout | None:
    """The layout every operand already follows, or ``None`` when two operands split a shared
    index differently (a replicated index counts as a way of splitting it) or one mesh axis
    splits two indices.

    >>> op = Op.parse("ij,jk->ik")
    >>> common_layout(op, [Spec.parse("x,y"), Spec.parse("y")]).describe()
    'i=x,j=y'
    >>> common_layout(op, [Spec.parse("-,x"), Spec.parse(None)]) is None
    True
    """
    try:
        return layout_from_specs(op, in_specs)  # manual mode's rule, without its errors
    except SpecError:
        return None


def agreed_layout(
    op: Op,
    shapes: Sequence[Sequence[int]],
    in_specs: Sequence[Spec],
    out_spec: Spec,
    dtype: str,
    mesh: MeshSpec,
    profile: Profile,
) -> Layout:
    """The layout to reshard disagreeing operands to before the contraction: of the layouts
    that give each index one of the ways the operands split it (or leave it whole), the one
    with the least predicted time for resharding the operands, computing, and laying the
    result out as ``out_spec``.

    Operands that already agree keep their layout.

    >>> from shardwise._model.profile import BUILTIN
    >>> op, mesh = Op.parse("abc,abc->"), MeshSpec.parse("x=2,y=4")
    >>> agreed_layout(op, [(2, 4, 4)] * 2, [Spec.parse("x,y"), Spec.parse("x,-,y")],
    ...               Spec(()), "float32", mesh, BUILTIN["h100"]).describe()
    'a=x'
    >>> big = [(2, 4096, 4096)] * 2  # here moving one split costs less than gathering both
    >>> agreed_layout(op, big, [Spec.parse("x,y"), Spec.parse("x,-,y")],
    ...               Spec(()), "float32", mesh, BUILTIN["h100"]).describe()
    'a=x,c=y'

    (On CPUs a collective costs one latency over any group, and moving one split wins even
    for the small arrays.)
    """
    common = common_layout(op, in_specs)
    if common is not None:
        return common
    options: dict[str, list[Entry]] = {}
    given: dict[str, set[Entry]] = {}
    for term, spec in zip(op.inputs, in_specs, strict=True):
        for index, entry in zip(term, spec.padded(len(term)), strict=True):
            given.setdefault(index, set()).add(entry)
            choices = options.setdefault(index, [()])
            if entry not in choices:
                choices.append(entry)
    indices = sorted(options)
    if math.prod(len(options[i]) for i in indices) > MAX_CANDIDATES:
        agreed = tuple((i, next(iter(e))) for i, e in sorted(given.items()) if len(e) == 1)
        try:
            return Layout(tuple((i, e) for i, e in agreed if e))
        except SpecError:
            return Layout(())

    def seconds(layout: Layout) -> float:
        """Resharding to ``layout``, computing there, and producing ``out_spec``."""
        moves = [
            c
            for term, spec, shape in zip(op.inputs, in_specs, shapes, strict=True)
            for c in reshard_collectives(spec, layout.spec_for(term), shape, dtype, mesh, profile)
        ]
        produced = layout.spec_for(op.output)
        out = out_spec.canonical()
        if out not in output_choices(op, layout, mesh):
            out = produced
            moves += reshard_collectives(
                produced, out_spec, op.output_shape(shapes), dtype, mesh, profile
            )
        cost = predict(op, shapes, dtype, mesh, Strategy(layout, out), profile).seconds
        return cost + sum(c.seconds for c in moves)

    best: tuple[float, int, Layout] | None = None
    for pick in itertools.product(*(options[i] for i in indices)):
        try:
            layout = Layout(tuple((i, e) for i, e in zip(indices, pick, strict=True) if e))
        except SpecError:
            continue
        key = (seconds(layout), -sum(e != () for e in pick), layout)
        if best is None or key[:2] < best[:2]:
            best = key
    assert best is not None  # leaving every index whole is always a layout
    return best[2]
