"""The arrays that XLA's buffer assignment puts in another array's buffer, or never makes:
a transpose folded into the matrix products that read it, a pooling's padded operand, an
elementwise result written over an operand that dies there, an array made in a result's
buffer. :mod:`.memory` holds none of them apart.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from shardwise._caches import per_object
from shardwise._model.mesh import MeshSpec
from shardwise._model.spec import Spec
from shardwise._program.graph import Graph
from shardwise._program.moves import all_to_all, local, shard_bytes
from shardwise._program.nodes import Step
from shardwise._program.upcast import held_dtype

if TYPE_CHECKING:
    from shardwise._program.solution import Layouts


def readers(graph: Graph) -> dict[int, list[int]]:
    """The steps that read each array, by index in program order (a step that reads an array
    twice, once)."""
    out: dict[int, list[int]] = {}
    for n, step in enumerate(graph.steps):
        for a in dict.fromkeys(step.inputs):
            out.setdefault(a, []).append(n)
    return out


def folded_transposes(graph: Graph, results: set[int]) -> dict[int, int]:
    """The transposes that only matrix products read, each to its operand: XLA folds them
    into the products' dimension numbers, so the transposed array is never made and the
    products read the operand, held until then (seen: ``x @ w.T`` compiles to one ``dot`` of
    ``w``, and a training step holds no transposed weights)."""
    read_by = readers(graph)
    joined = Counter(graph.classes)
    return {
        s.output: s.inputs[0]
        for s in graph.steps
        if s.prim == "transpose"
        and s.output not in results
        and joined[graph.find(s.output)] == 1  # (no elementwise op reads it)
        and read_by.get(s.output)
        and all(graph.steps[n].prim == "dot_general" for n in read_by[s.output])
    }


def gathered_transposes(
    graph: Graph, lay: Layouts, mesh: MeshSpec, folded: dict[int, int]
) -> list[int]:
    """The ``folded`` transposes (:func:`folded_transposes`) kept gathered beyond the layout
    the transpose makes them in: a collective stands between the transpose and the products,
    so XLA makes the transposed array (``transpose_copy_fusion``), gathers it, and holds the
    gathered array until the products (seen: ``x.T @ w`` with ``x`` split along its columns
    on every device and kept split on ``data`` alone, 1.36x the prediction that folded it). A
    product that reads it gathered further makes a copy of its own (:mod:`.copies`)."""
    return [
        s.output
        for s in graph.steps
        if s.output in folded
        and s.key in lay.steps
        and shard_bytes(graph.values[s.output], lay.specs[s.output], mesh)
        > shard_bytes(graph.values[s.output], lay.steps[s.key][1], mesh)
    ]


def padded_windows(graph: Graph, results: set[int]) -> set[int]:
    """The padded operands of poolings (an average pool's gradient pads, then sums windows):
    XLA pads inside the pooling's loop, so the padded array is never made."""
    read_by = readers(graph)
    made = {s.output: s for s in graph.steps if s.prim == "pad"}
    return {
        v
        for v, pad in made.items()
        if v not in results
        and read_by.get(v)
        and all(graph.steps[n].prim.startswith("reduce_window") for n in read_by[v])
        and graph.last[v] == max(graph.born[graph.steps[n].output] for n in read_by[v])
    }


def overwritten(
    graph: Graph, arrays: list[int], first: np.ndarray, last: np.ndarray, kept: set[int]
) -> None:
    """An elementwise op writes its result over an operand of the same shape that nothing
    reads after it (XLA's buffer assignment shares the buffer: a convolution's result and the
    bias added to it are one buffer), so the operand is held until the op, the result from it
    on. Arguments, results and arrays a scan's loop carries keep buffers of their own."""
    dying: dict[tuple[int, int], list[int]] = {}
    for k, v in enumerate(arrays):
        if v not in kept and v not in graph.looped and v not in graph.inputs:
            dying.setdefault((graph.find(v), int(last[k])), []).append(k)
    for v in arrays:
        if v not in graph.elementwise or v in kept:
            continue
        value = graph.values[v]
        for j in dying.get((graph.find(v), graph.born[v]), []):
            u = graph.values[arrays[j]]
            if arrays[j] != v and u.shape == value.shape and u.dtype == value.dtype:
                last[j] = graph.born[v] - 1
                dying[(graph.find(v), graph.born[v])].remove(j)
                break


def made_again(graph: Graph, born: Sequence[int], reads: list[int]) -> None:
    """Hold none of :attr:`Graph.recomputed` (``x - mean``), and what each is made from until
    its last reader (``reads``, by array), as XLA computes it in each op that reads it; but a
    sum made for a pooling, which XLA makes a buffer of (:func:`pooled_sums`)."""
    pooled = {a for a, _, _ in pooled_sums(graph)}
    for v, operands in reversed(graph.recomputed):  # (a chain's last first)
        if v not in pooled and v not in graph.looped:  # (a scan's carry: a buffer)
            for a in operands:
                reads[a] = max(reads[a], reads[v])
            reads[v] = born[v] - 1  # (no buffer of its own)


def pooled_sums(graph: Graph) -> tuple[tuple[int, int, int], ...]:
    """The sums of an array and a broadcast one (a convolution's output plus its bias) that a
    pooling reads through an elementwise op (``avg_pool(relu(conv + b))``) and later ops read
    again (a training step's relu mask, ``conv + b > 0``): (the sum, its operand, the
    pooling's step index). On CPU, where the pooling reads them in the layout the operand is
    made in, XLA fuses the elementwise op into its YNNPACK pooling, which takes the sum as a
    buffer made for it alone (it fuses no operand that other ops read too); the later ops,
    loop fusions, add the bias again to the operand, which is so held until they read it,
    beside the sum (:func:`pooled_operands`), where the sum had been written over it (seen
    in the compiled training step of a convolution, bias, relu and
    average pooling with the batch split: ``convolution`` held from the forward pass to the
    backward's ``compare_select_fusion``, ``broadcast_add_fusion`` made beside it for the
    ``ynn_fusion`` only, and relu's zero made whole for it, ``wrapped_broadcast``, in place of
    the relu's result: three images held where the prediction had two, 1.30x to 1.40x)."""
    sums = [s.output for s in graph.steps if s.role == "broadcast"]
    out = []
    for n, step in enumerate(graph.steps):
        m = step.inputs[0] if step.prim.startswith("reduce_window") else None
        if m is None or m not in graph.elementwise or m in graph.inputs:
            continue
        made = [a for a in sums if graph.find(a) == graph.find(m) and graph.born[a] < graph.born[m]]
        if not made or graph.last[made[-1]] <= graph.born[step.output]:
            continue
        a = made[-1]
        value = graph.values[a]
        operands = [c for c, u in enumerate(graph.values) if graph.find(c) == graph.find(a)
                    and graph.last[c] == graph.born[a] and c != a and u.shape == value.shape
                    and u.dtype == value.dtype and c not in graph.inputs]  # fmt: skip
        if operands:
            out.append((a, operands[0], n))
    return tuple(out)


def pooled_operands(
    graph: Graph, lay: Layouts, mesh: MeshSpec, points: np.ndarray,
    pooled: tuple[tuple[int, int, int], ...],
) -> None:  # fmt: skip
    """The operand of each sum a pooling reads (``pooled``: :func:`pooled_sums`, once per
    graph) held beside the sum from the sum's point to the pooling's, where the step that
    makes the operand makes it in
    the layout it is held in, or gathers it there after, and the operand, the sum and the
    pooling's operand are laid out alike and the pooling reads it so (a gathered operand is
    the gather's result, a buffer of its own: seen in the compiled training step of a
    convolution made with its batch split and gathered whole, ``all-gather`` held beside
    ``broadcast_add_fusion`` and relu's zero, 1.38x the prediction without it). An operand
    moved by an all-to-all after its step (a convolution made with its batch split, held
    with its channels split: an ``all-to-all`` then a copy that transposes it) reaches the
    pooling through that copy's loop fusion, which takes in the sum and the elementwise op:
    the sum is made once, where the model has it, and the operand is the copy's input, held
    as the sum is (seen in the same training step's plan with its channels split:
    ``bitcast_copy_fusion`` reads the ``concatenate`` and the bias, no
    ``broadcast_add_fusion``; that plan went from 0.85 of the prediction to 0.81 when the
    operand was added there too)."""
    for a, c, n in pooled:
        step = graph.steps[n]
        found = lay.steps.get(step.key)
        spec = lay.specs[c].canonical()
        if found is None:
            continue
        made = [m[1] for s in graph.steps if s.output == c for m in [lay.steps.get(s.key)] if m]
        rank = len(graph.values[c].shape)
        if any(
            s.canonical() != spec for s in (lay.specs[a], lay.specs[step.inputs[0]], found[0][0])
        ) or any(_not_gathered(s, lay.specs[c], rank, mesh) for s in made):
            continue
        points[graph.born[a] : graph.born[step.output] + 1] += shard_bytes(
            graph.values[c], lay.specs[c], mesh
        )


def _not_gathered(made: Spec, held: Spec, rank: int, mesh: MeshSpec) -> bool:
    """Whether an array made as ``made`` and held as ``held`` is moved there by something
    other than gathers: a slice, or an all-to-all."""
    if made.canonical() == held.canonical():
        return False
    return local(made, held, rank, mesh) or all_to_all(made, held, rank, mesh)


def in_place(graph: Graph, results: set[int], cpu: bool = False) -> dict[int, int]:
    """The arrays that live in a result's buffer, each to that result: XLA gives each result
    a buffer of its own, held from the program's start (``memory_analysis`` counts
    arguments, results and the temporaries' peak), and an array that the elementwise ops
    making a result read last (an SGD step's gradient) is made in that buffer, not beside it
    (``w - lr * g`` runs in place), and so is the dot's result that such an array
    transposes (XLA has the dot write the transposed layout). On CPU (``cpu``) a 16-bit
    float array is a float32 buffer (:mod:`.upcast`): a bfloat16 gradient is made in its
    float32 parameter's new buffer."""
    out: dict[int, int] = {}
    arguments = set(graph.inputs)
    by_class = {graph.find(r): r for r in results}
    for v in graph.fed | {s.output for s in graph.steps}:
        r = by_class.get(graph.find(v))
        if r is None or v == r or v in arguments or v in results:
            continue
        same = graph.values[v].shape == graph.values[r].shape
        if (
            same
            and held_dtype(graph.values[v].dtype, cpu) == graph.values[r].dtype
            and graph.last[v] <= graph.born[r]
        ):
            out[v] = r
    for step in reversed(graph.steps):  # a transposed gradient is its dot's result, read so
        a = step.inputs[0]
        if (
            step.prim == "transpose"
            and step.output in out
            and graph.last[a] <= graph.born[step.output]
        ):
            out[a] = out[step.output]
    return out


def in_conds(graph: Graph, cpu: bool = False) -> dict[int, int]:
    """The arrays that live in a ``cond``'s result buffer, each to that result: XLA writes a
    branch's result in the conditional's own buffer, and the arrays of its class that the
    branch reads last before it (the dot whose ``tanh`` the branch returns) there too, as
    elementwise ops run in place (seen in the compiled HLO of a cond of ``x @ w * 2`` and
    ``tanh(x @ w)``: the dot, the product and the conditional's result in one buffer; each had
    been counted beside it)."""
    out: dict[int, int] = {}
    results = {v for v in graph.outputs if v is not None} | set(graph.inputs)
    held = graph.fed | {s.output for s in graph.steps}
    for got, r, start in graph.branched:
        out[got] = r
        kept = graph.values[r]
        for v in held:
            value = graph.values[v]
            if (
                v not in results
                and graph.find(v) == graph.find(r)
                and start < graph.born[v]
                and graph.last[v] <= graph.born[got]
                and value.shape == kept.shape
                and held_dtype(value.dtype, cpu) == kept.dtype
            ):
                out.setdefault(v, r)
    return out


def sliced_only(
    graph: Graph, lay: Layouts, mesh: MeshSpec, arrays: list[int], sizes: np.ndarray,
    cpu: bool = False,
) -> np.ndarray:  # fmt: skip
    """``sizes`` (one per array of ``arrays``) but none for an array that elementwise ops make
    and that every step reads as a slice of its layout on each device (``cpu``: or moves
    first by an all-to-all, whose pieces are slices): XLA fuses the ops into each slice and
    never makes the array's block (seen in the compiled HLO of ``x * 2`` over a replicated
    ``x``, read split by a dot in a cond's branch: a ``multiply_dynamic-slice`` fusion of the
    slice alone, where the whole had been counted beside it, 1.7x XLA's memory; on CPU, the
    pieces of an all-to-all sliced out of it). Not one that something else takes whole: a
    result, a cond, a scan's loop."""
    elementwise, broadcasts = _slicing(graph)
    index = {v: k for k, v in enumerate(arrays)}
    out = sizes.copy()
    for v in _bitcasts(graph, lay, mesh, broadcasts):
        if v in index:
            out[index[v]] = 0
    for v, reads in elementwise:
        if v not in index:
            continue
        own, rank = lay.specs[v], len(graph.values[v].shape)
        uses = [lay.steps[key][0][j] if key in lay.steps else own for key, j in reads]
        if all(u.canonical() != own.canonical() and local(own, u, rank, mesh, cpu) for u in uses):
            out[index[v]] = 0
    return out


@per_object(maxsize=8)
def _slicing(
    graph: Graph,
) -> tuple[list[tuple[int, list[tuple[Any, int]]]], list[Step]]:
    """What :func:`sliced_only` looks at whatever the layouts, once per graph: each array
    elementwise ops make that a step reads and nothing takes whole, with its reads (the
    step's key and the operand's position), and the broadcasts of an argument that nothing
    takes whole (:func:`_bitcasts`)."""
    results = {v for v in graph.outputs if v is not None}
    kept = set(graph.inputs) | results | graph.looped | graph.taken
    elementwise = [
        (v, [(graph.steps[n].key, j) for n in steps
             for j, a in enumerate(graph.steps[n].inputs) if a == v])
        for v, steps in readers(graph).items()
        if v not in kept and v in graph.elementwise
    ]  # fmt: skip
    broadcasts = [
        s for s in graph.steps
        if s.prim == "broadcast_in_dim" and s.output not in kept and s.inputs[0] in graph.inputs
    ]  # fmt: skip
    return elementwise, broadcasts


def _bitcasts(graph: Graph, lay: Layouts, mesh: MeshSpec, broadcasts: list[Step]) -> list[int]:
    """The arrays that ``broadcasts`` (of an argument) make, in their own layout, in blocks no
    bigger than the argument's block it is read as: XLA reads that block's buffer as such a
    block (the new dimensions of size 1 on each device: seen in the compiled HLO of a weight
    broadcast along a batch of 8 split 8 ways, no broadcast made). Not one that adds no
    elements (a bias made a row), counted as before: its few bytes had held a checkpointed
    MLP's plans, 1.248x XLA's memory, inside their bounds."""
    out = []
    for step in broadcasts:
        v, a, found = step.output, step.inputs[0], lay.steps.get(step.key)
        own = lay.specs[v]
        if (
            found is not None
            and graph.values[v].nbytes > graph.values[a].nbytes
            and local(found[1], own, len(graph.values[v].shape), mesh)
            and shard_bytes(graph.values[v], own, mesh)
            <= shard_bytes(graph.values[a], found[0][0], mesh)
        ):
            out.append(v)
    return out


def unread_inputs(graph: Graph) -> frozenset[int]:
    """The arguments that nothing in the program reads and that are not results: ``jax.jit``
    drops them (``keep_unused=False``), so the compiled program holds no buffer for them (seen:
    an argument read only by dead code took none, where it had been counted whole)."""
    jaxpr = graph.closed.jaxpr
    read = {id(v) for eqn in jaxpr.eqns for v in eqn.invars}
    read |= {id(v) for v in jaxpr.outvars}
    return frozenset(
        graph.keys[((), var)] for var in jaxpr.invars
        if id(var) not in read and ((), var) in graph.keys
    )  # fmt: skip
