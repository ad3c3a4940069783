"""The named strategies every program plan is compared with. Each fixes the layouts of the
program's inputs; the search then lays out the intermediates as cheaply as it can.

Inputs are told apart by role (:mod:`~shardwise._program.roles`): the **data** are the
arguments that are one array each whose first dimension is the batch (inputs and integer
labels alike); **PRNG keys** are never data and always replicated; everything else (the
leaves of containers: weights, optimizer state) is a **parameter**.

- ``replicated``: every input whole on every device;
- ``data-parallel``: the batch split over the data axes, parameters replicated;
- ``fsdp``: as data-parallel, and each parameter split along its largest dimension that the
  data axes divide (gathered before use);
- ``megatron``: tensor parallelism over the model axes (the whole mesh), found by following
  the program (:mod:`~shardwise._program.megatron`): each weight whose matrix product reads a
  whole activation split along its output dimension (column-parallel, with its bias), each
  weight that reads such a split result along its input dimension (row-parallel, its bias
  replicated), so each pair ends in one all-reduce; layer norms, embeddings read by lookups
  and the data replicated; optimizer state as its parameter;
- ``data×tensor``: Megatron over the model axes and the batch over the data axes.

The data axes are those a ``fixed`` data input splits its first dimension over, else every
mesh axis (for ``data×tensor``, the first axis); the model axes are the others.
"""

from __future__ import annotations

import math

from shardwise._model.mesh import MeshSpec
from shardwise._model.spec import Spec
from shardwise._program.graph import Graph
from shardwise._program.megatron import split_spec, tensor_parallel
from shardwise._program.roles import Roles, roles

NAMES = ("replicated", "data-parallel", "fsdp", "megatron", "data×tensor")


def baseline(
    name: str, graph: Graph, mesh: MeshSpec, fixed: dict[int, Spec], role: Roles | None = None
) -> dict[int, Spec] | str:
    """Input position → spec for the baseline ``name``, or why it does not apply (``role``:
    the inputs' roles, where known already)."""
    role = role or roles(graph)
    data = role.data
    if not data and name not in ("replicated", "megatron"):
        return (
            "no argument is data to split along its batch: a single array, or a container "
            "(not the first argument) whose leaves all have the batch first (PRNG keys and "
            "scalars are not data)"
        )
    pinned = next((fixed[k].padded(1)[0] for k in data if k in fixed), ())
    fixed_axes = tuple(a for a in pinned if a in mesh.shape)  # (an axis of size 1: none)
    everything = mesh.names
    data_axes = fixed_axes or (everything if name != "data×tensor" else everything[:1])
    model_axes = tuple(a for a in everything if a not in data_axes)
    if name == "megatron":
        model_axes, data_axes = everything, ()
    specs: dict[int, Spec] = {k: Spec() for k in range(len(graph.inputs))}
    for k in data:
        if name == "replicated" or not data_axes:
            continue
        spec = split_spec(graph.values[graph.inputs[k]].shape, 0, data_axes, mesh)
        if spec is None:
            devices = math.prod(mesh.shape[a] for a in data_axes)
            return (
                f"the batch of {graph.names[k]} ({role.batch}) does not divide over "
                f"{'×'.join(data_axes)} ({devices} devices)"
            )
        specs[k] = spec
    if name == "fsdp":
        for k in role.params:
            shape = graph.values[graph.inputs[k]].shape
            for dim in sorted(range(len(shape)), key=lambda d: -shape[d]):
                if (spec := split_spec(shape, dim, data_axes, mesh)) is not None:
                    specs[k] = spec
                    break
    if name in ("megatron", "data×tensor"):
        if not model_axes:
            return "the mesh has no axis left for tensor parallelism"
        split = tensor_parallel(graph, role.params, model_axes, mesh, data)
        if isinstance(split, str):
            alone = "" if data else " (no argument is data: all are parameters)"
            return split + alone
        specs.update(split)
    return specs
