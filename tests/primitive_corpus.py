"""A corpus of JAX functions that between them emit every primitive a model can put in a jaxpr.

The program planner reads a function's jaxpr and needs a rule for each primitive in it. Its
primitive-coverage test walks this corpus and fails on any primitive with no rule, so that a
new JAX release (or a primitive nobody thought of) shows up as a failing test, not as a user's
crash.

What the corpus covers, for the JAX version the project pins:

- every public callable of ``jax.lax``, ``jax.lax.linalg`` and ``jax.nn`` that can be traced
  without a named mesh axis (:data:`NOT_IN_CORPUS` lists the rest, with the reason);
- the ``jax.numpy``, ``jax.scipy`` and ``jax.random`` calls users write in models: indexing and
  ``.at[]`` updates, sorting, cumulative ops, einsums, pooling, linear algebra, FFTs, keys;
- control flow (``cond``, ``switch``, ``while_loop``, ``fori_loop``, ``scan``, ``map``),
  ``jax.checkpoint``, nested ``jax.jit``, ``custom_jvp``/``custom_vjp`` functions;
- a few small models (MLP, transformer block, CNN, RNN, mixture of experts) whose training step
  emits the transposes a real one does;
- forward-mode and per-example transforms (``jax.jvp``, ``jax.hessian``, ``jax.vmap``), for the
  primitives only they emit (``select_and_gather_add``).

:func:`corpus_primitives` traces every entry with ``jax.make_jaxpr``, and every entry with a
floating-point (or complex) input and output also under ``jax.grad`` of the sum of its outputs,
so a training step's primitives (``add_any``, ``transpose``, ``pad``, ``scatter-add``,
``select_and_scatter_add``, ...) are covered too. Tracing only: nothing is compiled or run, and
the whole corpus traces in a few seconds.

Left out on purpose: collectives and ``shard_map`` (``psum``, ``all_gather``, ``ppermute``...
need a mesh axis); callbacks (``jax.debug.print``, ``jax.pure_callback``, ``io_callback``);
mutable references (``jax.new_ref``); ``jax.export``'s shape polymorphism; primitives only a
GPU traces (cuDNN attention with ``implementation="cudnn"``). Sharding annotations are in, on
an abstract one-device mesh: ``with_sharding_constraint`` and ``jax.sharding.reshard``.

To cover a new primitive, add an entry (label, function, example arguments) to the section it
belongs to; :data:`NOT_IN_CORPUS` names the public functions that have none, and why.

>>> import jax.numpy as jnp
>>> sorted(primitives(jax.make_jaxpr(lambda x: jax.lax.cond(x > 0, jnp.sin, jnp.cos, x))(1.0)))
['cond', 'convert_element_type', 'cos', 'gt', 'sin']
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import jax
import jax.ad_checkpoint
import jax.custom_batching
import jax.extend.core as jcore
import jax.extend.random
import jax.numpy as jnp
import jax.scipy.linalg
import jax.scipy.special
from jax import lax
from jax.sharding import AbstractMesh, AxisType, NamedSharding, PartitionSpec

Entry = tuple[str, Callable[..., Any], tuple[Any, ...]]


def _words(text: str) -> list[str]:
    """The names in a block of text (long lists of names read better so)."""
    return text.split()


def _sds(shape: Sequence[int], dtype: Any = jnp.float32) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(tuple(shape), dtype)


# Example arguments: shapes and dtypes only (tracing needs nothing more).
F = _sds((4, 8))
F_ROW = _sds((8,))
F_SCALAR = _sds(())
BF16 = _sds((4, 8), jnp.bfloat16)
I32 = _sds((4, 8), jnp.int32)
U32 = _sds((4, 8), jnp.uint32)
BOOL = _sds((4, 8), jnp.bool_)
C64 = _sds((4, 8), jnp.complex64)
SQUARE = _sds((4, 4))
SQUARE_C = _sds((4, 4), jnp.complex64)
VEC4 = _sds((4,))
INDEX = _sds((), jnp.int32)
"""A traced integer scalar: a loop bound, a dynamic start, a branch index."""
PRED = _sds((), jnp.bool_)
ROWS = _sds((2, 1), jnp.int32)
"""Row indices into ``F`` for gather and scatter, in ``lax.gather``'s (N, 1) layout."""
ROW_UPDATES = _sds((2, 8))
IDS = _sds((2,), jnp.int32)
LABELS = _sds((4,), jnp.int32)
KEY = jax.eval_shape(jax.random.key, 0)
"""A typed PRNG key (``key<fry>[]``)."""
RAW_KEY = _sds((2,), jnp.uint32)
"""A raw ``uint32[2]`` key, as ``jax.random.PRNGKey`` makes."""
NCHW = _sds((2, 3, 8, 8))
OIHW = _sds((4, 3, 3, 3))
NHWC = _sds((2, 8, 8, 3))
HWIO = _sds((3, 3, 3, 4))
NWC = _sds((2, 8, 3))
WIO = _sds((3, 3, 4))
BTNH = _sds((2, 4, 2, 8))
"""Attention queries, keys and values: batch, sequence, heads, head size."""

GATHER_ROWS = lax.GatherDimensionNumbers(
    offset_dims=(1,), collapsed_slice_dims=(0,), start_index_map=(0,)
)
SCATTER_ROWS = lax.ScatterDimensionNumbers(
    update_window_dims=(1,), inserted_window_dims=(0,), scatter_dims_to_operand_dims=(0,)
)
_AUTO_MESH = AbstractMesh((1,), ("x",), axis_types=(AxisType.Auto,))
_EXPLICIT_MESH = AbstractMesh((1,), ("x",), axis_types=(AxisType.Explicit,))
"""One-device meshes that exist only as shapes: enough to trace sharding annotations."""

# ----------------------------------------------------------------------------------------------
# jax.lax elementwise: one entry per function, generated from the names.

_LAX_UNARY_FLOAT = _words("""
    abs acos acosh asin asinh atan atanh bessel_i0e bessel_i1e cbrt ceil cos cosh digamma erf
    erf_inv erfc exp exp2 expm1 floor is_finite lgamma log log1p logistic neg reciprocal round
    rsqrt sign sin sinh sqrt square stop_gradient tan tanh
""")
_LAX_BINARY_FLOAT = _words("""
    add atan2 div eq ge gt igamma igamma_grad_a igammac le lt max min mul ne nextafter polygamma
    pow random_gamma_grad rem sub zeta
""")
_LAX_UNARY_INT = _words("bitwise_not clz population_count")
_LAX_BINARY_INT = _words("""
    bitwise_and bitwise_or bitwise_xor mulhi shift_left shift_right_arithmetic shift_right_logical
""")

_ELEMENTWISE: tuple[Entry, ...] = (
    *((f"lax.{n}", getattr(lax, n), (F,)) for n in _LAX_UNARY_FLOAT),
    *((f"lax.{n}", getattr(lax, n), (F, F)) for n in _LAX_BINARY_FLOAT),
    *((f"lax.{n}", getattr(lax, n), (I32,)) for n in _LAX_UNARY_INT),
    *((f"lax.{n}", getattr(lax, n), (I32, I32)) for n in _LAX_BINARY_INT),
    ("lax.bitwise_and (bool)", lax.bitwise_and, (BOOL, BOOL)),
    ("lax.bitwise_not (bool)", lax.bitwise_not, (BOOL,)),
    ("lax.shift_right_logical (uint32)", lax.shift_right_logical, (U32, U32)),
    ("lax.div (int32)", lax.div, (I32, I32)),
    ("lax.rem (int32)", lax.rem, (I32, I32)),
    ("lax.betainc", lax.betainc, (F, F, F)),
    ("lax.clamp", lax.clamp, (F_SCALAR, F, F_SCALAR)),
    ("lax.clamp (array bounds)", lax.clamp, (F, F, F)),
    ("lax.integer_pow", lambda x: lax.integer_pow(x, 3), (F,)),
    ("lax.pow (int exponent)", lax.pow, (F, I32)),
    ("lax.round (to even)", lambda x: lax.round(x, lax.RoundingMethod.TO_NEAREST_EVEN), (F,)),
    ("lax.select", lax.select, (BOOL, F, F)),
    ("lax.select_n", lax.select_n, (I32, F, F, F)),
    ("lax.complex", lax.complex, (F, F)),
    ("lax.real", lax.real, (C64,)),
    ("lax.imag", lax.imag, (C64,)),
    ("lax.conj", lax.conj, (C64,)),
    ("lax.abs (complex)", lax.abs, (C64,)),
    ("lax.exp (complex)", lax.exp, (C64,)),
    ("lax.mul (complex)", lax.mul, (C64, C64)),
    ("lax.sqrt (accuracy)", lambda x: lax.sqrt(x, accuracy=lax.AccuracyMode.HIGHEST), (F,)),
    ("lax.tanh (bfloat16)", lax.tanh, (BF16,)),
)

