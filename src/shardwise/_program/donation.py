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


def donated(args: Sequence[Any], donate_argnums: int | Sequence[int] | None) -> tuple[int, ...]:
    """``donate_argnums`` as positions of ``args``, sorted (a negative one counts from the
    end, and ``None`` is none, as ``jax.jit``'s)."""
    if donate_argnums is None:
        return ()
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


def updated_early(graph: Graph, taken: dict[int, int], born: list[int], reads: list[int]) -> None:
    """Where XLA writes a result over a donated argument (``taken``: result → argument), it
    makes the result as soon as what it reads is ready: the arrays it is made from
    (its class's, by elementwise ops: an SGD step's gradient, AdamW's moments) are made and
    the steps that read the argument's old value have run. So each array of that chain is
    held until then, not until the program makes the result, as in program order (seen: a
    donated SGD step holds one weight's gradient at a time, where program order holds all).
    A chain that a step reads (a global norm of the gradients) waits as written: the result
    needs all of it, and so does one that makes several results (AdamW's weight and moments:
    XLA made those late, as written; a donated AdamW step's memory matched program order).
    ``born`` and ``reads`` (each array's first and last point) change."""
    if not taken:
        return
    read_by_step: dict[int, int] = {}
    transposed: dict[int, int] = {}  # a transpose's result → its operand
    for step in graph.steps:
        for a in step.inputs:
            read_by_step[a] = max(read_by_step.get(a, 0), born[step.output])
        if step.prim == "transpose" and step.inputs:
            transposed[step.output] = step.inputs[0]
    members: dict[int, list[int]] = {}
    for v in range(len(graph.values)):
        members.setdefault(graph.find(v), []).append(v)
    inputs = set(graph.inputs)
    for r in taken:
        group = members[graph.find(r)]
        made = [v for v in group if v not in inputs and v != r]
        if not made or any(v in read_by_step or v in taken for v in made):
            continue
        ready = max(
            [born[v] for v in made if v not in graph.elementwise]
            + [read_by_step.get(a, 0) for a in group if a in inputs]
        )  # fmt: skip
        for v in made:
            born[v] = min(born[v], ready)
            reads[v] = max(born[v], min(reads[v], ready))
        for v in made:  # the dot writes the transposed gradient's layout at once
            made_by_dot = transposed.get(v)
            if made_by_dot is not None and graph.last[made_by_dot] <= born[v]:
                reads[made_by_dot] = born[made_by_dot] - 1  # (never a buffer of its own)
