"""Megatron's tensor parallelism for any program, found by following its dataflow, not names.

The walk goes through the program's steps in order, keeping for each class of activations
which of its dimensions is split over the model axes (none, at first: the data is whole):

- a matrix product of a **weight** (a parameter, or a transpose, reshape or scan slice of
  one) and a whole activation is **column-parallel**: the weight is split along its first
  output dimension that divides (a ``Linear``'s output features; the heads of an attention
  projection's ``(features, heads, head_dim)`` kernel), and so is the product. Of several
  output dimensions the last is never split: each device computes whole heads, as
  Megatron-LM does (it requires the heads to divide over the tensor axes); the projections
  of an attention whose heads do not divide stay whole. Split along ``head_dim``, the product
  of queries and keys would contract a split dimension, and every score would be a partial
  sum all-reduced over the tensor axes;
- a product of a weight and an activation split along a dimension the weight also has is
  **row-parallel** where that dimension is contracted (an MLP's second weight; attention's
  output projection, over the heads): the weight is split along it and the product is
  whole (its partial sums all-reduced);
- a product of two activations (attention's scores and their weighted sum) keeps a split
  dimension both carry into the result (the heads);
- elementwise ops, transposes, reshapes and reductions carry a split along, through
  residuals and layer norms; an op planned whole (a gather, a concatenation) ends it.

A parameter **broadcast** into an activation (a bias, a layer norm's scale or offset, a
mask) is split where the activation is: a column-parallel layer's bias along its output
features, a row-parallel layer's bias and a layer norm's parameters (whole activations)
replicated. An **embedding** table read by a lookup (a gather) is replicated; one tied to an
output layer (also read by a matrix product) is split as that product says (over the
vocabulary). **Optimizer state** (Adam's ``mu``, ``nu``) is combined elementwise with its
parameter, so it shares the parameter's class and its layout.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from shardwise._model.mesh import MeshSpec
from shardwise._model.spec import Spec
from shardwise._program.graph import Graph
from shardwise._program.nodes import Step

Dims = tuple[int | None, ...]
"""For each dimension of an array made from a parameter, the parameter's dimension it is
(``None``: a new one)."""


def split_spec(shape: Sequence[int], dim: int, axes: Sequence[str], mesh: MeshSpec) -> Spec | None:
    """``shape`` split along ``dim`` over ``axes``, or ``None`` where it does not divide.

    >>> mesh = MeshSpec.parse("data=2,model=4")
    >>> split_spec((16, 64), 1, ("model",), mesh).describe(), split_spec((6,), 0, ("model",), mesh)
    ('-,model', None)
    """
    if not axes or not shape or shape[dim] % math.prod(mesh.shape[a] for a in axes):
        return None
    entries: list[tuple[str, ...]] = [() for _ in shape]
    entries[dim] = tuple(axes)
    return Spec(tuple(entries)).canonical()


@dataclass
class _Flow:
    """The walk's state.

    Attributes:
        origin: each class made of a parameter (without a broadcast): the parameter, and
            which of its dimensions each of the class's dimensions is.
        state: each class of activations met: its dimension split over the model axes
            (``None``: whole).
        decided: each parameter decided on: its dimension split (``None``: replicated).
        uses: parameters broadcast into activations (bias-like): the parameter, its dimension
            of each of the activation's dimensions, the activation's class.
        weights: how many parameters were read by a matrix product with an activation.
    """

    origin: dict[int, tuple[int, Dims]]
    state: dict[int, int | None] = field(default_factory=dict)
    decided: dict[int, int | None] = field(default_factory=dict)
    uses: list[tuple[int, Dims, int]] = field(default_factory=list)
    weights: set[int] = field(default_factory=set)


def tensor_parallel(
    graph: Graph, params: Sequence[int], axes: Sequence[str], mesh: MeshSpec, avoid: Sequence[int]
) -> dict[int, Spec] | str:
    """Megatron's split of each parameter in ``params`` (input positions) over ``axes`` that
    it splits (the others stay replicated), or why it splits none. ``avoid``: inputs that are
    never weights (the data), whose classes are activations."""
    activations = {graph.find(graph.inputs[k]) for k in avoid}
    origin: dict[int, tuple[int, Dims]] = {}
    for k in params:
        c = graph.find(graph.inputs[k])
        if c not in activations:
            origin.setdefault(c, (k, tuple(range(len(graph.values[graph.inputs[k]].shape)))))
    flow = _Flow(origin)
    for step in graph.steps:
        if step.kind == "dot" and len(step.inputs) == 2:
            _dot(flow, graph, step, axes, mesh)
        elif step.kind == "map":
            _map(flow, graph, step)
        else:
            out = graph.find(step.output)
            if out not in flow.origin:
                flow.state.setdefault(out, None)
    _broadcasts(flow, graph, axes, mesh)
    by_class: dict[int, Spec] = {}
    for k, dim in flow.decided.items():
        shape = graph.values[graph.inputs[k]].shape
        if dim is not None and (spec := split_spec(shape, dim, axes, mesh)) is not None:
            by_class[graph.find(graph.inputs[k])] = spec
    splits = {k: by_class[c] for k in params if (c := graph.find(graph.inputs[k])) in by_class}
    if splits:
        return splits
    if not flow.weights:
        return "no parameter is multiplied by an activation in a matrix product"
    devices = math.prod(mesh.shape[a] for a in axes)
    return (
        f"none of the {len(flow.weights)} weights of matrix products has an output "
        f"(column-parallel) or input (row-parallel) dimension that divides over "
        f"{'×'.join(axes)} ({devices} devices)"
    )


def _dot(flow: _Flow, graph: Graph, step: Step, axes: Sequence[str], mesh: MeshSpec) -> None:
    """A matrix product: decide its weight (if it has one, not yet decided) and the split of
    its result."""
    assert step.op is not None
    op = step.op
    ins = [graph.find(a) for a in step.inputs]
    out = graph.find(step.output)
    if step.prim.startswith(("gather", "scatter")):  # a lookup: its table stays whole
        flow.state.setdefault(out, None)
        return
    slots = [s for s, c in enumerate(ins) if c in flow.origin]
    if len(slots) == 2:
        return
    letters: list[str | None] = []
    for slot, c in enumerate(ins):
        dim = flow.state.get(c)
        letters.append(op.inputs[slot][dim] if dim is not None and c not in flow.origin else None)
    if slots:
        (slot,) = slots
        k, dims = flow.origin[ins[slot]]
        term, other = op.inputs[slot], op.inputs[1 - slot]
        flow.weights.add(k)
        if k not in flow.decided:
            act = letters[1 - slot]
            if act is None:  # column-parallel: along an output dimension
                wanted = [i for i in term if i in op.output and i not in other
                          and i not in step.whole]  # (a conv's window stays whole)  # fmt: skip
                wanted = wanted[:-1] or wanted  # (heads, never head_dim: see the module)
            else:  # row-parallel where contracted; left to a later use where not its own
                wanted = [act] if act in term and act not in step.whole else []
            shape = graph.values[graph.inputs[k]].shape
            for letter in wanted:
                dim = dims[term.index(letter)]
                if dim is not None and split_spec(shape, dim, axes, mesh) is not None:
                    flow.decided[k] = dim
                    break
            else:
                if wanted:
                    flow.decided[k] = None
        split = flow.decided.get(k)
        found = (i for i, d in zip(term, dims, strict=True) if d == split and split is not None)
        letters[slot] = next(found, None)
    if out in flow.origin:
        return
    kept = [i for i in letters if i is not None and i in op.output]
    flow.state.setdefault(out, op.output.index(kept[0]) if kept else None)


def _map(flow: _Flow, graph: Graph, step: Step) -> None:
    """A map (transpose, reshape, reduction, broadcast, scan slice): a parameter's view stays
    a parameter, a parameter broadcast into an activation is bias-like (decided at the end),
    and an activation's split follows its dimension."""
    src, out = graph.find(step.inputs[0]), graph.find(step.output)
    if src in flow.origin:
        k, dims = flow.origin[src]
        mapped = tuple(dims[d] if d is not None else None for d in step.dim_map)
        shape = graph.values[step.output].shape
        grows = any(d is None and shape[o] > 1 for o, d in enumerate(step.dim_map))
        if step.implicit or grows or out in flow.state:
            flow.uses.append((k, mapped, out))
        elif out not in flow.origin:
            flow.origin[out] = (k, mapped)
        return
    if out in flow.origin or out in flow.state:
        return
    dim = flow.state.get(src)
    kept = dim is not None and dim not in step.local and dim not in step.reduced
    flow.state[out] = step.dim_map.index(dim) if kept and dim in step.dim_map else None


def _broadcasts(flow: _Flow, graph: Graph, axes: Sequence[str], mesh: MeshSpec) -> None:
    """Decide each bias-like parameter not read by a matrix product: split along the
    dimension its activation is split along (at its first use), else replicated."""
    for k, mapped, out in flow.uses:
        if k in flow.decided:
            continue
        dim = flow.state.get(out)
        split = mapped[dim] if dim is not None else None
        shape = graph.values[graph.inputs[k]].shape
        ok = split is not None and split_spec(shape, split, axes, mesh) is not None
        flow.decided[k] = split if ok else None
