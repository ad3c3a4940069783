"""Donated arguments: ``jax.jit(f, donate_argnums=…)`` lets XLA write a result into the
buffer of a donated argument of the same shape, type and layout, as a training step writes
its new parameters and optimizer state over the old ones. Such a result takes no memory of
its own; one laid out otherwise than its argument cannot take it, and is held beside it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import jax

from shardwise._errors import ArgumentError
from shardwise._model.mesh import MeshSpec
from shardwise._program.graph import Graph
from shardwise._program.moves import shard_bytes

if TYPE_CHECKING:
    from shardwise._program.solution import Layouts


def donated(args: Sequence[Any], donate_argnums: int | Sequence[int]) -> tuple[int, ...]:
    """``donate_argnums`` as positions of ``args``, sorted (a negative one counts from the
    end, as ``jax.jit``'s)."""
    asked = (donate_argnums,) if isinstance(donate_argnums, int) else tuple(donate_argnums)
    wrong = [k for k in asked if not isinstance(k, int) or not -len(args) <= k < len(args)]
    if wrong:
        raise ArgumentError(
            f"donate_argnums={asked!r}: {wrong} are not positions of the {len(args)} "
            f"arguments; give positions from 0 to {len(args) - 1}, as jax.jit's donate_argnums."
        )
    return tuple(sorted({k % len(args) for k in asked}))


def donated_leaves(args: Sequence[Any], positions: Sequence[int]) -> tuple[int, ...]:
    """The positions, among the arguments' leaves in ``jax.tree`` order, of the leaves of the
    arguments at ``positions``.

    >>> donated_leaves(({"w": 1, "b": 2}, 3, 4), (0, 2))
    (0, 1, 3)
    """
    counts = [len(jax.tree.leaves(a)) for a in args]
    starts = [sum(counts[:k]) for k in range(len(args))]
    return tuple(i for k in positions for i in range(starts[k], starts[k] + counts[k]))


def aliased(graph: Graph) -> dict[int, int]:
    """Each result that takes a donated argument's buffer, to that argument: results in
    order, each the first donated argument left of its shape and type (as ``jax.jit`` pairs
    them)."""
    if not graph.donated:
        return {}
    left = [a for a in graph.inputs if a in graph.donated]
    out: dict[int, int] = {}
    for r in graph.outputs:
        if r is None or r in out or r in graph.inputs:
            continue
        value = graph.values[r]
        for a in left:
            if graph.values[a].shape == value.shape and graph.values[a].dtype == value.dtype:
                out[r] = a
                left.remove(a)
                break
    return out


def unaliased_bytes(graph: Graph, lay: Layouts, mesh: MeshSpec) -> int:
    """Per device, the results paired with a donated argument (:func:`aliased`) that the plan
    lays out otherwise than it, and the arguments returned as they are (not donated: XLA
    copies each into a result buffer of its own): each keeps a buffer of its own for the
    whole program."""
    specs = lay.specs
    returned = {r for r in graph.outputs if r in graph.inputs and r not in graph.donated}
    return sum(
        shard_bytes(graph.values[r], specs[r], mesh)
        for r, a in aliased(graph).items()
        if specs[r].canonical() != specs[a].canonical()
    ) + sum(shard_bytes(graph.values[r], specs[r], mesh) for r in returned)
