"""What each JAX primitive does to layouts: a registry of rules, one per primitive, as
``jax.experimental.roofline.register_roofline`` and DTensor's ``register_op_strategy`` keep
theirs.

A rule is one of:

- **elementwise**: its non-scalar operands and result share one layout;
- **map**: one operand, each of whose dimensions carries its layout to a dimension of the
  result (transpose, broadcast, reshape, reductions, slices, sorts), some needing to be whole
  on each device, reduced ones leaving partial sums (:data:`MapParts`);
- **dot**: ``dot_general``, the einsum it computes (:func:`dot_op`); and ops read as an einsum
  some of whose indices stay whole (:mod:`~shardwise._program.windows`): convolutions,
  gathers and scatter-adds of whole rows, a max pool's gradient;
- **call**: a call whose body is inlined (``jit``, ``custom_jvp``, ``custom_vjp``,
  ``checkpoint``);
- **scan**: ``lax.scan``, whose body is read once and repeated;
- **cond**: ``lax.cond`` and ``lax.switch``, each of whose branches is read as a call's body
  (XLA partitions a conditional's branches, its operands in their own layouts);
- **constant**: made on each device from its parameters alone (``iota``);
- **opaque**: planned whole: its operands gathered, the op run on each device, its cost the
  bytes it reads and writes.

A primitive with no rule is planned as an opaque one and costed alike, and its plan's report
names it "not modelled" (:func:`rule_of`). Pure: no tracing, no devices.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from shardwise._model.op import Op
from shardwise._program import windows
from shardwise._program.windows import Reading

Kind: TypeAlias = Literal["elementwise", "map", "dot", "call", "scan", "cond", "constant", "opaque"]
MapParts: TypeAlias = tuple[tuple[int | None, ...], tuple[int, ...], tuple[int, ...]]
"""A map: the operand dimension each result dimension carries (``None``: a new one), the
operand dimensions that must be whole on each device, and those summed away."""
Shape: TypeAlias = tuple[int, ...]
LayoutMap: TypeAlias = Callable[[Mapping[str, Any], Shape, Shape], "MapParts | None"]
Reader: TypeAlias = Callable[[Mapping[str, Any], Sequence[Shape | None], Shape], Reading | None]


@dataclass(frozen=True, slots=True)
class Rule:
    """How the planner reads one primitive.

    Attributes:
        kind: what it does to layouts (the module's list).
        layout: a map's :data:`MapParts` from its params and the operand's and result's
            shapes (``None`` where those shapes make it no map: it is planned opaque).
        callee: a call's param that holds the body to inline.
        einsum: a dot's einsum (:class:`~shardwise._program.windows.Reading`), from its
            params, its operands' shapes (``None`` for one that is not an array of the
            program: a constant) and its result's (``None`` where it has none: it is planned
            opaque).
        modelled: ``False`` for the rule of a primitive that has none, and of an opaque one
            whose time its bytes do not tell (linear algebra, FFTs, while loops):
            the report names them "not modelled".
        placement: a layout the user's code asks for (``with_sharding_constraint``,
            ``reshard``, ``device_put``): planned as elementwise, and when a plan runs, the
            plan's layout stands in its place.
    """

    kind: Kind
    layout: LayoutMap | None = None
    callee: str = ""
    einsum: Reader | None = None
    modelled: bool = True
    placement: bool = False


RULES: dict[str, Rule] = {}
"""Every primitive's rule, by name."""

NOT_MODELLED = Rule("opaque", modelled=False)
"""The rule of a primitive that has none: planned whole, costed by its bytes, and named as
not modelled in the report."""


def register(rule: Rule, names: str) -> None:
    """Give each primitive in the space-separated ``names`` the rule ``rule``."""
    for name in names.split():
        RULES[name] = rule


def rule_of(prim: str) -> Rule:
    """``prim``'s rule (:data:`NOT_MODELLED` where it has none).

    >>> rule_of("tanh").kind, rule_of("transpose").kind, rule_of("remat2").callee
    ('elementwise', 'map', 'jaxpr')
    >>> rule_of("my_custom_kernel").modelled
    False
    """
    return RULES.get(prim, NOT_MODELLED)


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


def _dot_general(p: Mapping[str, Any], shapes: Sequence[Shape | None], o: Shape) -> Reading | None:
    if len(shapes) != 2 or shapes[0] is None or shapes[1] is None:
        return None
    return Reading(dot_op(p["dimension_numbers"], len(shapes[0]), len(shapes[1])), "")