# ----------------------------------------------------------------------------------------------
# jax.lax types, shapes and layouts.

_SHAPES: tuple[Entry, ...] = (
    ("lax.convert_element_type", lambda x: lax.convert_element_type(x, jnp.bfloat16), (F,)),
    ("lax.convert_element_type (to int)", lambda x: lax.convert_element_type(x, jnp.int32), (F,)),
    ("lax.bitcast_convert_type", lambda x: lax.bitcast_convert_type(x, jnp.int32), (F,)),
    ("lax.bitcast_convert_type (to uint8)", lambda x: lax.bitcast_convert_type(x, jnp.uint8), (F,)),
    ("lax.reduce_precision", lambda x: lax.reduce_precision(x, 8, 7), (F,)),
    ("lax.iota", lambda: lax.iota(jnp.int32, 8), ()),
    ("lax.broadcasted_iota", lambda: lax.broadcasted_iota(jnp.int32, (4, 8), 1), ()),
    ("lax.full", lambda: lax.full((4, 8), 1.5), ()),
    ("lax.full_like", lambda x: lax.full_like(x, 0.0), (F,)),
    ("lax.empty", lambda: lax.empty((4, 8), jnp.float32), ()),
    ("lax.broadcast", lambda x: lax.broadcast(x, (3,)), (F,)),
    ("lax.broadcast_in_dim", lambda x: lax.broadcast_in_dim(x, (4, 8, 3), (0, 1)), (F,)),
    ("lax.broadcast_to_rank", lambda x: lax.broadcast_to_rank(x, 3), (F,)),
    ("lax.broadcast_like", lambda x, y: lax.broadcast_like(x, y), (F_ROW, F)),
    ("lax.reshape", lambda x: lax.reshape(x, (8, 4)), (F,)),
    ("lax.reshape (dimensions)", lambda x: lax.reshape(x, (32,), dimensions=(1, 0)), (F,)),
    ("lax.collapse", lambda x: lax.collapse(x, 0, 2), (F,)),
    ("lax.expand_dims", lambda x: lax.expand_dims(x, (0, 2)), (F,)),
    ("lax.squeeze", lambda x: lax.squeeze(lax.expand_dims(x, (0,)), (0,)), (F,)),
    ("lax.transpose", lambda x: lax.transpose(x, (1, 0)), (F,)),
    ("lax.rev", lambda x: lax.rev(x, (0, 1)), (F,)),
    ("lax.pad", lambda x: lax.pad(x, 0.0, ((1, 2, 0), (0, -1, 1))), (F,)),
    ("lax.concatenate", lambda x, y: lax.concatenate((x, y), 1), (F, F)),
    ("lax.split", lambda x: lax.split(x, (3, 5), axis=1), (F,)),
    ("lax.stack", lambda x, y: lax.stack((x, y), axis=1), (F, F)),
    ("lax.unstack", lambda x: lax.unstack(x, axis=1), (F,)),
    ("lax.tile", lambda x: lax.tile(x, (2, 3)), (F,)),
    ("lax.slice", lambda x: lax.slice(x, (1, 0), (3, 8), (1, 2)), (F,)),
    ("lax.slice_in_dim", lambda x: lax.slice_in_dim(x, 2, 6, axis=1), (F,)),
    ("lax.index_in_dim", lambda x: lax.index_in_dim(x, 1, keepdims=False), (F,)),
    ("lax.dynamic_slice", lambda x, i: lax.dynamic_slice(x, (i, 2), (2, 4)), (F, INDEX)),
    ("lax.dynamic_slice_in_dim", lambda x, i: lax.dynamic_slice_in_dim(x, i, 2), (F, INDEX)),
    ("lax.dynamic_index_in_dim", lambda x, i: lax.dynamic_index_in_dim(x, i, 1), (F, INDEX)),
    (
        "lax.dynamic_update_slice",
        lambda x, u, i: lax.dynamic_update_slice(x, u, (i, 0)),
        (F, ROW_UPDATES, INDEX),
    ),
    (
        "lax.dynamic_update_slice_in_dim",
        lambda x, u, i: lax.dynamic_update_slice_in_dim(x, u, i, 0),
        (F, ROW_UPDATES, INDEX),
    ),
    (
        "lax.dynamic_update_index_in_dim",
        lambda x, u, i: lax.dynamic_update_index_in_dim(x, u, i, 0),
        (F, F_ROW, INDEX),
    ),
    ("lax.gather", lambda x, i: lax.gather(x, i, GATHER_ROWS, (1, 8)), (F, ROWS)),
    (
        "lax.gather (fill)",
        lambda x, i: lax.gather(x, i, GATHER_ROWS, (1, 8), mode="fill", fill_value=0.0),
        (F, ROWS),
    ),
    (
        "lax.index_take",
        lambda x, i: lax.index_take(x, i, (0,)),
        (F, _sds((1, 2), jnp.int32)),  # one row of indices per axis taken along
    ),
    *(
        (
            f"lax.{n}",
            functools.partial(getattr(lax, n), dimension_numbers=SCATTER_ROWS),
            (F, ROWS, ROW_UPDATES),
        )
        for n in _words("scatter scatter_add scatter_sub scatter_mul scatter_min scatter_max")
    ),
    (
        "lax.scatter_mul (unique indices)",
        lambda x, i, u: lax.scatter_mul(x, i, u, SCATTER_ROWS, unique_indices=True),
        (F, ROWS, ROW_UPDATES),
    ),
    (
        "lax.scatter_apply",
        lambda x, i: lax.scatter_apply(x, i, jnp.sin, SCATTER_ROWS, update_shape=(2, 8)),
        (F, ROWS),
    ),
    ("lax.copy_p", lax.copy_p.bind, (F,)),
    ("lax.shape_as_value", lambda x: lax.shape_as_value(x.shape), (F,)),
)

# ----------------------------------------------------------------------------------------------
# jax.lax reductions, cumulative ops, sorting.

_REDUCTIONS: tuple[Entry, ...] = (
    *(
        (f"lax.{n}", lambda x, n=n: getattr(lax, n)(x, (1,)), (F,))
        for n in _words("reduce_sum reduce_max reduce_min reduce_prod")
    ),
    *(
        (f"lax.{n}", lambda x, n=n: getattr(lax, n)(x, (0,)), (BOOL,))
        for n in _words("reduce_and reduce_or reduce_xor")
    ),
    ("lax.reduce_xor (int32)", lambda x: lax.reduce_xor(x, (1,)), (I32,)),
    ("lax.reduce (add)", lambda x: lax.reduce(x, 0.0, lax.add, (1,)), (F,)),
    ("lax.reduce (custom)", lambda x: lax.reduce(x, 0.0, lambda a, b: a + 2 * b, (1,)), (F,)),
    (
        "lax.reduce (variadic)",
        lambda x, i: lax.reduce((x, i), (-jnp.inf, 0), _max_with_index, (1,)),
        (F, I32),
    ),
    ("lax.argmax", lambda x: lax.argmax(x, 1, jnp.int32), (F,)),
    ("lax.argmin", lambda x: lax.argmin(x, 0, jnp.int32), (F,)),
    *(
        (f"lax.{n}", lambda x, n=n: getattr(lax, n)(x, axis=1), (F,))
        for n in _words("cumsum cumprod cummax cummin cumlogsumexp")
    ),
    ("lax.cumsum (reverse)", lambda x: lax.cumsum(x, axis=0, reverse=True), (F,)),
    ("lax.associative_scan", lambda x: lax.associative_scan(jnp.add, x, axis=1), (F,)),
    ("lax.sort", lambda x: lax.sort(x, dimension=1), (F,)),
    ("lax.sort (operands)", lambda x, y, z: lax.sort((x, y, z), num_keys=2), (F, I32, F)),
    ("lax.sort_key_val", lax.sort_key_val, (F, I32)),
    ("lax.top_k", lambda x: lax.top_k(x, 3), (F,)),
    ("lax.approx_max_k", lambda x: lax.approx_max_k(x, 3), (F,)),
    ("lax.approx_min_k", lambda x: lax.approx_min_k(x, 3), (F,)),
)


