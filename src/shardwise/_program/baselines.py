"""The named strategies every program plan is compared with. Each fixes the layouts of the
program's inputs; the search then lays out the intermediates as cheaply as it can.

Inputs are told apart by where they are: an argument that is one array is **data** (its first
dimension is the batch); the leaves of an argument that is a container (a dict of weights) are
**parameters**.

- ``replicated``: every input whole on every device;
- ``data-parallel``: the batch split over the data axes, parameters replicated;
- ``fsdp``: as data-parallel, and each parameter split along its largest dimension that the
  data axes divide (gathered before use);
- ``megatron``: tensor parallelism over the model axes (the whole mesh): the first weight of
  each pair of matrix products split along its output dimension (column-parallel), the weight
  that reads that split result along its input dimension (row-parallel), so each pair ends in
  one all-reduce; data replicated;
- ``data×tensor``: Megatron over the model axes and the batch over the data axes.

The data axes are those a ``fixed`` data input splits its first dimension over, else every
mesh axis (for ``data×tensor``, the first axis); the model axes are the others.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from shardwise._model.mesh import MeshSpec
from shardwise._model.spec import Spec
from shardwise._program.graph import Graph

NAMES = ("replicated", "data-parallel", "fsdp", "megatron", "data×tensor")


def data_inputs(graph: Graph) -> list[int]:
    """Positions (in ``graph.inputs``) of the arguments that are single arrays."""
    starts, k = [], 0
    for leaves in graph.tree.children():
        starts.append(k)
        k += leaves.num_leaves
    return [starts[a] for a in graph.data]


def _split(shape: Sequence[int], dim: int, axes: Sequence[str], mesh: MeshSpec) -> Spec | None:
    if not axes or not shape or shape[dim] % math.prod(mesh.shape[a] for a in axes):
        return None
    entries: list[tuple[str, ...]] = [() for _ in shape]
    entries[dim] = tuple(axes)
    return Spec(tuple(entries)).canonical()


def baseline(
    name: str, graph: Graph, mesh: MeshSpec, fixed: dict[int, Spec]
) -> dict[int, Spec] | str:
    """Input position → spec for the baseline ``name``, or why it does not apply."""
    data = data_inputs(graph)
    if not data and name != "replicated":
        return "no argument is a single data array to split along its batch"
    fixed_axes = next((fixed[k].padded(1)[0] for k in data if k in fixed), ())
    everything = mesh.names
    data_axes = fixed_axes or (everything if name != "data×tensor" else everything[:1])
    model_axes = tuple(a for a in everything if a not in data_axes)
    if name == "megatron":
        model_axes, data_axes = everything, ()
    specs: dict[int, Spec] = {k: Spec() for k in range(len(graph.inputs))}
    for k in data:
        if name == "replicated" or not data_axes:
            continue
        spec = _split(graph.values[graph.inputs[k]].shape, 0, data_axes, mesh)
        if spec is None:
            return f"the batch of {graph.names[k]} does not divide over {'×'.join(data_axes)}"
        specs[k] = spec
    if name == "fsdp":
        for k in set(range(len(graph.inputs))) - set(data):
            shape = graph.values[graph.inputs[k]].shape
            for dim in sorted(range(len(shape)), key=lambda d: -shape[d]):
                if (spec := _split(shape, dim, data_axes, mesh)) is not None:
                    specs[k] = spec
                    break
    if name in ("megatron", "data×tensor"):
        if not model_axes:
            return "the mesh has no axis left for tensor parallelism"
        split = tensor_parallel(graph, model_axes, mesh)
        if not split:
            return "no weight's shapes admit column- then row-parallel splits"
        specs.update(split)
    return specs


def tensor_parallel(graph: Graph, axes: Sequence[str], mesh: MeshSpec) -> dict[int, Spec]:
    """Megatron's splits of the parameters, found by following the program: a dot of a weight
    and an activation that no earlier column-parallel dot split is column-parallel (the weight's
    output dimension is split and so is its result); one whose activation is split that way is
    row-parallel (the weight's contracted dimension is split; the partial sums are all-reduced)."""
    data = set(data_inputs(graph))
    # each class that holds a parameter (or a map of one, as a scan's slice of stacked weights
    # is): the parameter, and which of its dimensions each of the class's dimensions is
    origin: dict[int, tuple[int, tuple[int | None, ...]]] = {
        graph.find(graph.inputs[k]): (k, tuple(range(len(graph.values[graph.inputs[k]].shape))))
        for k in range(len(graph.inputs))
        if k not in data
    }
    split: set[int] = set()
    out: dict[int, Spec] = {}
    for step in graph.steps:
        ins = [graph.find(a) for a in step.inputs]
        tainted = any(c in split for c in ins)
        if step.kind == "map" and ins[0] in origin:
            k, dims = origin[ins[0]]
            origin.setdefault(
                graph.find(step.output),
                (k, tuple(dims[d] if d is not None else None for d in step.dim_map)),
            )
            continue
        weights = [(slot, origin[c]) for slot, c in enumerate(ins) if c in origin]
        if step.kind != "dot" or len(weights) != 1:
            if tainted and step.kind in ("map", "dot"):
                split.add(graph.find(step.output))
            continue
        assert step.op is not None
        slot, (k, dims) = weights[0]
        if k in out:
            continue
        term = step.op.inputs[slot]
        wanted = [i for i in term if (i in step.op.contracted) == tainted and i not in step.whole]
        shape = graph.values[graph.inputs[k]].shape
        for index in wanted:
            dim = dims[term.index(index)]
            if dim is not None and (spec := _split(shape, dim, axes, mesh)) is not None:
                out[k] = spec
                break
        if not tainted and k in out:
            split.add(graph.find(step.output))
    return out