def whole_dot_flops(prim: str, p: Mapping[str, Any], shapes: Sequence[Shape]) -> float:
    """The FLOPs of a ``dot_general`` of operands of ``shapes`` done whole (one of them a
    constant, made on each device: the dot is then planned as an opaque op); ``0`` for
    another op. The miscompile guard reads how many terms it sums from them.

    >>> whole_dot_flops("dot_general", {"dimension_numbers": (([1], [0]), ([], []))},
    ...                 [(4, 8), (8, 2)])
    128.0
    """
    if prim != "dot_general" or len(shapes) != 2:
        return 0.0
    op = dot_op(p["dimension_numbers"], len(shapes[0]), len(shapes[1]))
    return 2.0 * math.prod(op.sizes(shapes).values())


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


def _transpose(p: Mapping[str, Any], i: Shape, o: Shape) -> MapParts:
    return tuple(p["permutation"]), (), ()


def _broadcast(p: Mapping[str, Any], i: Shape, o: Shape) -> MapParts:
    dims = p["broadcast_dimensions"]
    dim_map: list[int | None] = [None] * len(o)
    for k, d in enumerate(dims):
        if i[k] == o[d]:
            dim_map[d] = k
    return tuple(dim_map), tuple(k for k, d in enumerate(dims) if i[k] != o[d]), ()


def _reduce(p: Mapping[str, Any], i: Shape, o: Shape) -> MapParts:
    axes = tuple(p["axes"])
    return tuple(d for d in range(len(i)) if d not in axes), (), axes


def _arg(p: Mapping[str, Any], i: Shape, o: Shape) -> MapParts:
    axes = tuple(p["axes"])
    return tuple(d for d in range(len(i)) if d not in axes), axes, ()


def _squeeze(p: Mapping[str, Any], i: Shape, o: Shape) -> MapParts:
    return tuple(d for d in range(len(i)) if d not in p["dimensions"]), (), ()


def _reshape(p: Mapping[str, Any], i: Shape, o: Shape) -> MapParts:
    return reshape_map(i, o)


def _along(param: str) -> LayoutMap:
    """A map that keeps every dimension where it is and needs the ones ``param`` names
    whole (one axis, or several)."""

    def layout(p: Mapping[str, Any], i: Shape, o: Shape) -> MapParts | None:
        if len(i) != len(o):
            return None
        axes = p[param]
        return tuple(range(len(i))), tuple(axes) if isinstance(axes, Sequence) else (axes,), ()

    return layout


def _unstack(p: Mapping[str, Any], i: Shape, o: Shape) -> MapParts:
    """One slice along ``axis``, which is gone from the result."""
    axis = p["axis"]
    return tuple(d for d in range(len(i)) if d != axis), (axis,), ()


def _whole(p: Mapping[str, Any], i: Shape, o: Shape) -> MapParts | None:
    """Every dimension whole (``top_k``: XLA's partitioner gathers its operand whole, even
    split along a batch dimension, and each device slices its block of the result; seen in
    the compiled HLO, an all-gather before the ``TopK`` custom call)."""
    return (tuple(range(len(i))), tuple(range(len(i))), ()) if i and len(i) == len(o) else None


def _resized(p: Mapping[str, Any], i: Shape, o: Shape) -> MapParts | None:
    """Same rank, the dimensions whose size changes whole (slices, pads)."""
    if not o or len(i) != len(o):
        return None
    return tuple(range(len(i))), tuple(d for d in range(len(i)) if i[d] != o[d]), ()


def _window(p: Mapping[str, Any], i: Shape, o: Shape) -> MapParts | None:
    """A pooling (``reduce_window_sum``…): its windowed dimensions whole, the others (batch,
    channels) carried."""
    if len(i) != len(o):
        return None
    return tuple(range(len(i))), windows.windowed(p, len(i)), ()