def _max_with_index(a: tuple[Any, Any], b: tuple[Any, Any]) -> tuple[Any, Any]:
    pick = a[0] >= b[0]
    return lax.select(pick, a[0], b[0]), lax.select(pick, a[1], b[1])


# ----------------------------------------------------------------------------------------------
# jax.lax windows (pooling), convolutions and dots.


def _max_pool(x: jax.Array) -> Any:
    """Flax's and Haiku's max pooling: ``reduce_window`` with ``lax.max`` from minus infinity."""
    return lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")


def _avg_pool(x: jax.Array) -> Any:
    """Flax's average pooling: a windowed sum divided by the window's size."""
    return lax.reduce_window(x, 0.0, lax.add, (1, 2, 2, 1), (1, 2, 2, 1), "VALID") / 4.0


def _avg_pool_same(x: jax.Array) -> Any:
    """Average pooling over a padded window, counting only the elements inside the input."""
    window, strides = (1, 3, 3, 1), (1, 1, 1, 1)
    total = lax.reduce_window(x, 0.0, lax.add, window, strides, "SAME")
    count = lax.reduce_window(jnp.ones_like(x), 0.0, lax.add, window, strides, "SAME")
    return total / count


def _min_pool(x: jax.Array) -> Any:
    return lax.reduce_window(x, jnp.inf, lax.min, (1, 2, 2, 1), (1, 1, 1, 1), "SAME")


def _reshape_max_pool(x: jax.Array) -> jax.Array:
    """Max pooling as some write it: split each spatial axis in two and reduce."""
    return x.reshape(2, 4, 2, 4, 2, 3).max(axis=(2, 4))


