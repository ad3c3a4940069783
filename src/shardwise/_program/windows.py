"""Convolutions, gathers and scatters read as einsums, some of whose indices stay whole on each
device: the planner splits them as it splits a dot's, by the same enumerator
(:func:`~shardwise._program.steps.dot_strategies`).

- ``conv_general_dilated``: ``n`` the batch, ``c`` the input features, ``o`` the output
  features, and the spatial dimensions, which stay whole (a split one would need a halo
  exchange with the neighbouring devices, which is not modelled):
  ``nhwc,ijco->nhwo`` for an NHWC image and an HWIO kernel. The batch splits with no
  communication (data parallelism), the output features with the kernel's (column parallel),
  the input features on both operands leave partial sums that are all-reduced. The transposes
  JAX's autodiff emits for a convolution's gradients are convolutions too, read the same way:
  the kernel's gradient sums over the batch (a batch-split forward pass gives it partial sums,
  as a dot's weight gradient). A grouped convolution splits only its batch; one with batch
  groups is not read (planned whole).
- ``gather`` of whole rows (``jnp.take(table, ids, axis=0)``, ``table[ids]``,
  ``take_along_axis``): the table's dimensions taken whole carry their layout to the result
  (the embedding dimension), the indices' to theirs (the batch); a split indexed dimension
  (the vocabulary) leaves each device a masked lookup of its rows, summed by an all-reduce.
- ``scatter-add`` of whole rows (a gather's gradient): the same letters the other way round;
  a split batch leaves partial sums, a split vocabulary a masked scatter into each device's
  rows.
- ``select_and_scatter_add`` (a max pool's gradient): the windowed dimensions whole, the others
  (batch, channels) carried.
- ``scatter`` overwriting whole rows: as ``scatter-add``, its updates' scattered dimensions
  whole.
- ``concatenate``: the joined dimension whole, the others carried from every operand;
  ``dynamic_update_slice`` likewise, the dimensions it writes part of whole.

Pure: no tracing, no devices.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shardwise._model.op import Op

Shape = tuple[int, ...]
LETTERS = "abcdefghijklmnopqrstuvwxyz"


@dataclass(frozen=True, slots=True)
class Reading:
    """An op read as an einsum.

    Attributes:
        op: the einsum: a term per operand the op reads (in order), and its result's; a letter
            of the result may be in no operand (a scatter's rows, where it scatters into
            zeros).
        whole: the letters that must stay whole on each device.
        flops: the op's FLOPs, whole (``0``: it is bound by the bytes it moves).
    """

    op: Op
    whole: str
    flops: float = 0.0


class _Letters:
    """Fresh letters, the preferred one where it is still free."""

    def __init__(self) -> None:
        self.used: set[str] = set()

    def __call__(self, want: str = "") -> str:
        for letter in want + LETTERS:
            if letter not in self.used:
                self.used.add(letter)
                return letter
        raise ValueError("more than 26 dimensions")


def _spatial(spec: Sequence[int]) -> Iterator[int]:
    yield from spec[2:]


def conv(p: Mapping[str, Any], shapes: Sequence[Shape | None], out: Shape) -> Reading | None:
    """A ``conv_general_dilated`` read as an einsum (``None``: one with batch groups, or
    more than three spatial dimensions).

    >>> from jax import lax
    >>> dn = lax.conv_dimension_numbers((8, 16, 16, 4), (3, 3, 4, 6), ("NHWC", "HWIO", "NHWC"))
    >>> p = dict(dimension_numbers=dn, feature_group_count=1, batch_group_count=1,
    ...          window_strides=(1, 1), padding=((1, 1), (1, 1)), lhs_dilation=(1, 1),
    ...          rhs_dilation=(1, 1))
    >>> r = conv(p, [(8, 16, 16, 4), (3, 3, 4, 6)], (8, 16, 16, 6))
    >>> r.op.equation, r.whole, r.flops == 2 * 8 * 6 * 4 * (3 * 16 - 2) ** 2
    ('nhwc,ijco->nhwo', 'hwij', True)
    """
    if len(shapes) != 2 or shapes[0] is None or shapes[1] is None:
        return None
    lhs_shape, rhs_shape = shapes[0], shapes[1]
    dn = p["dimension_numbers"]
    lhs_spec, rhs_spec, out_spec = dn.lhs_spec, dn.rhs_spec, dn.out_spec
    if p["batch_group_count"] != 1 or len(lhs_spec) > 5:
        return None
    grouped = p["feature_group_count"] != 1
    fresh = _Letters()
    lhs, rhs, res = [""] * len(lhs_shape), [""] * len(rhs_shape), [""] * len(out)
    lhs[lhs_spec[0]] = res[out_spec[0]] = fresh("n")
    lhs[lhs_spec[1]] = fresh("c")
    rhs[rhs_spec[1]] = fresh("g") if grouped else lhs[lhs_spec[1]]
    rhs[rhs_spec[0]] = res[out_spec[1]] = fresh("o")
    whole = []
    for a, b in zip(_spatial(lhs_spec), _spatial(out_spec), strict=True):
        lhs[a] = res[b] = fresh("hwd")
        whole.append(lhs[a])
    for k in _spatial(rhs_spec):
        rhs[k] = fresh("ijk")
        whole.append(rhs[k])
    if grouped:  # only the batch splits
        whole += [lhs[lhs_spec[1]], rhs[rhs_spec[1]], rhs[rhs_spec[0]]]
    op = Op(("".join(lhs), "".join(rhs)), "".join(res))
    return Reading(op, "".join(whole), conv_flops(p, lhs_shape, rhs_shape, out))


def conv_flops(p: Mapping[str, Any], lhs: Shape, rhs: Shape, out: Shape) -> float:
    """A convolution's FLOPs as XLA counts them (``HloCostAnalysis``): two per multiply-add,
    one multiply-add per input feature (of a group), output element and kernel tap that
    falls on the input (not on its padding, nor between the points of a dilated input)."""
    dn = p["dimension_numbers"]
    taps = 1
    for k, (a, b, r) in enumerate(
        zip(_spatial(dn.lhs_spec), _spatial(dn.out_spec), _spatial(dn.rhs_spec), strict=True)
    ):
        taps *= _valid_taps(
            lhs[a],
            out[b],
            rhs[r],
            p["window_strides"][k],
            p["padding"][k][0],
            p["lhs_dilation"][k],
            p["rhs_dilation"][k],
        )
    features = lhs[dn.lhs_spec[1]] // int(p["feature_group_count"])
    return float(2 * out[dn.out_spec[0]] * out[dn.out_spec[1]] * features * taps)


def _valid_taps(
    size: int, out: int, window: int, stride: int, low: int, base: int, dilation: int
) -> int:
    """How many (output position, kernel tap) pairs of one spatial dimension read the input."""
    count = 0
    for o in range(out):
        for w in range(window):
            at = o * stride - low + w * dilation
            if at % base == 0 and 0 <= at // base < size:
                count += 1
    return count


def gather(p: Mapping[str, Any], shapes: Sequence[Shape | None], out: Shape) -> Reading | None:
    """A ``gather`` of whole rows read as an einsum (``None``: one that slices a dimension it
    does not index, or indexes one it keeps).

    >>> from jax.lax import GatherDimensionNumbers as G
    >>> dn = G(offset_dims=(2,), collapsed_slice_dims=(0,), start_index_map=(0,),
    ...        operand_batching_dims=(), start_indices_batching_dims=())
    >>> r = gather(dict(dimension_numbers=dn, slice_sizes=(1, 16)), [(100, 16), (8, 5, 1)],
    ...            (8, 5, 16))
    >>> r.op.equation, r.whole
    ('ve,nsz->nse', 'z')
    >>> dn = G(offset_dims=(0, 1), collapsed_slice_dims=(2,), start_index_map=(2,),
    ...        operand_batching_dims=(), start_indices_batching_dims=())
    >>> r = gather(dict(dimension_numbers=dn, slice_sizes=(8, 16, 1)), [(8, 16, 1), None],
    ...            (8, 16))
    >>> r.op.equation, r.whole
    ('efv->ef', '')
    """
    if len(shapes) != 2 or shapes[0] is None:
        return None
    table, indices = shapes[0], shapes[1]
    dn, sizes = p["dimension_numbers"], p["slice_sizes"]
    if indices is None:  # a constant index, made on each device (``x[..., 0]``)
        picked = [out[d] for d in range(len(out)) if d not in dn.offset_dims]
        indices = (*picked, len(dn.start_index_map))
    fresh = _Letters()
    tab, idx, res = [""] * len(table), [""] * len(indices), [""] * len(out)
    picked = [d for d in range(len(out)) if d not in dn.offset_dims]
    for k, d in enumerate(picked):
        idx[k] = res[d] = fresh("nsl")
    idx[-1] = fresh("z")
    whole = [idx[-1]]
    for t, i in zip(dn.operand_batching_dims, dn.start_indices_batching_dims, strict=True):
        tab[t] = idx[i]
    for d in dn.collapsed_slice_dims:
        tab[d] = fresh("vu")
        if sizes[d] != 1:
            return None
        if d not in dn.start_index_map:
            whole.append(tab[d])
    kept = [d for d in range(len(table)) if not tab[d]]
    for d, o in zip(kept, dn.offset_dims, strict=True):
        if sizes[d] != table[d] or d in dn.start_index_map:
            return None
        tab[d] = res[o] = fresh("efg")
    if shapes[1] is None:  # the result's dimensions from the index are made whole
        whole = [i for i in idx if i in res]
        return Reading(Op(("".join(tab),), "".join(res)), "".join(whole))
    return Reading(Op(("".join(tab), "".join(idx)), "".join(res)), "".join(whole))


def scatter_add(p: Mapping[str, Any], shapes: Sequence[Shape | None], out: Shape) -> Reading | None:
    """A ``scatter-add`` of whole rows read as an einsum; its operand (zeros) and its updates
    (a broadcast cotangent) may be made on each device, not arrays of the program: then the
    result's rows are in no operand, and the updates' window whole.

    >>> from jax.lax import ScatterDimensionNumbers as D
    >>> dn = D(update_window_dims=(2,), inserted_window_dims=(0,),
    ...        scatter_dims_to_operand_dims=(0,), operand_batching_dims=(),
    ...        scatter_indices_batching_dims=())
    >>> r = scatter_add(dict(dimension_numbers=dn), [None, (8, 5, 1), (8, 5, 16)], (100, 16))
    >>> r.op.equation, r.whole
    ('nsz,nse->ve', 'z')
    """
    if len(shapes) != 3 or shapes[1] is None:
        return None
    indices, updates = shapes[1], shapes[2]
    dn = p["dimension_numbers"]
    fresh = _Letters()
    rank = len(dn.update_window_dims) + len(indices) - 1
    idx, upd, res = [""] * len(indices), [""] * rank, [""] * len(out)
    scattered = [d for d in range(rank) if d not in dn.update_window_dims]
    for k, d in enumerate(scattered):
        idx[k] = upd[d] = fresh("nsl")
    idx[-1] = fresh("z")
    whole = [idx[-1]]
    for o, i in zip(dn.operand_batching_dims, dn.scatter_indices_batching_dims, strict=True):
        res[o] = idx[i]
    for d in dn.inserted_window_dims:
        res[d] = fresh("vu")
        if d not in dn.scatter_dims_to_operand_dims:
            whole.append(res[d])
    kept = [d for d in range(len(out)) if not res[d]]
    for d, w in zip(kept, dn.update_window_dims, strict=True):
        if (updates is not None and updates[w] != out[d]) or d in dn.scatter_dims_to_operand_dims:
            return None
        res[d] = upd[w] = fresh("efg")
        if updates is None:  # made on each device, of a size not known here
            whole.append(res[d])
    terms = ["".join(res)] if shapes[0] is not None else []
    terms += ["".join(idx)] + (["".join(upd)] if updates is not None else [])
    return Reading(Op(tuple(terms), "".join(res)), "".join(whole))


def concatenate(p: Mapping[str, Any], shapes: Sequence[Shape | None], out: Shape) -> Reading | None:
    """A ``concatenate`` read as an einsum: every dimension but the joined one carries its
    layout from the operands (split alike) to the result; the joined one, whose parts are in
    different operands, stays whole on each device (``jnp.concatenate([-x2, x1], -1)``, the
    rotation of rotary embeddings, keeps the batch and heads split). An operand made on each
    device (a constant) is not read.

    >>> r = concatenate(dict(dimension=1), [(8, 3), (8, 5)], (8, 8))
    >>> r.op.equation, r.whole
    ('ab,ac->ad', 'bcd')
    """
    joined = p["dimension"]
    fresh = _Letters()
    kept = {d: fresh() for d in range(len(out)) if d != joined}
    terms, whole = [], []
    for shape in shapes:
        if shape is not None:
            whole.append(fresh())
            terms.append("".join(kept.get(d) or whole[-1] for d in range(len(out))))
    whole.append(fresh())
    if not terms:
        return None
    result = "".join(kept.get(d) or whole[-1] for d in range(len(out)))
    return Reading(Op(tuple(terms), result), "".join(whole))


def scatter(p: Mapping[str, Any], shapes: Sequence[Shape | None], out: Shape) -> Reading | None:
    """A ``scatter`` that overwrites whole rows (``x.at[ids].set(rows)``), read as
    :func:`scatter_add` reads an added one, but for the updates' scattered dimensions, which
    stay whole: overwrites from two devices cannot be summed. The rows' other dimensions
    carry their layout, and a split indexed dimension is written masked on each device.

    >>> from jax.lax import ScatterDimensionNumbers as D
    >>> dn = D(update_window_dims=(1,), inserted_window_dims=(0,),
    ...        scatter_dims_to_operand_dims=(0,), operand_batching_dims=(),
    ...        scatter_indices_batching_dims=())
    >>> r = scatter(dict(dimension_numbers=dn), [(16, 8), (2, 1), (2, 8)], (16, 8))
    >>> r.op.equation, r.whole
    ('ve,nz,ne->ve', 'zn')
    """
    added = scatter_add(p, shapes, out)
    if added is None or shapes[0] is None or shapes[2] is None:
        return None
    indices = added.op.inputs[1]
    whole = added.whole + "".join(i for i in indices if i not in added.whole)
    return Reading(added.op, whole)


def update_slice(
    p: Mapping[str, Any], shapes: Sequence[Shape | None], out: Shape
) -> Reading | None:
    """A ``dynamic_update_slice`` read as an einsum: the dimensions the update spans whole
    carry their layout from the operand and the update to the result; those it writes part
    of, at an index known only when it runs, stay whole on each device (a KV cache written a
    step at a time keeps its batch and heads split).

    >>> r = update_slice({}, [(8, 128, 4), (8, 1, 4), (), (), ()], (8, 128, 4))
    >>> r.op.equation, r.whole
    ('acb,adb->acb', 'cd')
    """
    if len(shapes) < 2 or shapes[0] is None or shapes[1] is None:
        return None
    operand, update = shapes[0], shapes[1]
    fresh = _Letters()
    kept = {d: fresh() for d in range(len(out)) if operand[d] == update[d]}
    held = {d: fresh() for d in range(len(out)) if d not in kept}
    written = {d: fresh() for d in range(len(out)) if d not in kept}
    dest = "".join(kept.get(d) or held[d] for d in range(len(out)))
    part = "".join(kept.get(d) or written[d] for d in range(len(out)))
    return Reading(Op((dest, part), dest), "".join([*held.values(), *written.values()]))


def windowed(p: Mapping[str, Any], rank: int) -> tuple[int, ...]:
    """The dimensions a windowed op (a pooling, its gradient) reads more than one element of,
    or pads, strides or dilates: they must be whole on each device."""
    ones = (1,) * rank
    zeros = ((0, 0),) * rank
    return tuple(
        d
        for d in range(rank)
        if p["window_dimensions"][d] != 1
        or p["window_strides"][d] != 1
        or tuple(p.get("padding", zeros)[d]) != (0, 0)
        or p.get("base_dilation", ones)[d] != 1
    )


def select_and_scatter_add(
    p: Mapping[str, Any], shapes: Sequence[Shape | None], out: Shape
) -> Reading | None:
    """A max pool's gradient (its cotangent scattered to where each window's maximum was)
    read as an einsum: the windowed dimensions whole, the others carried.

    >>> p = dict(window_dimensions=(1, 2, 2, 1), window_strides=(1, 2, 2, 1),
    ...          padding=((0, 0),) * 4)
    >>> select_and_scatter_add(p, [(4, 4, 4, 3), (4, 8, 8, 3)], (4, 8, 8, 3)).op.equation
    'nhwc,nijc->nijc'
    """
    if len(shapes) != 2 or shapes[0] is None or shapes[1] is None:
        return None
    rank = len(out)
    local = set(windowed(p, rank))
    fresh = _Letters()
    kept = {d: fresh("nc") for d in range(rank) if d not in local}
    source = "".join(kept.get(d) or fresh("hwd") for d in range(rank))
    operand = "".join(kept.get(d) or fresh("ijk") for d in range(rank))
    whole = "".join(c for d, c in enumerate(source + operand) if d % rank in local)
    return Reading(Op((source, operand), operand), whole)


def bytes_read(prim: str, held: Sequence[int], out: int) -> int:
    """Bytes one device's part of an op read as an einsum reads and writes: ``held`` its
    operands' blocks, ``out`` its result's. A gather reads only the rows it takes (a result's
    worth), not its whole table; with a constant index, a result's worth of it."""
    if prim == "gather":
        return (held[1] if len(held) > 1 else 0) + 2 * out
    return sum(held) + out