register(
    Rule("elementwise"),
    """
    abs acos acosh add add_any and asin asinh atan atan2 atanh bessel_i0e bessel_i1e cbrt ceil
    clamp clz complex conj copy convert_element_type cos cosh cospi digamma div eq eq_to erf erf_inv
    erfc exp exp2 expm1 floor ge gt igamma igamma_grad_a igammac imag integer_pow is_finite le
    le_to lgamma log log1p log2 logistic lt lt_to max min mul mulhi name ne neg nextafter not
    one_minus_square or polygamma polynomial population_count pow random_clone random_gamma_grad
    real reduce_precision regularized_incomplete_beta rem round rsqrt select_n shift_left
    shift_right_arithmetic shift_right_logical sign sin sinh sinpi sqrt square stop_gradient sub
    tan tanh xor zeta
    """,
)
register(Rule("elementwise", placement=True), "sharding_constraint reshard device_put")
IDENTITIES = frozenset({"copy", "stop_gradient", "psum ()"})
"""Ops lowered to their operand itself (no op, no buffer): their result is their operand (a
``psum`` over no axis, :func:`positional_sum`)."""
REDUCTIONS = frozenset(
    "reduce_sum reduce_max reduce_min reduce_prod reduce_and reduce_or reduce_xor".split()  # noqa: SIM905
)
"""Reductions whose partial results along a split dimension an all-reduce combines."""
register(Rule("map", _reduce), " ".join(sorted(REDUCTIONS)))
register(Rule("map", _arg), "argmax argmin")
register(Rule("map", _transpose), "transpose")
register(Rule("map", _broadcast), "broadcast_in_dim")
register(Rule("map", _squeeze), "squeeze")
register(Rule("map", _reshape), "reshape")
register(Rule("map", _along("axis")), "cumsum cumprod cummax cummin cumlogsumexp split")
register(Rule("map", _along("dimensions")), "rev")
register(Rule("map", _along("dimension")), "sort")
register(Rule("map", _whole), "top_k")
register(Rule("map", _unstack), "unstack")
register(Rule("map", _resized), "slice pad dynamic_slice tile")
register(Rule("dot", einsum=_dot_general), "dot_general")
register(Rule("dot", einsum=windows.conv), "conv_general_dilated")
register(Rule("dot", einsum=windows.gather), "gather")
register(Rule("dot", einsum=windows.scatter_add), "scatter-add")
register(Rule("dot", einsum=windows.scatter), "scatter")
register(Rule("dot", einsum=windows.select_and_scatter_add), "select_and_scatter_add")
register(Rule("dot", einsum=windows.concatenate), "concatenate")
register(Rule("dot", einsum=windows.update_slice), "dynamic_update_slice")
register(
    Rule("map", _window), "reduce_window reduce_window_sum reduce_window_max reduce_window_min"
)
register(Rule("call", callee="jaxpr"), "jit remat2 composite")
register(
    Rule("call", callee="call_jaxpr"),
    "closed_call core_call eval_jaxpr custom_jvp_call custom_vjp_call",
)
register(Rule("call", callee="call"), "custom_vmap_call")
register(Rule("scan"), "scan")
register(Rule("cond"), "cond")
register(Rule("constant"), "iota empty empty2 create_token after_all platform_index")
register(
    Rule("opaque"),
    """
    stack scatter-sub scatter-mul scatter-min
    scatter-max reduce select_and_gather_add
    bitcast_convert_type optimization_barrier approx_top_k rng_bit_generator rng_uniform
    random_bits random_seed random_wrap random_unwrap random_fold_in random_split random_gamma
    random_poisson threefry2x32 lu_pivots_to_permutation dce_sink call_hi_primitive
    """,
)
UNTIMED = """
    while fft cholesky cholesky_update triangular_solve lu qr geqrf ormqr
    householder_product eigh eig svd schur tridiagonal tridiagonal_solve hessenberg
    symmetric_product custom_linear_solve ragged_dot_general scaled_dot scaled_matmul_wrapper
"""
"""Opaque primitives whose time their bytes do not tell (an SVD of 256 x 512 ran 290 times
its bytes' time): planned whole, costed by their bytes, and named as not modelled."""
register(Rule("opaque", modelled=False), UNTIMED)


def positional_sum(eqn: Any) -> str:
    """``eqn``'s primitive as the graph reads it: a ``psum`` over positional axes of one
    operand (what ``jax.vmap`` makes of a ``psum``/``pmean`` over its ``axis_name``: the
    batch statistics of a BatchNorm) is the ``reduce_sum`` it computes, and over none
    (its transpose in a backward pass) ``"psum ()"``, its operand itself."""
    prim: str = eqn.primitive.name
    axes = eqn.params.get("axes")
    if prim != "psum" or len(eqn.invars) != 1 or eqn.params.get("axis_index_groups"):
        return prim
    if not all(isinstance(a, int) for a in axes):
        return prim
    return "reduce_sum" if axes else "psum ()"