_WINDOWS: tuple[Entry, ...] = (
    ("lax.reduce_window (max pool)", _max_pool, (NHWC,)),
    ("lax.reduce_window (avg pool)", _avg_pool, (NHWC,)),
    ("lax.reduce_window (avg pool, SAME)", _avg_pool_same, (NHWC,)),
    ("lax.reduce_window (min pool)", _min_pool, (NHWC,)),
    (
        "lax.reduce_window (dilated)",
        lambda x: lax.reduce_window(
            x, 0.0, lax.add, (2, 2), (1, 1), "VALID", base_dilation=(2, 1), window_dilation=(1, 2)
        ),
        (F,),
    ),
    (
        "lax.reduce_window (custom)",
        lambda x: lax.reduce_window(x, 1.0, lambda a, b: a * b + 1.0, (2, 2), (1, 1), "VALID"),
        (F,),
    ),
    (
        "lax.reduce_window (variadic)",
        lambda x, i: lax.reduce_window(
            (x, i), (-jnp.inf, 0), _max_with_index, (2, 2), (2, 2), "VALID"
        ),
        (F, I32),
    ),
    ("jnp.max (reshape max pool)", _reshape_max_pool, (NHWC,)),
    ("lax.conv", lambda x, w: lax.conv(x, w, (1, 1), "SAME"), (NCHW, OIHW)),
    (
        "lax.conv_general_dilated",
        lambda x, w: lax.conv_general_dilated(
            x, w, (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
        ),
        (NHWC, HWIO),
    ),
    (
        "lax.conv_general_dilated (depthwise, dilated)",
        lambda x, w: lax.conv_general_dilated(
            x,
            w,
            (1, 1),
            ((2, 2), (2, 2)),
            rhs_dilation=(2, 2),
            dimension_numbers=("NHWC", "HWIO", "NHWC"),
            feature_group_count=3,
        ),
        (NHWC, _sds((3, 3, 1, 3))),
    ),
    (
        "lax.conv_general_dilated (lhs dilation)",
        lambda x, w: lax.conv_general_dilated(x, w, (1, 1), ((1, 1), (1, 1)), lhs_dilation=(2, 2)),
        (NCHW, OIHW),
    ),
    (
        "lax.conv_general_dilated (1d, bfloat16 -> float32)",
        lambda x, w: lax.conv_general_dilated(
            x,
            w,
            (1,),
            "SAME",
            dimension_numbers=("NWC", "WIO", "NWC"),
            preferred_element_type=jnp.float32,
        ),
        (_sds((2, 8, 3), jnp.bfloat16), _sds((3, 3, 4), jnp.bfloat16)),
    ),
    (
        "lax.conv_general_dilated (batch groups)",
        lambda x, w: lax.conv_general_dilated(
            x, w, (1,), "VALID", dimension_numbers=("NWC", "WIO", "NWC"), batch_group_count=2
        ),
        (NWC, WIO),
    ),
    (
        "lax.conv_with_general_padding",
        lambda x, w: lax.conv_with_general_padding(x, w, (1, 1), ((1, 1), (0, 2)), None, None),
        (NCHW, OIHW),
    ),
    (
        "lax.conv_transpose",
        lambda x, w: lax.conv_transpose(
            x, w, (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
        ),
        (NHWC, HWIO),
    ),
    (
        "lax.conv_general_dilated_local",
        lambda x, w: lax.conv_general_dilated_local(x, w, (1, 1), "SAME", (3, 3)),
        (NCHW, _sds((4, 27, 8, 8))),
    ),
    (
        "lax.conv_general_dilated_patches",
        lambda x: lax.conv_general_dilated_patches(x, (3, 3), (1, 1), "SAME"),
        (NCHW,),
    ),
    ("lax.dot", lax.dot, (F, _sds((8, 4)))),
    (
        "lax.dot_general",
        lambda x, y: lax.dot_general(x, y, (((2,), (1,)), ((0,), (0,)))),
        (_sds((2, 4, 8)), _sds((2, 8, 3))),
    ),
    (
        "lax.dot_general (bfloat16 -> float32)",
        lambda x, y: lax.dot_general(
            x, y, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32
        ),
        (BF16, BF16),
    ),
    (
        "lax.dot (int8 -> int32)",
        lambda x, y: lax.dot(x, y, preferred_element_type=jnp.int32),
        (_sds((4, 8), jnp.int8), _sds((8, 4), jnp.int8)),
    ),
    ("lax.batch_matmul", lax.batch_matmul, (_sds((2, 4, 8)), _sds((2, 8, 3)))),
    (
        "lax.ragged_dot",
        lax.ragged_dot,
        (_sds((8, 4)), _sds((2, 4, 3)), _sds((2,), jnp.int32)),
    ),
    (
        "lax.ragged_dot_general",
        lambda x, y, g: lax.ragged_dot_general(
            x,
            y,
            g,
            lax.RaggedDotDimensionNumbers(
                dot_dimension_numbers=(((1,), (1,)), ((), ())),
                lhs_ragged_dimensions=(0,),
                rhs_group_dimensions=(0,),
            ),
        ),
        (_sds((8, 4)), _sds((2, 4, 3)), _sds((2,), jnp.int32)),
    ),
    ("lax.scaled_dot", lax.scaled_dot, (F, _sds((8, 4)))),
)

# ----------------------------------------------------------------------------------------------
# Control flow, transforms, custom derivatives and the odd ones out.


def _scan_rnn(h: jax.Array, xs: jax.Array, w: jax.Array) -> tuple[jax.Array, jax.Array]:
    def step(carry: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        carry = jnp.tanh(carry @ w + x)
        return carry, carry.sum()

    return lax.scan(step, h, xs)


def _while(x: jax.Array) -> tuple[Any, Any]:
    return lax.while_loop(lambda c: c[0] < 5, lambda c: (c[0] + 1, c[1] * 2.0), (0, x))


@jax.custom_jvp
def _clipped_log(x: jax.Array) -> jax.Array:
    return jnp.log(jnp.maximum(x, 1e-6))


@_clipped_log.defjvp
def _clipped_log_jvp(primals: tuple[Any, ...], tangents: tuple[Any, ...]) -> tuple[Any, Any]:
    (x,), (t,) = primals, tangents
    return _clipped_log(x), t / jnp.maximum(x, 1e-6)


@jax.custom_vjp
def _clip_gradient(x: jax.Array) -> jax.Array:
    return jnp.sin(x)


def _clip_gradient_fwd(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    return jnp.sin(x), jnp.cos(x)


def _clip_gradient_bwd(cos_x: jax.Array, g: jax.Array) -> tuple[jax.Array]:
    return (jnp.clip(g * cos_x, -1.0, 1.0),)


_clip_gradient.defvjp(_clip_gradient_fwd, _clip_gradient_bwd)


@functools.partial(jax.checkpoint, policy=jax.checkpoint_policies.save_only_these_names("hidden"))
def _named_checkpoint(x: jax.Array, w: jax.Array) -> jax.Array:
    """Remat with a names policy, as large models write it."""
    hidden = jax.ad_checkpoint.checkpoint_name(jnp.tanh(x @ w), "hidden")
    return jnp.sin(hidden) @ w


def _sharded(x: jax.Array) -> Any:
    return lax.with_sharding_constraint(x * 2.0, NamedSharding(_AUTO_MESH, PartitionSpec("x")))


@jax.custom_batching.custom_vmap
def _sin_with_vmap_rule(x: jax.Array) -> jax.Array:
    return jnp.sin(x)


@_sin_with_vmap_rule.def_vmap
def _sin_vmap_rule(axis_size: int, in_batched: list[bool], x: jax.Array) -> tuple[jax.Array, bool]:
    return jnp.sin(x), in_batched[0]


def _resharded(x: jax.Array) -> Any:
    return jax.sharding.reshard(x * 2.0, NamedSharding(_EXPLICIT_MESH, PartitionSpec("x")))


def _tokens() -> Any:
    return lax.after_all(lax.create_token(), lax.create_token())


_CONTROL: tuple[Entry, ...] = (
    ("lax.cond", lambda p, x: lax.cond(p, jnp.sin, lambda y: y * 2.0, x), (PRED, F)),
    (
        "lax.switch",
        lambda i, x: lax.switch(i, (jnp.sin, jnp.cos, lambda y: -y), x),
        (INDEX, F),
    ),
    ("lax.while_loop", _while, (F,)),
    ("lax.fori_loop", lambda x: lax.fori_loop(0, 3, lambda i, c: c * 2.0 + i, x), (F,)),
    (
        "lax.fori_loop (traced bounds)",
        lambda n, x: lax.fori_loop(0, n, lambda i, c: c * 2.0, x),
        (INDEX, F),
    ),
    ("lax.scan", _scan_rnn, (F_ROW, _sds((5, 8)), _sds((8, 8)))),
    (
        "lax.scan (reverse, unrolled)",
        lambda x: lax.scan(lambda c, r: (c + r, c * r), jnp.zeros(8), x, reverse=True, unroll=2),
        (F,),
    ),
    ("lax.map", lambda x: lax.map(jnp.sin, x), (F,)),
    ("lax.map (batch_size)", lambda x: lax.map(jnp.sin, x, batch_size=2), (F,)),
    (
        "lax.custom_linear_solve",
        lambda b: lax.custom_linear_solve(
            lambda v: 2.0 * v, b, lambda mv, r: r / 2.0, lambda mv, r: r / 2.0
        ),
        (F,),
    ),
    (
        "lax.custom_root",
        lambda x: lax.custom_root(lambda y: y * y - x, x, lambda f, y0: y0, lambda g, y: y),
        (F,),
    ),
    ("lax.optimization_barrier", lambda x, y: lax.optimization_barrier((x * 2.0, y)), (F, F)),
    ("lax.dce_sink", lambda x: lax.dce_sink(x * 2.0), (F,)),
    ("lax.stage", lambda x: lax.stage(x * 2.0), (F,)),
    ("lax.composite", lambda x: lax.composite(lambda y: y * 2.0, name="corpus.double")(x), (F,)),
    (
        "lax.platform_dependent",
        lambda x: lax.platform_dependent(x, cpu=jnp.sin, default=jnp.cos),
        (F,),
    ),
    ("lax.with_sharding_constraint", _sharded, (F,)),
    ("lax.create_token", lax.create_token, ()),
    ("lax.after_all", _tokens, ()),
    ("lax.rng_uniform", lambda: lax.rng_uniform(0.0, 1.0, (4, 8)), ()),
    (
        "lax.rng_bit_generator",
        lambda k: lax.rng_bit_generator(k, (4, 8)),
        (_sds((4,), jnp.uint32),),
    ),
    ("lax.fft", lambda x: lax.fft(x, lax.FftType.FFT, (8,)), (C64,)),
    ("jax.jit (nested)", lambda x: jax.jit(jnp.sin)(x) * 2.0, (F,)),
    ("jax.checkpoint", jax.checkpoint(lambda x: jnp.sin(jnp.sin(x))), (F,)),
    (
        "jax.checkpoint (dots saveable)",
        jax.checkpoint(
            lambda x, w: jnp.tanh(x @ w) @ w, policy=jax.checkpoint_policies.dots_saveable
        ),
        (_sds((4, 8)), _sds((8, 8))),
    ),
    ("jax.ad_checkpoint.checkpoint_name", _named_checkpoint, (_sds((4, 8)), _sds((8, 8)))),
    ("jax.custom_jvp", _clipped_log, (F,)),
    ("jax.custom_vjp", _clip_gradient, (F,)),
    (
        "jax.custom_gradient",
        jax.custom_gradient(lambda x: (jnp.sin(x), lambda g: (g * jnp.cos(x),))),
        (F,),
    ),
    ("jax.custom_batching.custom_vmap", _sin_with_vmap_rule, (F,)),
    ("jax.sharding.reshard", _resharded, (F,)),
    ("jax.device_put", lambda x: jax.device_put(x) * 2.0, (F,)),
    ("jax.jvp (max pool)", lambda x, t: jax.jvp(_max_pool, (x,), (t,)), (NHWC, NHWC)),
    ("jax.jvp (min pool)", lambda x, t: jax.jvp(_min_pool, (x,), (t,)), (NHWC, NHWC)),
    (
        "jax.jvp (sort, cummax, top_k)",
        lambda x, t: jax.jvp(
            lambda y: (jnp.sort(y), lax.cummax(y, 1), lax.top_k(y, 2)[0]), (x,), (t,)
        ),
        (F, F),
    ),
    (
        "jax.linearize (custom_jvp)",
        lambda x: jax.linearize(jax.nn.relu, x)[1](x),
        (F,),
    ),
    ("jax.hessian", jax.hessian(lambda x: jnp.sum(jnp.tanh(x) ** 2)), (F_ROW,)),
    (
        "jax.vmap (per-example gradients)",
        jax.vmap(jax.grad(lambda w, x: jnp.sum(jnp.tanh(x @ w))), in_axes=(None, 0)),
        (_sds((8, 4)), F),
    ),
    (
        "jax.vmap (dynamic_slice, cond, while)",
        jax.vmap(
            lambda x, i: (
                lax.dynamic_slice_in_dim(x, i, 2),
                lax.cond(i > 2, jnp.sin, jnp.cos, x),
                lax.while_loop(lambda c: c[0] < i, lambda c: (c[0] + 1, c[1] * 2.0), (0, x)),
            )
        ),
        (F, LABELS),
    ),
)

# ----------------------------------------------------------------------------------------------
# jax.lax.linalg, jax.numpy.linalg, jax.scipy.linalg, FFTs.


def _spd(a: jax.Array) -> jax.Array:
    """A symmetric positive definite matrix from any square one."""
    return a @ a.T + 4.0 * jnp.eye(a.shape[-1], dtype=a.dtype)


_LINALG: tuple[Entry, ...] = (
    ("lax.linalg.cholesky", lambda a: lax.linalg.cholesky(_spd(a)), (SQUARE,)),
    ("lax.linalg.cholesky_update", lax.linalg.cholesky_update, (SQUARE, VEC4)),
    ("lax.linalg.eig", lax.linalg.eig, (SQUARE,)),
    (
        "lax.linalg.eig (eigenvector derivatives)",
        lambda a: lax.linalg.eig(a, compute_left_eigenvectors=False, enable_eigvec_derivs=True),
        (SQUARE,),
    ),
    ("lax.linalg.eigh", lambda a: lax.linalg.eigh(_spd(a)), (SQUARE,)),
    ("lax.linalg.hessenberg", lax.linalg.hessenberg, (SQUARE,)),
    ("lax.linalg.householder_product", lax.linalg.householder_product, (SQUARE, VEC4)),
    ("lax.linalg.lu", lax.linalg.lu, (SQUARE,)),
    (
        "lax.linalg.lu_pivots_to_permutation",
        lambda p: lax.linalg.lu_pivots_to_permutation(p, 4),
        (_sds((4,), jnp.int32),),
    ),
    ("lax.linalg.ormqr", lax.linalg.ormqr, (SQUARE, VEC4, SQUARE)),
    ("lax.linalg.qdwh", lax.linalg.qdwh, (SQUARE,)),
    ("lax.linalg.qr", lax.linalg.qr, (F.update(shape=(8, 4)),)),
    ("lax.linalg.qr (pivoting)", lambda a: lax.linalg.qr(a, pivoting=True), (SQUARE,)),
    ("lax.linalg.schur", lax.linalg.schur, (SQUARE,)),
    ("lax.linalg.svd", lax.linalg.svd, (F,)),
    ("lax.linalg.symmetric_product", lax.linalg.symmetric_product, (SQUARE, SQUARE)),
    (
        "lax.linalg.triangular_solve",
        lambda a, b: lax.linalg.triangular_solve(a, b, left_side=True, lower=True),
        (SQUARE, _sds((4, 3))),
    ),
    ("lax.linalg.tridiagonal", lax.linalg.tridiagonal, (SQUARE,)),
    (
        "lax.linalg.tridiagonal_solve",
        lax.linalg.tridiagonal_solve,
        (VEC4, VEC4, VEC4, _sds((4, 2))),
    ),
    ("jnp.linalg.cholesky", lambda a: jnp.linalg.cholesky(_spd(a)), (SQUARE,)),
    ("jnp.linalg.qr", jnp.linalg.qr, (SQUARE,)),
    ("jnp.linalg.qr (raw)", lambda a: jnp.linalg.qr(a, mode="raw"), (SQUARE,)),
    ("jnp.linalg.eigh", lambda a: jnp.linalg.eigh(_spd(a)), (SQUARE,)),
    ("jnp.linalg.eigvalsh", lambda a: jnp.linalg.eigvalsh(_spd(a)), (SQUARE,)),
    ("jnp.linalg.eig", jnp.linalg.eig, (SQUARE,)),
    ("jnp.linalg.eigvals", jnp.linalg.eigvals, (SQUARE,)),
    ("jnp.linalg.svd", jnp.linalg.svd, (F,)),
    ("jnp.linalg.svd (reduced)", lambda a: jnp.linalg.svd(a, full_matrices=False), (F,)),
    ("jnp.linalg.svd (values)", lambda a: jnp.linalg.svd(a, compute_uv=False), (F,)),
    ("jnp.linalg.inv", jnp.linalg.inv, (SQUARE,)),
    ("jnp.linalg.solve", jnp.linalg.solve, (SQUARE, _sds((4, 3)))),
    ("jnp.linalg.det", jnp.linalg.det, (SQUARE,)),
    ("jnp.linalg.slogdet", jnp.linalg.slogdet, (SQUARE,)),
    ("jnp.linalg.pinv", jnp.linalg.pinv, (F,)),
    ("jnp.linalg.lstsq", jnp.linalg.lstsq, (F.update(shape=(8, 4)), _sds((8, 2)))),
    ("jnp.linalg.norm (2)", lambda a: jnp.linalg.norm(a, ord=2), (F,)),
    ("jnp.linalg.norm", lambda a: jnp.linalg.norm(a, axis=-1), (F,)),
    ("jnp.linalg.matrix_power", lambda a: jnp.linalg.matrix_power(a, 3), (SQUARE,)),
    (
        "jax.scipy.linalg.solve_triangular",
        lambda a, b: jax.scipy.linalg.solve_triangular(a, b, lower=True),
        (SQUARE, _sds((4, 3))),
    ),
    ("jax.scipy.linalg.lu", jax.scipy.linalg.lu, (SQUARE,)),
    (
        "jax.scipy.linalg.cho_solve",
        lambda a, b: jax.scipy.linalg.cho_solve(jax.scipy.linalg.cho_factor(_spd(a)), b),
        (SQUARE, _sds((4, 3))),
    ),
    ("jax.scipy.linalg.expm", jax.scipy.linalg.expm, (SQUARE,)),
    ("jax.scipy.linalg.sqrtm", jax.scipy.linalg.sqrtm, (SQUARE,)),
    ("jnp.linalg.eigh (complex)", jnp.linalg.eigh, (SQUARE_C,)),
    ("jnp.fft.fft", jnp.fft.fft, (C64,)),
    ("jnp.fft.ifft", jnp.fft.ifft, (C64,)),
    ("jnp.fft.rfft", jnp.fft.rfft, (F,)),
    ("jnp.fft.irfft", jnp.fft.irfft, (_sds((4, 5), jnp.complex64),)),
    ("jnp.fft.fft2", jnp.fft.fft2, (F,)),
    ("jnp.abs(jnp.fft.rfft)", lambda x: jnp.abs(jnp.fft.rfft(x)), (F,)),
)

# ----------------------------------------------------------------------------------------------
# jax.nn.

_NN_ACTIVATIONS = _words("""
    celu elu gelu glu hard_sigmoid hard_silu hard_swish hard_tanh identity leaky_relu log1mexp
    log_sigmoid log_softmax logmeanexp logsumexp mish relu relu6 selu sigmoid silu soft_sign
    softmax softplus sparse_plus sparse_sigmoid squareplus standardize swish tanh
""")

_NN: tuple[Entry, ...] = (
    *((f"nn.{n}", getattr(jax.nn, n), (F,)) for n in _NN_ACTIVATIONS),
    ("nn.gelu (exact)", lambda x: jax.nn.gelu(x, approximate=False), (F,)),
    ("nn.softmax (where)", lambda x, m: jax.nn.softmax(x, where=m), (F, BOOL)),
    ("nn.log_softmax (where)", lambda x, m: jax.nn.log_softmax(x, where=m), (F, BOOL)),
    (
        "nn.logsumexp (b, return_sign)",
        lambda x, b: jax.nn.logsumexp(x, axis=1, b=b, return_sign=True),
        (F, F),
    ),
    ("nn.logsumexp (where)", lambda x, m: jax.nn.logsumexp(x, axis=1, where=m), (F, BOOL)),
    (
        "nn.standardize (mean, variance, where)",
        lambda x, m: jax.nn.standardize(
            x, mean=x.mean(-1, keepdims=True), variance=x.var(-1, keepdims=True), where=m
        ),
        (F, BOOL),
    ),
    ("nn.one_hot", lambda i: jax.nn.one_hot(i, 8), (LABELS,)),
    ("nn.one_hot (axis 0)", lambda i: jax.nn.one_hot(i, 8, axis=0, dtype=jnp.bfloat16), (I32,)),
    ("nn.dot_product_attention", jax.nn.dot_product_attention, (BTNH, BTNH, BTNH)),
    (
        "nn.dot_product_attention (bias, mask, causal)",
        lambda q, k, v, b, m: jax.nn.dot_product_attention(q, k, v, b, m, is_causal=True),
        (BTNH, BTNH, BTNH, _sds((2, 2, 4, 4)), _sds((2, 2, 4, 4), jnp.bool_)),
    ),
    (
        "nn.dot_product_attention (sequence lengths)",
        lambda q, k, v, n: jax.nn.dot_product_attention(
            q, k, v, query_seq_lengths=n, key_value_seq_lengths=n
        ),
        (BTNH, BTNH, BTNH, _sds((2,), jnp.int32)),
    ),
    (
        "nn.dot_product_attention (grouped, local window)",
        lambda q, k, v: jax.nn.dot_product_attention(q, k, v, local_window_size=(1, 1)),
        (_sds((2, 4, 4, 8)), BTNH, BTNH),
    ),
    (
        "nn.scaled_matmul",
        jax.nn.scaled_matmul,
        (
            _sds((1, 4, 32), jnp.float8_e4m3fn),
            _sds((1, 8, 32), jnp.float8_e4m3fn),
            _sds((1, 4, 1), jnp.float8_e8m0fnu),
            _sds((1, 8, 1), jnp.float8_e8m0fnu),
        ),
    ),
    (
        "nn.scaled_dot_general",
        lambda x, y: jax.nn.scaled_dot_general(x, y, (((1,), (0,)), ((), ()))),
        (_sds((4, 32)), _sds((32, 8))),
    ),
    (
        "nn.scaled_dot_general (mxfp8)",
        lambda x, y: jax.nn.scaled_dot_general(
            x,
            y,
            (((2,), (2,)), ((0,), (0,))),
            configs=[jax.nn.get_scaled_dot_general_config("mxfp8")] * 3,
        ),
        (_sds((1, 32, 32)), _sds((1, 32, 32))),
    ),
    *(
        (
            f"nn.initializers.{n}",
            lambda k, n=n: getattr(jax.nn.initializers, n)()(k, (8, 4)),
            (KEY,),
        )
        for n in _words("glorot_normal he_uniform lecun_normal orthogonal truncated_normal")
    ),
    ("nn.initializers.zeros", lambda k: jax.nn.initializers.zeros(k, (8, 4)), (KEY,)),
    (
        "nn.initializers.delta_orthogonal",
        lambda k: jax.nn.initializers.delta_orthogonal()(k, (3, 3, 4, 4)),
        (KEY,),
    ),
)

# ----------------------------------------------------------------------------------------------
# jax.random.


def _dropout(key: jax.Array, x: jax.Array) -> jax.Array:
    keep = jax.random.bernoulli(key, 0.9, x.shape)
    return jnp.where(keep, x / 0.9, 0.0)


_RANDOM: tuple[Entry, ...] = (
    ("jax.random.key", jax.random.key, (INDEX,)),
    ("jax.random.PRNGKey", jax.random.PRNGKey, (INDEX,)),
    ("jax.random.key (rbg)", lambda s: jax.random.key(s, impl="rbg"), (INDEX,)),
    ("jax.random.key_data", jax.random.key_data, (KEY,)),
    ("jax.random.wrap_key_data", jax.random.wrap_key_data, (RAW_KEY,)),
    ("jax.random.clone", jax.random.clone, (KEY,)),
    ("jax.random.split", jax.random.split, (KEY,)),
    ("jax.random.fold_in", lambda k, i: jax.random.fold_in(k, i), (KEY, INDEX)),
    ("jax.random.bits", lambda k: jax.random.bits(k, (4, 8)), (KEY,)),
    ("jax.random.uniform", lambda k: jax.random.uniform(k, (4, 8)), (KEY,)),
    ("jax.random.normal (raw key)", lambda k: jax.random.normal(k, (4, 8)), (RAW_KEY,)),
    ("jax.random.randint", lambda k: jax.random.randint(k, (4, 8), 0, 10), (KEY,)),
    ("jax.random.bernoulli (dropout)", _dropout, (KEY, F)),
    ("jax.random.categorical", lambda k, x: jax.random.categorical(k, x), (KEY, F)),
    ("jax.random.gamma", lambda k, a: jax.random.gamma(k, a), (KEY, F)),
    ("jax.random.beta", lambda k, a: jax.random.beta(k, a, a), (KEY, F)),
    ("jax.random.poisson", lambda k: jax.random.poisson(k, 3.0, (4,)), (KEY,)),
    ("jax.random.permutation", lambda k, x: jax.random.permutation(k, x, axis=1), (KEY, F)),
    ("jax.random.choice", lambda k: jax.random.choice(k, 10, (3,), replace=False), (KEY,)),
    (
        "jax.random.truncated_normal",
        lambda k: jax.random.truncated_normal(k, -2.0, 2.0, (4, 8)),
        (KEY,),
    ),
    (
        "jax.random.multivariate_normal",
        lambda k, m, c: jax.random.multivariate_normal(k, m, _spd(c)),
        (KEY, VEC4, SQUARE),
    ),
    ("jax.random.gumbel", lambda k: jax.random.gumbel(k, (4, 8)), (KEY,)),
    (
        "jax.extend.random.threefry_2x32",
        jax.extend.random.threefry_2x32,
        (RAW_KEY, _sds((8,), jnp.uint32)),
    ),
)

# ----------------------------------------------------------------------------------------------
# jax.numpy and jax.scipy.special as users write them.

_NUMPY: tuple[Entry, ...] = (
    ("jnp.take", lambda x, i: jnp.take(x, i, axis=0), (F, IDS)),
    ("jnp indexing (integer array)", lambda x, i: x[i], (F, IDS)),
    ("jnp indexing (traced scalar)", lambda x, i: x[i], (F, INDEX)),
    ("jnp indexing (slices, reversal, None)", lambda x: x[1:3, ::-2][None], (F,)),
    ("jnp indexing (two arrays)", lambda x, i, j: x[i, j], (F, IDS, IDS)),
    ("jnp.take_along_axis", lambda x, i: jnp.take_along_axis(x, i, axis=1), (F, I32)),
    ("jnp .at[].get (fill)", lambda x, i: x.at[i].get(mode="fill", fill_value=0.0), (F, IDS)),
    ("jnp .at[].set", lambda x, i, u: x.at[i].set(u), (F, IDS, ROW_UPDATES)),
    ("jnp .at[].add", lambda x, i, u: x.at[i].add(u), (F, IDS, ROW_UPDATES)),
    ("jnp .at[].subtract", lambda x, i, u: x.at[i].subtract(u), (F, IDS, ROW_UPDATES)),
    ("jnp .at[].multiply", lambda x, i, u: x.at[i].multiply(u), (F, IDS, ROW_UPDATES)),
    ("jnp .at[].min", lambda x, i, u: x.at[i].min(u), (F, IDS, ROW_UPDATES)),
    ("jnp .at[].max", lambda x, i, u: x.at[i].max(u), (F, IDS, ROW_UPDATES)),
    ("jnp .at[].set (traced scalar)", lambda x, i: x.at[i, 2:5].set(0.0), (F, INDEX)),
    ("jnp.where", jnp.where, (BOOL, F, F)),
    ("jnp.sort", lambda x: jnp.sort(x, axis=0), (F,)),
    ("jnp.argsort", jnp.argsort, (F,)),
    ("jnp.lexsort", lambda x, y: jnp.lexsort((x, y)), (F, I32)),
    ("jnp.partition", lambda x: jnp.partition(x, 2), (F,)),
    ("jnp.searchsorted", lambda a, v: jnp.searchsorted(a, v), (F_ROW, F)),
    ("jnp.searchsorted (right)", lambda a, v: jnp.searchsorted(a, v, side="right"), (F_ROW, F)),
    ("jnp.searchsorted (sort)", lambda a, v: jnp.searchsorted(a, v, method="sort"), (F_ROW, F)),
    ("jnp.searchsorted (complex)", jnp.searchsorted, (_sds((8,), jnp.complex64), C64)),
    ("jnp.unique (size)", lambda x: jnp.unique(x, size=4), (F,)),
    ("jnp.nonzero (size)", lambda x: jnp.nonzero(x, size=4), (F,)),
    ("jnp.bincount (length)", lambda x: jnp.bincount(x, length=8), (LABELS,)),
    ("jnp.median", lambda x: jnp.median(x, axis=0), (F,)),
    ("jnp.quantile", lambda x: jnp.quantile(x, 0.9, axis=1), (F,)),
    ("jnp.cumsum", lambda x: jnp.cumsum(x, axis=1), (F,)),
    ("jnp.cumprod", lambda x: jnp.cumprod(x, axis=0), (F,)),
    ("jnp.diff", lambda x: jnp.diff(x, axis=1), (F,)),
    ("jnp.einsum (matmul)", lambda x, y: jnp.einsum("ij,jk->ik", x, y), (F, _sds((8, 3)))),
    (
        "jnp.einsum (batched, transposed)",
        lambda x, y: jnp.einsum("bqhd,bkhd->bhqk", x, y),
        (BTNH, BTNH),
    ),
    (
        "jnp.einsum (diagonal, trace)",
        lambda a: jnp.einsum("ii->i", a) + jnp.einsum("ii", a),
        (SQUARE,),
    ),
    (
        "jnp.einsum (three operands)",
        lambda x, y, z: jnp.einsum("ij,jk,kl->il", x, y, z),
        (F, _sds((8, 3)), _sds((3, 5))),
    ),
    ("jnp.matmul", jnp.matmul, (_sds((2, 4, 8)), _sds((8, 3)))),
    ("jnp.dot (vector)", jnp.dot, (F, F_ROW)),
    ("jnp.outer", jnp.outer, (F_ROW, VEC4)),
    ("jnp.kron", jnp.kron, (SQUARE, _sds((2, 2)))),
    ("jnp.tensordot", lambda x, y: jnp.tensordot(x, y, axes=((0, 1), (1, 0))), (F, _sds((8, 4)))),
    ("jnp.mean, var, std", lambda x: (x.mean(0), x.var(1), x.std()), (F,)),
    ("jnp.max, min, argmax, argmin", lambda x: (x.max(1), x.min(0), x.argmax(1), x.argmin()), (F,)),
    ("jnp.any, all", lambda x: (jnp.any(x > 0, axis=1), jnp.all(x > 0)), (F,)),
    ("jnp.prod", lambda x: jnp.prod(x, axis=1), (F,)),
    ("jnp.sum (int8 -> int32)", lambda x: jnp.sum(x, dtype=jnp.int32), (_sds((4, 8), jnp.int8),)),
    ("jnp.clip", lambda x: jnp.clip(x, -1.0, 1.0), (F,)),
    ("jnp.tril, triu", lambda a: (jnp.tril(a), jnp.triu(a, 1)), (SQUARE,)),
    ("jnp.roll", lambda x: jnp.roll(x, 3, axis=1), (F,)),
    ("jnp.roll (traced shift)", lambda x, s: jnp.roll(x, s, axis=1), (F, INDEX)),
    ("jnp.pad (constant)", lambda x: jnp.pad(x, ((1, 1), (2, 0))), (F,)),
    ("jnp.pad (reflect)", lambda x: jnp.pad(x, 2, mode="reflect"), (F,)),
    ("jnp.pad (edge)", lambda x: jnp.pad(x, 2, mode="edge"), (F,)),
    ("jnp.pad (wrap)", lambda x: jnp.pad(x, 2, mode="wrap"), (F,)),
    ("jnp.concatenate", lambda x, y: jnp.concatenate((x, y), axis=0), (F, F)),
    ("jnp.stack", lambda x, y: jnp.stack((x, y), axis=-1), (F, F)),
    ("jnp.split", lambda x: jnp.split(x, 2, axis=1), (F,)),
    ("jnp.repeat", lambda x: jnp.repeat(x, 2, axis=0), (F,)),
    (
        "jnp.repeat (array)",
        lambda x: jnp.repeat(x, jnp.array([1, 2, 0, 1]), axis=0, total_repeat_length=4),
        (F,),
    ),
    ("jnp.tile", lambda x: jnp.tile(x, (2, 1)), (F,)),
    ("jnp.flip", jnp.flip, (F,)),
    ("jnp.swapaxes, moveaxis", lambda x: (jnp.swapaxes(x, 0, 1), jnp.moveaxis(x, 0, -1)), (F,)),
    ("jnp.reshape, ravel", lambda x: (x.reshape(2, -1), x.ravel()), (F,)),
    ("jnp.expand_dims, squeeze", lambda x: jnp.squeeze(jnp.expand_dims(x, 1), 1), (F,)),
    ("jnp.broadcast_to", lambda x: jnp.broadcast_to(x, (4, 8)), (F_ROW,)),
    ("jnp.astype (bfloat16)", lambda x: x.astype(jnp.bfloat16), (F,)),
    ("jnp.astype (bool)", lambda x: x.astype(bool), (F,)),
    ("jnp.copy", jnp.copy, (F,)),
    ("jnp.logaddexp", jnp.logaddexp, (F, F)),
    ("jnp.isnan, nan_to_num", lambda x: (jnp.isnan(x), jnp.nan_to_num(x)), (F,)),
    ("jnp.round", lambda x: jnp.round(x, 2), (F,)),
    ("jnp.floor_divide, remainder (int)", lambda x, y: (x // y, x % y), (I32, I32)),
    ("jnp.floor_divide, remainder", lambda x, y: (x // y, x % y), (F, F)),
    ("jnp.sinc", jnp.sinc, (F,)),
    ("jnp.hypot", jnp.hypot, (F, F)),
    ("jnp.power (int)", lambda x: x**3 + 2**x, (I32,)),
    ("jnp.frexp, ldexp", lambda x, e: (jnp.frexp(x), jnp.ldexp(x, e)), (F, I32)),
    ("jnp.gcd", jnp.gcd, (I32, I32)),
    (
        "jnp.arange, linspace, eye",
        lambda: (jnp.arange(8), jnp.linspace(0.0, 1.0, 5), jnp.eye(4)),
        (),
    ),
    (
        "jnp.diag, diagonal, trace",
        lambda a: (jnp.diag(a), jnp.diagonal(a), jnp.trace(a), jnp.diag(a[0])),
        (SQUARE,),
    ),
    ("jnp.meshgrid", lambda x, y: jnp.meshgrid(x, y), (F_ROW, VEC4)),
    ("jnp.convolve", jnp.convolve, (F_ROW, _sds((3,)))),
    ("jnp.polyval", lambda c, x: jnp.polyval(c, x), (VEC4, F)),
    ("jnp.interp", lambda x, xp, fp: jnp.interp(x, xp, fp), (F, F_ROW, F_ROW)),
    ("jnp.histogram", lambda x: jnp.histogram(x, bins=4, range=(0.0, 1.0)), (F,)),
    ("jnp.isin", lambda x, y: jnp.isin(x, y), (I32, LABELS)),
    ("jnp.argwhere (size)", lambda x: jnp.argwhere(x, size=3), (BOOL,)),
    (
        "jnp.real, imag, conj, angle",
        lambda z: (jnp.real(z), jnp.imag(z), jnp.conj(z), jnp.angle(z)),
        (C64,),
    ),
    ("jnp complex arithmetic", lambda x, y: jnp.abs((x + 1j * y) ** 2 / (x - 1j)), (F, F)),
    *(
        (f"jax.scipy.special.{n}", getattr(jax.scipy.special, n), (F,))
        for n in _words(
            "erf erfc erfinv gammaln digamma expit logit ndtr ndtri i0e i1e entr log_ndtr"
        )
    ),
    *(
        (f"jax.scipy.special.{n}", getattr(jax.scipy.special, n), (F, F))
        for n in _words("xlogy xlog1py gammainc gammaincc betaln zeta")
    ),
    ("jax.scipy.special.polygamma", jax.scipy.special.polygamma, (I32, F)),
    ("jax.scipy.special.logsumexp", lambda x: jax.scipy.special.logsumexp(x, axis=1), (F,)),
    ("jax.scipy.special.betainc", jax.scipy.special.betainc, (F, F, F)),
)

# ----------------------------------------------------------------------------------------------
# Small models: their training step (the gradient of the loss) emits what a real one does.


def _mlp_loss(w1: jax.Array, w2: jax.Array, x: jax.Array, labels: jax.Array) -> jax.Array:
    h = jax.nn.relu(x @ w1)
    logits = h @ w2
    return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * jax.nn.one_hot(labels, 4), axis=-1))


def _transformer_block(
    embed: jax.Array, wqkv: jax.Array, wo: jax.Array, w_mlp: jax.Array, tokens: jax.Array
) -> jax.Array:
    """Embedding lookup, layer norm, causal attention, GELU MLP, residuals, cross-entropy."""
    x = jnp.take(embed, tokens, axis=0)  # (batch, seq, model)
    b, t, d = x.shape
    h = jax.nn.standardize(x, axis=-1)
    q, k, v = jnp.split(h @ wqkv, 3, axis=-1)
    q, k, v = (a.reshape(b, t, 2, d // 2) for a in (q, k, v))
    att = jax.nn.dot_product_attention(q, k, v, is_causal=True).reshape(b, t, d)
    x = x + att @ wo
    x = x + jax.nn.gelu(jax.nn.standardize(x) @ w_mlp) @ w_mlp.T
    logits = x @ embed.T
    targets = jnp.roll(tokens, -1, axis=1)
    logp = jax.nn.log_softmax(logits)
    return -jnp.take_along_axis(logp, targets[..., None], axis=-1).mean()


def _cnn_loss(w1: jax.Array, w2: jax.Array, images: jax.Array) -> jax.Array:
    dn = ("NHWC", "HWIO", "NHWC")
    h = jax.nn.relu(lax.conv_general_dilated(images, w1, (1, 1), "SAME", dimension_numbers=dn))
    h = _max_pool(h)
    h = lax.conv_general_dilated(h, w2, (1, 1), "SAME", dimension_numbers=dn)
    h = _avg_pool(jax.nn.silu(h))
    return jnp.mean(h**2)


def _rnn_loss(w: jax.Array, xs: jax.Array) -> jax.Array:
    @jax.checkpoint
    def step(h: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        h = jnp.tanh(h @ w + x)
        return h, jnp.sum(h**2)

    _, losses = lax.scan(step, jnp.zeros(xs.shape[1:]), xs)
    return jnp.mean(losses)


def _moe_loss(router: jax.Array, experts: jax.Array, x: jax.Array) -> jax.Array:
    """Top-2 routing: gates from top_k, dispatch with one_hot, experts with an einsum."""
    weights, chosen = lax.top_k(jax.nn.softmax(x @ router), 2)
    dispatch = jax.nn.one_hot(chosen, experts.shape[0]) * weights[..., None]
    out = jnp.einsum("tke,td,edf->tf", dispatch, x, experts)
    return jnp.sum(out**2)


def _sorted_experts_loss(experts: jax.Array, x: jax.Array, expert_of: jax.Array) -> jax.Array:
    """Mixture of experts the ragged way: sort tokens by expert, one ragged_dot."""
    order = jnp.argsort(expert_of)
    sizes = jnp.bincount(expert_of, length=experts.shape[0]).astype(jnp.int32)
    out = lax.ragged_dot(x[order], experts, sizes)
    return jnp.sum(out**2)


_MODELS: tuple[Entry, ...] = (
    ("model.mlp", _mlp_loss, (_sds((8, 16)), _sds((16, 4)), F, LABELS)),
    (
        "model.transformer_block",
        _transformer_block,
        (_sds((16, 8)), _sds((8, 24)), _sds((8, 8)), _sds((8, 16)), _sds((2, 4), jnp.int32)),
    ),
    ("model.cnn", _cnn_loss, (HWIO, _sds((3, 3, 4, 4)), NHWC)),
    ("model.rnn (checkpointed scan)", _rnn_loss, (_sds((8, 8)), _sds((5, 4, 8)))),
    ("model.moe (top_k, one_hot)", _moe_loss, (_sds((8, 4)), _sds((4, 8, 8)), F)),
    (
        "model.moe (argsort, ragged_dot)",
        _sorted_experts_loss,
        (_sds((4, 8, 8)), _sds((16, 8)), _sds((16,), jnp.int32)),
    ),
)

CORPUS: tuple[Entry, ...] = (
    *_ELEMENTWISE,
    *_SHAPES,
    *_REDUCTIONS,
    *_WINDOWS,
    *_CONTROL,
    *_LINALG,
    *_NN,
    *_RANDOM,
    *_NUMPY,
    *_MODELS,
)
"""(label, function, example arguments): each label names the public function it calls, with the
variant in parentheses; the arguments are ``jax.ShapeDtypeStruct``s (keys included)."""

NOT_IN_CORPUS: dict[str, str] = {
    # Collectives and named-axis queries: they need a mesh axis (shard_map, pmap, vmap's
    # axis_name), and the program planner places collectives itself.
    **dict.fromkeys(
        _words("""
        lax.all_gather lax.all_to_all lax.axis_index lax.axis_size lax.pbroadcast lax.pcast
        lax.pmax lax.pmean lax.pmin lax.ppermute lax.precv lax.psend lax.pshuffle lax.psum
        lax.psum_scatter lax.pswapaxes lax.ragged_all_to_all
        """),
        "a collective or named-axis query: needs a mesh axis",
    ),
    # Helpers that compute shapes, padding, dimension numbers or dtypes in Python: they take
    # no arrays and put nothing in a jaxpr.
    **dict.fromkeys(
        _words("""
        lax.broadcast_shapes lax.conv_dimension_numbers lax.conv_general_permutations
        lax.conv_general_shape_tuple lax.conv_shape_tuple lax.conv_transpose_shape_tuple
        lax.padtype_to_pads lax.reduce_window_shape_tuple lax.dtype
        nn.get_scaled_dot_general_config
        """),
        "a Python helper on shapes or dtypes: emits nothing",
    ),
    **dict.fromkeys(
        _words("""
        lax.ConvGeneralDilatedDimensionNumbers lax.DotDimensionNumbers lax.PrecisionLike
        """),
        "a type alias, not a function",
    ),
    "nn.initializers": "a module of initializer factories: seven of them are in the corpus",
}
"""Public callables of ``jax.lax``, ``jax.lax.linalg`` and ``jax.nn`` with no corpus entry, and
why. Everything else public there has an entry whose label starts with its name."""


def primitives(jaxpr: jcore.ClosedJaxpr | jcore.Jaxpr) -> set[str]:
    """The names of the primitives in a jaxpr and in every jaxpr nested in its equations'
    parameters (``cond``'s branches, ``scan``'s body, ``custom_jvp_call``'s function...)."""
    found: set[str] = set()
    _collect(jaxpr, found)
    return found


def _collect(jaxpr: jcore.ClosedJaxpr | jcore.Jaxpr, found: set[str]) -> None:
    inner = jaxpr.jaxpr if isinstance(jaxpr, jcore.ClosedJaxpr) else jaxpr
    for eqn in inner.eqns:
        found.add(eqn.primitive.name)
        for value in eqn.params.values():
            for sub in _jaxprs_in(value):
                _collect(sub, found)


def _jaxprs_in(value: Any) -> Iterable[jcore.ClosedJaxpr | jcore.Jaxpr]:
    if isinstance(value, jcore.ClosedJaxpr | jcore.Jaxpr):
        yield value
    elif isinstance(value, tuple | list):
        for item in value:
            yield from _jaxprs_in(item)


def _inexact(x: Any) -> bool:
    """Whether ``x`` (an array, a shape, a pytree of them) is all floating point or complex."""
    leaves = jax.tree.leaves(x)
    return bool(leaves) and all(
        hasattr(leaf, "dtype") and jnp.issubdtype(leaf.dtype, jnp.inexact) for leaf in leaves
    )


_NOT_DIFFERENTIABLE = (NotImplementedError, ValueError, TypeError)
"""What ``jax.grad`` raises where JAX defines no reverse-mode derivative: a missing rule
(``NotImplementedError``), a loop with traced bounds or a gradient ruled out for some argument
(``ValueError``), and transposes that break on an unusual signature (``TypeError``: ``clamp``
with scalar bounds, a variadic ``reduce`` with an integer operand)."""


def grad_jaxprs(
    fn: Callable[..., Any], args: tuple[Any, ...], out_shape: Any
) -> list[jcore.ClosedJaxpr]:
    """The jaxprs of ``jax.grad`` of the sum of ``fn``'s floating-point outputs (the real parts
    of complex ones): with respect to all its floating-point and complex arguments at once, or,
    where JAX cannot differentiate that, with respect to each of them alone that it can
    (``betainc`` has a gradient in ``x`` but not in ``a`` and ``b``). Empty where there is
    nothing to differentiate or no argument has a reverse-mode derivative."""
    argnums = tuple(i for i, a in enumerate(args) if _inexact(a))
    outputs = [i for i, leaf in enumerate(jax.tree.leaves(out_shape)) if _inexact(leaf)]
    if not argnums or not outputs:
        return []

    def loss(*xs: Any) -> jax.Array:
        leaves = jax.tree.leaves(fn(*xs))
        return sum((jnp.sum(jnp.real(leaves[i])) for i in outputs), jnp.float32(0))

    def trace(wrt: tuple[int, ...]) -> jcore.ClosedJaxpr:
        return jax.make_jaxpr(jax.grad(loss, argnums=wrt))(*args)

    try:
        return [trace(argnums)]
    except _NOT_DIFFERENTIABLE:
        pass
    found = []
    for i in argnums if len(argnums) > 1 else ():
        with contextlib.suppress(*_NOT_DIFFERENTIABLE):
            found.append(trace((i,)))
    return found


@functools.cache
def _first_labels() -> tuple[tuple[str, str], ...]:
    forward: dict[str, str] = {}
    backward: dict[str, str] = {}
    for label, fn, args in CORPUS:
        closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*args)
        for name in primitives(closed):
            forward.setdefault(name, label)
        for grad in grad_jaxprs(fn, args, out_shape):
            for name in primitives(grad):
                backward.setdefault(name, f"{label} [grad]")
    return tuple(sorted((backward | forward).items()))


def corpus_primitives() -> dict[str, str]:
    """Every primitive the corpus emits, sorted by name, mapped to the first corpus label whose
    function emits it, or, for a primitive only gradients emit, to the first label whose
    gradient does, with ``[grad]`` after it (``select_and_scatter_add`` maps to
    ``"lax.reduce_window (max pool) [grad]"``). Traces the whole corpus the first time (a few
    seconds), then answers from a cache."""
    return dict(_first_labels())
