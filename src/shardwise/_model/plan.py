"""A validated einsum plan: equation, mesh, shapes and per-operand specs, checked up front.

Building a :class:`Plan` is pure: it needs no devices. It knows every operand's
shard shape and refuses, with an actionable error, any layout that cannot work.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from shardwise._errors import (
    UNSET,
    ArgumentError,
    ArgumentTypeError,
    ShapeError,
    SpecError,
    Unset,
    renamed_argument,
)
from shardwise._model.mesh import MeshSpec
from shardwise._model.op import MAX_DIMENSION, Op, as_shapes
from shardwise._model.spec import Layout, LayoutLike, Spec, SpecLike

Mode: TypeAlias = Literal["auto", "manual"]
MODES: tuple[Mode, ...] = ("auto", "manual")

MAX_PROGRAM_BYTES = 2**62
"""The most bytes the operands and the output of one einsum may hold together. XLA counts an
array's bytes, and sums them over a program, in 64-bit integers: an operand of 2**63 bytes or
more aborts the process in XLA (which Python cannot catch), and two operands of 2**62 bytes
make its memory statistics negative. Half of the 64-bit range is kept for the temporaries XLA
adds (an int8 einsum whose operands are just under 2**63 bytes aborts in its buffer assignment)."""


def check_extent(op: Op, shapes: Sequence[Sequence[int]], dtype: Any) -> None:
    """Refuse shapes whose operands and output together exceed :data:`MAX_PROGRAM_BYTES`.

    >>> check_extent(Op.parse("ij,jk->ik"), [(2**30, 2**30)] * 2, "float32")
    Traceback (most recent call last):
    shardwise._errors.ShapeError: the operands and output of 'ij,jk->ik' ... hold 13,835,058,...
    """
    out_shape = op.output_shape(shapes)
    elements = sum(math.prod(s) for s in (*shapes, out_shape))
    total = elements * jnp.dtype(dtype).itemsize
    if total > MAX_PROGRAM_BYTES:
        shown = ", ".join(str(tuple(s)) for s in shapes)
        raise ShapeError(
            f"the operands and output of {op.equation!r} (shapes {shown} → {out_shape}, "
            f"{jnp.dtype(dtype).name}) hold {total:,} bytes together, more than one program "
            f"can address: XLA counts bytes in 64-bit integers, and shardwise keeps a program "
            f"under {MAX_PROGRAM_BYTES:,} bytes (2**62) so that XLA's sums cannot overflow. "
            "Use smaller shapes, or shardwise.stream to run the einsum a chunk at a time."
        )


def check_program_extent(arrays: Sequence[tuple[str, tuple[int, ...], str]], name: str) -> None:
    """Refuse a program whose sizes XLA cannot count: of its ``arrays`` (name, shape, dtype),
    a dimension outside 0 to :data:`~shardwise._model.op.MAX_DIMENSION`, or more than
    :data:`MAX_PROGRAM_BYTES` together (as an einsum's operands and output may not).

    >>> check_program_extent([("x", (2**61,), "float32")], "f")
    Traceback (most recent call last):
    shardwise._errors.ShapeError: the arrays of f hold 9,223,372,036,854,775,808 bytes ...
    """
    for label, shape, _ in arrays:
        if any(not 0 <= n <= MAX_DIMENSION for n in shape):
            raise ShapeError(
                f"{label or 'an array'} of {name} has the shape {shape}; sizes run from 0 to "
                f"{MAX_DIMENSION:,} (2**63 - 1, the largest dimension XLA can represent). Give "
                "smaller shapes."
            )
    sizes = [math.prod(shape) * jnp.dtype(dtype).itemsize for _, shape, dtype in arrays]
    if sum(sizes) > MAX_PROGRAM_BYTES:
        big = max(range(len(arrays)), key=sizes.__getitem__)
        label, shape, dtype = arrays[big]
        raise ShapeError(
            f"the arrays of {name} hold {sum(sizes):,} bytes together (the largest, "
            f"{label or 'an intermediate'} {dtype}{list(shape)}, {sizes[big]:,}), more than "
            "one program can address: XLA counts bytes in 64-bit integers, and shardwise "
            f"keeps a program under {MAX_PROGRAM_BYTES:,} bytes (2**62) so that XLA's sums "
            "cannot overflow. Give smaller shapes."
        )


def _operand_specs(op: Op, in_specs: Any) -> tuple[Spec, ...]:
    """One spec per operand from ``in_specs`` (a list or tuple of specs, or ``None``; for an
    einsum of one operand, its one spec too)."""
    raw = in_specs if in_specs is not None else [None] * len(op.inputs)
    one = isinstance(raw, str | PartitionSpec | Spec)
    if one and len(op.inputs) == 1:
        raw = [raw]
        one = False
    if one or not isinstance(raw, Sequence):
        what = f"the single spec {raw!r}" if one else f"{type(raw).__name__} {raw!r}"
        raise ArgumentTypeError(
            f"in_specs is {what}; give a list with one spec per operand of {op.equation!r} "
            f"({len(op.inputs)} operand{'s' if len(op.inputs) != 1 else ''}), e.g. "
            f"in_specs=[{', '.join(['None'] * len(op.inputs))}] (None for replicated)."
        )
    if len(raw) != len(op.inputs):
        raise ArgumentTypeError(
            f"equation {op.equation!r} has {len(op.inputs)} operands but {len(raw)} in_specs "
            "were given; give one spec per operand (None for replicated)."
        )
    return tuple(Spec.parse(s, f"the spec of operand {k}") for k, s in enumerate(raw))


@dataclass(frozen=True, slots=True)
class ArrayInfo:
    """One operand or the output: global shape, dtype, spec, the block each device holds, and
    its name in the user's code (``params['w1']``) where it has one."""

    shape: tuple[int, ...]
    dtype: str
    spec: Spec
    shard_shape: tuple[int, ...]
    name: str = ""

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name or None,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "spec": self.spec.to_json(len(self.shape)),
            "shard_shape": list(self.shard_shape),
        }


