"""Random bits drawn from a key, as XLA draws them: once, in one layout.

A key is a scalar, so the bits are made from nothing, but not free in every layout as an
``iota`` is: XLA draws them once, in the layout it gives the draw, and moves them to each op
that reads them in another (seen in the compiled HLO of a training step whose dropout mask is
read split on the batch by the loss and split on the features by a second product: the
threefry loop over ``u32[2,64]`` blocks, the batch's layout, then an ``all-to-all`` of the
``pred`` mask to the features' layout, 128 bytes a device). So the bits are an array of the
program, laid out like any other: what is made from them alone (shifted, cast to floats,
compared: the mask) joins their class, drawn with them, and each op that reads them beside
other arrays reads them as a broadcast does, moved to its result's layout (costed, and
applied as the plan's layout of the bits, which XLA then draws them in)."""

from __future__ import annotations

from typing import Any

from shardwise._program.rules import IDENTITIES, rule_of
from shardwise._program.walk import Path, is_var, named, rank

DRAW_PASSES = 10
"""The passes over the bits' bytes that drawing them costs, as elementwise work: XLA's CPU
backend runs the threefry hash as a loop of five turns over two ``uint32`` counter arrays
of the bits' shape, each read and written every turn (seen in the compiled HLO: a
``while`` with ``known_trip_count`` 5 carrying two ``u32[2,64]`` arrays)."""


BITWISE = frozenset({"bitcast_convert_type", *IDENTITIES})
"""Ops besides the elementwise ones that make an array from random bits alone, element by
element (the bits as floats, in ``jax.random.uniform``): what ``derived`` joins to them."""


def read(b: Any, eqn: Any, path: Path, inputs: list[int]) -> list[int | None] | None:
    """``eqn``'s results where it draws random bits or makes arrays from them alone (see
    :func:`draw`, :func:`derived`), as arrays of the builder ``b``; else ``None``."""
    if eqn.primitive.name == "random_bits":  # (from keys that are arrays: an opaque op)
        if inputs:  # (its bits: the keys' dimensions and each key's)
            b.drawn.append((b.clock, tuple(eqn.outvars[0].aval.shape), None))
            return None
        return [draw(b, eqn, path)]
    rule = rule_of(eqn.primitive.name)
    if rule.placement or (rule.kind != "elementwise" and eqn.primitive.name not in BITWISE):
        return None  # (a dot, a sort, a constraint on them: read as any other array's)
    if inputs and all(a in b.random for a in inputs) and derived(b, eqn, path):
        return [b.env.get((path, o)) if is_var(o) else None for o in eqn.outvars]
    return None


def draw(b: Any, eqn: Any, path: Path) -> int:
    """The bits ``eqn`` (a ``random_bits`` of a scalar key) draws, as a new array of the
    builder ``b`` (:class:`~shardwise._program.graph._Builder`), noted as drawn."""
    (o,) = eqn.outvars
    v: int = b.define((path, o), named("random bits", b.where(eqn)), b.where(eqn))
    b.random.add(v)
    b.drawn.append((b.clock, b.values[v].shape, v))
    b.elementwise[v] = b.repeat * DRAW_PASSES
    return v


def derived(b: Any, eqn: Any, path: Path) -> bool:
    """Whether ``eqn``, reading random bits alone, makes results each of the shape of an
    operand (a dropout mask: the bits shifted, cast, compared): each then joins that
    operand's class, drawn with it, with no step and no buffer of its own (XLA fuses them
    into the ops that read them)."""
    inputs = [a for v in eqn.invars if (a := b.array(path, v)) is not None]
    held = {b.values[a].shape: a for a in inputs}
    outs = [o for o in eqn.outvars if is_var(o) and rank(o)]
    if not outs or any(tuple(o.aval.shape) not in held for o in outs):
        return False
    for o in outs:
        v = b.define((path, o), named(eqn.primitive.name, b.where(eqn)), "")
        b.classes.join(held[b.values[v].shape], v)
        b.random.add(v)
    for a in inputs:
        b.use(a, False)
    return True
