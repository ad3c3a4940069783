"""How each JAX primitive the program planner reads carries layouts: which ops are
elementwise, which reduce, the einsum a ``dot_general`` computes, and the map from an
operand's dimensions to its result's for transposes, broadcasts, reshapes, reductions and
slices. Pure: no tracing, no devices.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import Any, TypeAlias

import jax
import jax.extend.core as jcore
from jax._src import source_info_util

from shardwise._errors import ArgumentTypeError
from shardwise._model.op import Op

ELEMENTWISE = frozenset(
    """
    abs acos acosh add add_any and asin asinh atan atan2 atanh cbrt ceil clamp conj copy copy_p
    convert_element_type cos cosh digamma div eq erf erf_inv erfc exp exp2 expm1 floor ge gt
    igamma imag integer_pow is_finite le lgamma log log1p logistic lt max min mul ne neg nextafter
    not or pow real reduce_precision rem round rsqrt select_n sign sin sinh sqrt square
    stop_gradient sub tan tanh xor
    """.split()  # noqa: SIM905
)
REDUCTIONS = frozenset(
    """
    reduce_sum reduce_max reduce_min reduce_prod reduce_and reduce_or
    """.split()  # noqa: SIM905
)
"""Reductions whose partial results along a split dimension an all-reduce combines."""


def dot_op(dimension_numbers: Any, lhs_rank: int, rhs_rank: int) -> Op:
    """The einsum a ``dot_general`` computes: output is batch, then lhs free, then rhs free.

    >>> dot_op((([1], [0]), ([], [])), 2, 2).equation
    'ab,bc->ac'
    >>> dot_op((([2], [1]), ([0], [0])), 3, 3).equation
    'abc,acd->abd'
    """
    (lc, rc), (lb, rb) = dimension_numbers
    letters = iter("abcdefghijklmnopqrstuvwxyz")
    lhs = [next(letters) for _ in range(lhs_rank)]
    rhs = ["" for _ in range(rhs_rank)]
    for i, j in itertools.chain(zip(lc, rc, strict=True), zip(lb, rb, strict=True)):
        rhs[j] = lhs[i]
    rhs = [r or next(letters) for r in rhs]
    out = [lhs[i] for i in lb]
    out += [lhs[i] for i in range(lhs_rank) if i not in lc and i not in lb]
    out += [rhs[j] for j in range(rhs_rank) if j not in rc and j not in rb]
    return Op(("".join(lhs), "".join(rhs)), "".join(out))


MapParts: TypeAlias = tuple[tuple[int | None, ...], tuple[int, ...], tuple[int, ...]]


def layout_map(
    prim: str, params: Any, in_shape: tuple[int, ...], out_shape: tuple[int, ...]
) -> MapParts | None:
    rank = len(in_shape)
    ident = tuple(range(rank))
    if prim == "transpose":
        return tuple(params["permutation"]), (), ()
    if prim == "broadcast_in_dim":
        dims = params["broadcast_dimensions"]
        dim_map: list[int | None] = [None] * len(out_shape)
        for i, d in enumerate(dims):
            if in_shape[i] == out_shape[d]:
                dim_map[d] = i
        return (
            tuple(dim_map),
            tuple(i for i, d in enumerate(dims) if in_shape[i] != out_shape[d]),
            (),
        )
    if prim in REDUCTIONS or prim in ("argmax", "argmin"):
        axes = tuple(params["axes"])
        kept = tuple(i for i in ident if i not in axes)
        return (kept, (), axes) if prim in REDUCTIONS else (kept, axes, ())
    if prim == "squeeze":
        return tuple(i for i in ident if i not in params["dimensions"]), (), ()
    if prim == "reshape":
        return reshape_map(in_shape, out_shape)
    if prim in ("cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp"):
        return ident, (params["axis"],), ()
    if (
        prim in ("slice", "pad", "rev", "dynamic_slice", "sort")
        and out_shape
        and rank == len(out_shape)
    ):
        if prim == "rev":
            return ident, tuple(params["dimensions"]), ()
        if prim == "sort":
            return ident, (params["dimension"],), ()
        return ident, tuple(i for i in ident if in_shape[i] != out_shape[i]), ()
    return None


def reshape_map(in_shape: Sequence[int], out_shape: Sequence[int]) -> MapParts:
    """A reshape as a map: each group of dimensions that merge or split carries its major
    (first) dimension's layout to the result's major dimension of the group; the others must
    be whole on each device.

    >>> reshape_map((8, 4, 6), (32, 6))
    ((0, 2), (1,), ())
    >>> reshape_map((32, 6), (8, 4, 6))
    ((0, None, 1), (), ())
    """
    dim_map: list[int | None] = [None] * len(out_shape)
    local: list[int] = []
    for ins, outs in _groups(in_shape, out_shape):
        big_in = [i for i in ins if in_shape[i] > 1]
        big_out = [o for o in outs if out_shape[o] > 1]
        if big_in and big_out:
            dim_map[big_out[0]] = big_in[0]
            local.extend(big_in[1:])
    return tuple(dim_map), tuple(local), ()


def _groups(a: Sequence[int], b: Sequence[int]) -> Iterator[tuple[list[int], list[int]]]:
    i = j = 0
    while i < len(a) or j < len(b):
        gi, gj = [i] if i < len(a) else [], [j] if j < len(b) else []
        pa = a[i] if i < len(a) else 1
        pb = b[j] if j < len(b) else 1
        i, j = i + bool(gi), j + bool(gj)
        while pa != pb and (i < len(a) or j < len(b)):
            if (pa < pb and i < len(a)) or j >= len(b):
                pa *= a[i]
                gi.append(i)
                i += 1
            else:
                pb *= b[j]
                gj.append(j)
                j += 1
        yield gi, gj


INLINED = {
    "pjit": "jaxpr",
    "jit": "jaxpr",
    "closed_call": "call_jaxpr",
    "remat": "jaxpr",
    "checkpoint": "jaxpr",
    "custom_jvp_call": "call_jaxpr",
    "custom_vjp_call": "call_jaxpr",
    "custom_vjp_call_jaxpr": "fun_jaxpr",
}


def is_var(v: Any) -> bool:
    return not isinstance(v, jcore.Literal) and not isinstance(v, jcore.DropVar)


def source_of(eqn: Any) -> str:
    """``file:line`` of the user's code that made ``eqn`` (``""`` where none is known)."""
    frame = source_info_util.user_frame(eqn.source_info.traceback)
    if frame is None:
        return ""
    return f"{frame.file_name.rsplit('/', 1)[-1]}:{frame.start_line}"


def named(prim: str, source: str) -> str:
    """An intermediate's name: the op that makes it and where (``dot_general@model.py:12``)."""
    return f"{prim}@{source}" if source else prim


def abstract(x: Any) -> jax.ShapeDtypeStruct:
    """An argument leaf as a ``jax.ShapeDtypeStruct``; anything but an array is refused."""
    if isinstance(x, jax.ShapeDtypeStruct):
        return x
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return jax.ShapeDtypeStruct(tuple(x.shape), x.dtype)
    raise ArgumentTypeError(
        f"an argument leaf is {type(x).__name__} {x!r:.60}, not an array; plan takes arrays or "
        "jax.ShapeDtypeStruct leaves, e.g. jax.ShapeDtypeStruct((256, 1024), 'float32')."
    )
