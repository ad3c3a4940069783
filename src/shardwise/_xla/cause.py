"""Why each collective is there: a reason in words and as data.

For an einsum the plan says which mesh axis splits which index of which
operand, so each collective found in the HLO can be traced to its cause:

- **partial-sum**: a contracted index is split on the axes, so each device
  holds a partial sum that must be added up (all-reduce, reduce-scatter);
- **gather-operand**: an operand is split on an axis the computation needs it
  whole along, so its pieces are collected (all-gather);
- **gather-output**: the computation produced the output split on an axis the
  requested output layout leaves unsplit;
- **relayout**: data split along one dimension must be re-split along another,
  or moved between devices (all-to-all, collective-permute).

For any other function the cause is told from the collective's kind and the
JAX operation (and source line) that produced it. Everything here is pure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, TypeAlias

import jax.numpy as jnp

from shardwise._model.plan import Plan, default_out_spec
from shardwise._model.spec import Spec
from shardwise._xla.hlo import Collective

Reason: TypeAlias = Literal["partial-sum", "gather-operand", "gather-output", "relayout", "unknown"]


@dataclass(frozen=True, slots=True)
class Cause:
    """Why a collective is there.

    Attributes:
        reason: the kind of cause.
        text: one sentence a person can read.
        array: ``"operand 1"``, ``"output"`` or ``None`` when no single array is to blame.
        index: the einsum index involved, where there is one.
    """

    reason: Reason
    text: str
    array: str | None = None
    index: str | None = None

    def to_json(self) -> dict[str, object]:
        return {"reason": self.reason, "text": self.text, "array": self.array, "index": self.index}


def _axes(axes: tuple[str, ...]) -> str:
    return ",".join(axes) if axes else "no axis"


def _layout(spec: Spec, rank: int) -> str:
    entries = spec.padded(rank)
    return (
        "("
        + ", ".join(
            "None" if not e else e[0] if len(e) == 1 else "(" + ",".join(e) + ")" for e in entries
        )
        + ")"
    )


def _where(op_name: str, source: str) -> str:
    short = op_name.rsplit("/", 1)[-1].rstrip(")").replace(":", ", ") if op_name else ""
    if short and source:
        return f" (from `{short}` at {source})"
    return f" (from `{short}`)" if short else ""


_KIND_REASON: dict[str, Reason] = {
    "all-reduce": "partial-sum",
    "reduce-scatter": "partial-sum",
    "all-gather": "gather-operand",
    "all-to-all": "relayout",
    "collective-permute": "relayout",
}
"""The reason a collective of each kind has, told from its kind alone."""


_COMBINED = {
    "maximum": "combined by their maximum",
    "minimum": "combined by their minimum",
    "multiply": "multiplied",
    "and": "combined by logical and",
    "or": "combined by logical or",
}
"""How an all-reduce's combiner (its ``to_apply`` root) puts the devices' parts together, where
it does not sum them (a softmax's maximum had been said to be summed)."""


def _generic_text(c: Collective, where: str) -> str:
    """The sentence for a collective told from its kind alone."""
    axes = _axes(c.mesh_axes)
    combined = _COMBINED.get(getattr(c, "combiner", ""), "summed")
    return {
        "all-reduce": f"all-reduce over `{axes}`: each device holds a partial result, "
        f"{combined} across `{axes}`{where}",
        "reduce-scatter": f"reduce-scatter over `{axes}`: partial results are {combined} across "
        f"`{axes}` and each device keeps one slice{where}",
        "all-gather": f"all-gather over `{axes}`: the operation needs the whole array along "
        f"`{axes}`, so each device collects the others' pieces{where}",
        "all-to-all": f"all-to-all over `{axes}`: data split along one dimension is re-split "
        f"along another{where}",
        "collective-permute": f"collective-permute over `{axes}`: devices exchange blocks so "
        f"that each holds the piece the next step needs{where}",
    }[c.kind]


def generic_cause(c: Collective, with_source: bool = True) -> Cause:
    """A cause told from the collective's kind and the operation (and source line) behind it."""
    where = _where(c.op_name, c.source if with_source else "")
    text = _generic_text(c, where)
    return Cause(_KIND_REASON[c.kind], text)


def _axis_owner(plan: Plan, axis: str) -> list[tuple[str, str]]:
    """(array, index) pairs in which ``axis`` splits an index."""
    found = []
    arrays = [
        (f"operand {k}", t, s)
        for k, (t, s) in enumerate(zip(plan.op.inputs, plan.in_specs, strict=True))
    ]
    arrays.append(("output", plan.op.output, plan.out_spec))
    for name, term, spec in arrays:
        for index, entry in zip(term, spec.padded(len(term)), strict=True):
            if axis in entry:
                found.append((name, index))
    return found


def _bytes(shape: tuple[int, ...], dtype: str) -> int:
    return math.prod(shape) * jnp.dtype(dtype).itemsize


def _without(spec: Spec, axes: tuple[str, ...]) -> Spec:
    return Spec(tuple(tuple(a for a in e if a not in axes) for e in spec.entries))


def _disagrees(plan: Plan, k: int) -> bool:
    """Operand ``k`` splits an index differently from the output, or uses an axis that the
    output gives to another index."""
    out = dict(zip(plan.op.output, plan.out_spec.padded(len(plan.op.output)), strict=True))
    owner = {a: i for i, e in out.items() for a in e}
    term, spec = plan.op.inputs[k], plan.in_specs[k]
    for index, entry in zip(term, spec.padded(len(term)), strict=True):
        if index in out and out[index] != entry:
            return True
        if any(owner.get(a, index) != index for a in entry):
            return True
    return False


@dataclass(frozen=True, slots=True)
class _Decision:
    """What an einsum's collective is blamed on, before it is put in words.

    Attributes:
        reason, array, index: the :class:`Cause` fields (for a partial sum, ``index`` holds
            every contracted index to blame, in order).
        spec: the layout the sentence names: the blamed operand's, or (gather-output) the
            output's as the computation produces it.
        requested: the output's layout as requested, where the sentence names it.
        rank: the number of dimensions of the array whose layout is named.
        scattered: an all-reduce whose output is split on its axes (a slice follows it).
        other: ``(array, index)`` that the gathered axes also split, where there is one.
    """

    reason: Reason
    array: str | None = None
    index: str | None = None
    spec: Spec | None = None
    requested: Spec | None = None
    rank: int = 0
    scattered: bool = False
    other: tuple[str, str] | None = None


def _partial_sum(plan: Plan, c: Collective) -> _Decision | None:
    """A sum over contracted indices split on all of ``c``'s axes, if that is what ``c`` is."""
    axes = c.mesh_axes
    contracted = {
        a: i
        for a, pairs in ((a, _axis_owner(plan, a)) for a in axes)
        for _, i in pairs
        if i in plan.op.contracted
    }
    if not (axes and all(a in contracted for a in axes)):
        return None
    indices = "".join(dict.fromkeys(contracted[a] for a in axes))
    scattered = c.kind == "all-reduce" and bool(set(plan.out_spec.axes) & set(axes))
    return _Decision("partial-sum", None, indices, scattered=scattered)


def _gather(plan: Plan, c: Collective) -> _Decision | None:
    """The operand gathered by all-gather ``c`` (the one whose gathered block matches ``c``'s
    shape, else its size; among those one that disagrees with the output's layout), else the
    output when the computation produces it split on ``c``'s axes."""
    axes = c.mesh_axes
    candidates = [k for k, spec in enumerate(plan.in_specs) if set(axes) & set(spec.axes)]

    def gathered(k: int) -> tuple[int, ...]:
        return _without(plan.in_specs[k], axes).shard_shape(plan.mesh, plan.shapes[k])

    exact = [k for k in candidates if gathered(k) == c.shape]
    sized = [k for k in candidates if _bytes(gathered(k), plan.dtype) == c.bytes]
    ranked = sorted(exact or sized, key=lambda k: not _disagrees(plan, k))
    if ranked:
        k = ranked[0]
        term, spec = plan.op.inputs[k], plan.in_specs[k]
        index = next(
            i for i, e in zip(term, spec.padded(len(term)), strict=True) if set(e) & set(axes)
        )
        others = [
            (n, i)
            for a in axes
            for n, i in _axis_owner(plan, a)
            if n != f"operand {k}" and i != index
        ]
        other = others[0] if others else None
        return _Decision(
            "gather-operand", f"operand {k}", index, spec, None, len(term), other=other
        )
    produced = default_out_spec(plan.op, plan.in_specs)
    rank = len(plan.op.output)
    if set(produced.axes) & set(axes) and produced.padded(rank) != plan.out_spec.padded(rank):
        return _Decision("gather-output", "output", None, produced, plan.out_spec, rank)
    return None  # (told from its kind: e.g. an intermediate of a 3-operand einsum gathered)


def _operands_agree(plan: Plan) -> bool:
    """Whether the operands can be multiplied as they are laid out: each index split alike
    wherever it appears, and no mesh axis splitting two indices."""
    seen: dict[str, tuple[str, ...]] = {}
    owner: dict[str, str] = {}
    for term, spec in zip(plan.op.inputs, plan.in_specs, strict=True):
        for index, e in zip(term, spec.padded(len(term)), strict=True):
            if seen.setdefault(index, e) != e or any(
                owner.setdefault(a, index) != index for a in e
            ):
                return False
    return True


def _relayout(plan: Plan, c: Collective) -> _Decision:
    """The operand moved by all-to-all or collective-permute ``c``, else the output: a
    permute where the operands agree moves the output the computation makes to the devices
    the requested layout puts it on (``n`` made on ``x``, asked for on ``y``)."""
    axes = c.mesh_axes
    rank = len(plan.op.output)
    produced = default_out_spec(plan.op, plan.in_specs)
    moved = produced.padded(rank) != plan.out_spec.padded(rank)
    if c.kind == "collective-permute" and moved and _operands_agree(plan):
        return _Decision("relayout", "output", None, produced, plan.out_spec, rank)
    users = [k for k, spec in enumerate(plan.in_specs) if set(axes) & set(spec.axes)]

    def moved_first(k: int) -> tuple[bool, bool]:
        shard = plan.in_specs[k].shard_shape(plan.mesh, plan.shapes[k])
        return (not _disagrees(plan, k), _bytes(shard, plan.dtype) != c.bytes)

    # an operand that disagrees with the output's layout is the one moved; else by size
    if users:
        k = min(users, key=moved_first)
        term, spec = plan.op.inputs[k], plan.in_specs[k]
        return _Decision("relayout", f"operand {k}", None, spec, None, len(term))
    return _Decision("relayout", "output", None, None, plan.out_spec, len(plan.op.output))


def _decide(plan: Plan, c: Collective) -> _Decision | None:
    """What collective ``c`` of einsum ``plan`` is blamed on; ``None`` when the plan does not
    tell."""
    if c.kind in ("all-reduce", "reduce-scatter"):
        return _partial_sum(plan, c)
    if c.kind == "all-gather":
        return _gather(plan, c)
    if c.kind in ("all-to-all", "collective-permute"):
        return _relayout(plan, c)
    return None


def _einsum_text(c: Collective, d: _Decision) -> str:
    """The sentence that says decision ``d`` about collective ``c``."""
    names = _axes(c.mesh_axes)
    where = _where(c.op_name, "")  # the source line would be shardwise's own lowering
    head = f"{c.kind} over `{names}`: "
    if d.reason == "partial-sum":
        indices = d.index or ""
        many = len(indices) > 1
        text = (
            f"{head}contracted {'indices' if many else 'index'} `{indices}` "
            f"{'are' if many else 'is'} sharded on `{names}`, so each device holds a partial sum"
        )
        if d.scattered:
            text += (
                "; XLA sums on every device, then each keeps its slice of the output (on CPU it "
                "emits all-reduce + slice where a reduce-scatter would do)"
            )
        return text
    layout = _layout(d.spec, d.rank) if d.spec is not None else ""
    requested = _layout(d.requested, d.rank) if d.requested is not None else ""
    if d.reason == "gather-operand":
        why = (
            f"; `{names}` also splits index `{d.other[1]}` of {d.other[0]}, and one "
            f"axis cannot split two indices of one computation"
            if d.other
            else f"; index `{d.index}` is not split on `{names}` where it meets the other operands"
        )
        return (
            f"{head}{d.array} is laid out {layout}, its index `{d.index}` split on `{names}`, "
            f"but the computation needs it replicated on `{names}`{why}"
        )
    split_again = d.requested is not None and set(c.mesh_axes) <= set(d.requested.axes)
    if d.reason == "gather-output" and split_again:
        return (
            f"{head}the computation produces the output split {layout} and it is requested "
            f"split {requested}: XLA gathers the pieces along `{names}`, then each device "
            "keeps its slice of the requested layout"
        )
    if d.reason == "gather-output":
        return (
            f"{head}the computation produces the output split {layout} but it is requested "
            f"as {requested}, so the pieces are gathered"
        )
    if d.array == "output" and d.spec is not None:
        return (
            f"{head}the computation produces the output split {layout}, but it is requested "
            f"as {requested}, so the computed blocks are moved to the devices that own them"
            f"{where}"
        )
    if d.array == "output":
        return (
            f"{head}the output is requested as {requested}, so the computed blocks are moved "
            f"to the devices that own them{where}"
        )
    return (
        f"{head}{d.array} is laid out {layout}, which does not line up with the other arrays "
        f"on `{names}`, so its blocks are moved{where}"
    )


def einsum_cause(plan: Plan, c: Collective) -> Cause:
    """The cause of collective ``c`` in the compiled program of einsum ``plan``."""
    d = _decide(plan, c)
    if d is None:
        return generic_cause(c, with_source=False)
    return Cause(d.reason, _einsum_text(c, d), d.array, d.index)