def layout_from_specs(op: Op, specs: Sequence[Spec]) -> Layout:
    """The one index layout that per-operand specs agree on.

    Raises:
        SpecError: when one index is split differently in two operands.
    """
    found: dict[str, tuple[tuple[str, ...], int]] = {}
    for k, (term, spec) in enumerate(zip(op.inputs, specs, strict=True)):
        for index, entry in zip(term, spec.padded(len(term)), strict=True):
            if index in found and found[index][0] != entry:
                prev, j = found[index]
                raise SpecError(
                    f"index {index!r} of {op.equation!r} is split over "
                    f"{_axes_text(prev)} in operand {j} but over {_axes_text(entry)} in operand "
                    f"{k}. Manual mode computes each device's block locally, so every operand must "
                    "split an index the same way: make the specs agree, or use mode='auto' and "
                    "let XLA move the data."
                )
            found.setdefault(index, (entry, k))
    owner: dict[str, tuple[str, int]] = {}
    for index, (entry, k) in sorted(found.items()):
        for axis in entry:
            if axis in owner:
                other, j = owner[axis]
                raise SpecError(
                    f"mesh axis {axis!r} splits index {other!r} of {op.equation!r} in operand "
                    f"{j} and index {index!r} in operand {k}. Manual mode computes each "
                    "device's block locally, so a mesh axis can split only one index across "
                    "all operands: split one of them over another axis, or use mode='auto' and "
                    "let XLA move the data."
                )
            owner[axis] = (index, k)
    return Layout(tuple(sorted((i, e) for i, (e, _) in found.items() if e)))


def _axes_text(entry: tuple[str, ...]) -> str:
    return "no mesh axis" if not entry else "mesh axes " + "×".join(entry)


def default_out_spec(op: Op, specs: Sequence[Spec]) -> Spec:
    """The output spec that keeps what the inputs split: each output index takes its axes from
    the first operand that has it, skipping axes already used; contracted axes are summed away."""
    used: set[str] = set()
    entries = []
    for index in op.output:
        entry: tuple[str, ...] = ()
        for term, spec in zip(op.inputs, specs, strict=True):
            if index in term:
                entry = spec.padded(len(term))[term.index(index)]
                break
        entry = tuple(a for a in entry if a not in used)
        used.update(entry)
        entries.append(entry)
    return Spec(tuple(entries)).canonical()


@dataclass(frozen=True, slots=True)
class Plan:
    """A sharded einsum, validated: what each device holds, before anything compiles.

    >>> plan = Plan.make("nd,nd->n", [(4000, 10000)] * 2, mesh="x=2,y=4",
    ...                  in_specs=["x,y", "x,y"], out_specs="x")
    >>> plan.operands[0].shard_shape, plan.output.shard_shape
    ((2000, 2500), (2000,))
    >>> plan.reduce_axes
    ('y',)
    """

    op: Op
    mesh: MeshSpec
    shapes: tuple[tuple[int, ...], ...]
    dtype: str
    in_specs: tuple[Spec, ...]
    out_spec: Spec
    mode: Mode

    @classmethod
    def make(
        cls,
        equation: str | Op,
        shapes: Sequence[Sequence[int]],
        *,
        mesh: MeshSpec | str | dict[str, int],
        dtype: str | np.dtype[np.generic] | type = "float32",
        layout: LayoutLike | None = None,
        in_specs: Sequence[SpecLike] | None = None,
        out_specs: SpecLike | Literal["infer"] = "infer",
        mode: str = "auto",
        out_spec: SpecLike | Literal["infer"] | Unset = UNSET,
    ) -> Plan:
        """Parse and validate everything; raise a :class:`ShardwiseError` naming the fix.
        ``out_spec`` is the deprecated old name of ``out_specs``."""
        out_specs = renamed_argument(
            "Plan.make", "out_specs", out_specs, "out_spec", out_spec, "infer"
        )
        op = equation if isinstance(equation, Op) else Op.parse(equation)
        mesh_spec = MeshSpec.parse(mesh)
        if mode not in MODES:
            raise ArgumentError(f"mode {mode!r} is not one of {', '.join(MODES)}.")
        shapes_t = as_shapes(shapes)
        sizes = op.sizes(shapes_t)
        try:
            dtype_name = jnp.dtype(dtype).name
        except TypeError:
            raise ArgumentTypeError(
                f"dtype {dtype!r} is not a NumPy dtype; use a name like float32 or bfloat16."
            ) from None
        check_extent(op, shapes_t, dtype_name)
        if layout is not None and in_specs is not None:
            raise ArgumentError(
                "give either layout= (one entry per index, e.g. 'n=x,d=y') or in_specs= (one "
                "spec per operand), not both."
            )
        if layout is not None:
            lay = Layout.parse(layout)
            unknown = [i for i, _ in lay.assignment if i not in op.indices]
            if unknown:
                raise SpecError(
                    f"layout {lay.describe()!r} names index {unknown[0]!r}, which is not in "
                    f"{op.equation!r}; its indices are {', '.join(op.indices)}."
                )
            specs = tuple(lay.spec_for(t) for t in op.inputs)
            out = lay.spec_for(op.output) if out_specs == "infer" else None
        else:
            specs, out = _operand_specs(op, in_specs), None
        if out is None:
            out = (
                default_out_spec(op, specs)
                if out_specs == "infer"
                else Spec.parse(out_specs, "the output spec")
            )
        for k, (term, spec, shape) in enumerate(zip(op.inputs, specs, shapes_t, strict=True)):
            spec.validate(mesh_spec, shape, f"operand {k} ({term!r}, shape {shape})")
        out_shape = tuple(sizes[i] for i in op.output)
        out.validate(mesh_spec, out_shape, f"the output ({op.output!r}, shape {out_shape})")
        if mode == "manual":
            layout_from_specs(op, specs)
        return cls(op, mesh_spec, shapes_t, dtype_name, specs, out, mode)

    @property
    def layout(self) -> Layout:
        """The index layout the operands agree on (manual mode requires one)."""
        return layout_from_specs(self.op, self.in_specs)

    @property
    def reduce_axes(self) -> tuple[str, ...]:
        """Mesh axes that split a contracted index: each device holds a partial sum over them."""
        split: set[str] = set()
        for term, spec in zip(self.op.inputs, self.in_specs, strict=True):
            for index, entry in zip(term, spec.padded(len(term)), strict=True):
                if index in self.op.contracted:
                    split.update(entry)
        return tuple(a for a in self.mesh.names if a in split)

    @property
    def empty(self) -> bool:
        """Whether any operand has a dimension of size 0 (then nothing is computed)."""
        return any(0 in shape for shape in self.shapes)

    @property
    def output_shape(self) -> tuple[int, ...]:
        return self.op.output_shape(self.shapes)

    @property
    def operands(self) -> tuple[ArrayInfo, ...]:
        return tuple(
            ArrayInfo(shape, self.dtype, spec, spec.shard_shape(self.mesh, shape))
            for shape, spec in zip(self.shapes, self.in_specs, strict=True)
        )

    def _repr_html_(self) -> str:
        """A table of arrays, specs and shard shapes for Jupyter (nothing is compiled)."""
        rows = [(f"operand {k}", info) for k, info in enumerate(self.operands)]
        rows.append(("output", self.output))
        body = "".join(
            f"<tr><td>{name}</td><td>{info.shape}</td><td>{info.dtype}</td>"
            f"<td>{html.escape(info.spec.describe())}</td><td>{info.shard_shape}</td></tr>"
            for name, info in rows
        )
        return (
            f'<div class="shardwise-plan"><b>{html.escape(self.op.equation)}</b> on mesh '
            f"{self.mesh.describe()} ({self.mode} mode)<table><tr><th>array</th><th>shape</th>"
            f"<th>dtype</th><th>spec</th><th>shard per device</th></tr>{body}</table></div>"
        )

    @property
    def output(self) -> ArrayInfo:
        shape = self.output_shape
        return ArrayInfo(
            shape, self.dtype, self.out_spec, self.out_spec.shard_shape(self.mesh, shape)
        )
