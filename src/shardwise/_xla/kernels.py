"""The local computation on each device, chosen for speed by shape.

XLA's CPU reduction over a short minor dimension is slow, so when each output element sums
only a few products the contraction is unrolled into multiply-adds over slices, which XLA
fuses into one streaming loop; otherwise ``jnp.einsum`` (``dot_general``) is used. A sum
over the trailing indices of one array (``ij->``, ``ijk->i``) runs as a product with ones,
which XLA's CPU backend hands to its matrix-vector kernel (it keeps several sums going at
once and reads at the memory limit, where XLA's own reduction loop does not). On CPU
devices where the native kernels build, a dot product of two arrays along their trailing
indices (``nd,nd->n`` with long rows) runs as :func:`shardwise._xla.native.rowdot`, and a
plain matrix product (``mk,kn->mn``) in a program with a CPU device per core as
:func:`shardwise._xla.native.matmul` (OpenBLAS, one thread per device). Lowering picks them
(see :func:`native_kernel`); ``benchmarks/`` and the docs have the measurements behind each
choice. All give results equal to NumPy within the dtype's tolerance.
"""

from __future__ import annotations

import itertools
import math
import os
from typing import Any, Literal, TypeAlias

import jax
import jax.numpy as jnp

from shardwise._model.op import Op

Kernel: TypeAlias = Literal["unrolled", "ones", "rowdot", "matmul", "einsum"]

UNROLL_MAX = 8
"""Most products per output element that are unrolled (terms of the contraction). At 3 the
unrolled form is 4× faster than XLA's CPU reduction; past a few dozen terms the unrolled
program grows and dot_general catches up, so the cut is kept small."""


def choose_kernel(op: Op, sizes: dict[str, int]) -> Kernel:
    """``"unrolled"`` for a contraction of at most :data:`UNROLL_MAX` terms; ``"ones"`` for a
    longer sum over the trailing indices of one array; else ``"einsum"``.

    >>> choose_kernel(Op.parse("nd,nd->n"), {"n": 10**7, "d": 3})
    'unrolled'
    >>> choose_kernel(Op.parse("nd,nd->n"), {"n": 4000, "d": 10000})
    'einsum'
    >>> choose_kernel(Op.parse("ij->"), {"i": 10000, "j": 10000})
    'ones'
    """
    if not op.contracted or 0 in sizes.values():  # nothing summed, or nothing to sum
        return "einsum"
    terms = math.prod(sizes[i] for i in op.contracted)
    if terms <= UNROLL_MAX:
        return "unrolled"
    return "ones" if _trailing_sum(op) else "einsum"


def native_kernel(op: Op, sizes: dict[str, int], on_cpu: bool, devices: int = 1) -> Kernel:
    """:func:`choose_kernel`, with a native kernel of :mod:`shardwise._xla.native` in place of
    ``"einsum"`` on CPU devices where it is available (built on first need, so other
    programs never wait for the compiler): ``"rowdot"`` for a dot product along the
    trailing indices (:func:`row_dot`); ``"matmul"`` for a plain matrix product
    (:func:`mat_mul`) in a program that drives ``devices`` CPU devices in this process, at
    least one per core (each call runs on one thread).

    >>> native_kernel(Op.parse("nd,nd->n"), {"n": 4000, "d": 10000}, on_cpu=False)
    'einsum'
    >>> native_kernel(Op.parse("nd,nd->n"), {"n": 10**7, "d": 3}, on_cpu=True)
    'unrolled'
    >>> native_kernel(Op.parse("mk,kn->mn"), {"m": 64, "k": 64, "n": 64}, True, devices=1)
    'einsum'
    """
    kernel = choose_kernel(op, sizes)
    if kernel != "einsum" or not on_cpu or 0 in sizes.values():
        return kernel
    from shardwise._xla import native as _native

    if row_dot(op) and _native.available("rowdot"):
        return "rowdot"
    if mat_mul(op) and devices >= cores() and _native.available("matmul"):
        return "matmul"
    return kernel


def cores() -> int:
    """The CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def mat_mul(op: Op) -> bool:
    """Whether ``op`` is a plain matrix product, ``mk,kn->mn`` under any index names.

    >>> [mat_mul(Op.parse(e)) for e in ("ij,jk->ik", "ij,kj->ik", "ij,jk->ki")]
    [True, False, False]
    """
    if len(op.inputs) != 2 or len(op.output) != 2:
        return False
    a, b = op.inputs
    if len(a) != 2 or len(b) != 2 or len(set(a + b)) != 3:
        return False
    return b[0] == a[1] and op.output == a[0] + b[1]


def row_dot(op: Op) -> bool:
    """Whether ``op`` is a dot product of two arrays with one index string along every index
    after those it keeps, in order (``nd,nd->n``, ``bnd,bnd->bn``, ``ij,ij->``).

    >>> row_dot(Op.parse("nd,nd->n")), row_dot(Op.parse("nd,dn->n")), row_dot(Op.parse("nd,nd->d"))
    (True, False, False)
    """
    if len(op.inputs) != 2:
        return False
    a, b = op.inputs
    kept = len(op.output)
    return a == b and len(set(a)) == len(a) and a[:kept] == op.output and len(a) > kept


def _trailing_sum(op: Op) -> bool:
    """Whether ``op`` sums one array over indices that all come after the ones it keeps, in
    their order (so the array is (kept..., summed...) as it lies in memory)."""
    if len(op.inputs) != 1:
        return False
    (term,) = op.inputs
    kept = len(op.output)
    return len(set(term)) == len(term) and term[:kept] == op.output and len(term) >= 2


def ones_einsum(op: Op, x: jax.Array, precision: Any = None) -> jax.Array:
    """A sum over the trailing indices of ``x`` as its product with ones (a full sum adds
    up the sums of its leading index). Floating dtypes narrower than 32 bits use
    ``jnp.einsum`` (it accumulates them in float32).

    >>> import numpy as np
    >>> x = np.arange(24.0).reshape(2, 3, 4)
    >>> float(ones_einsum(Op.parse("ijk->"), x)), ones_einsum(Op.parse("ijk->i"), x).tolist()
    (276.0, [66.0, 210.0])
    """
    x = jnp.asarray(x)
    if x.dtype not in (jnp.float32, jnp.float64):
        return jnp.einsum(op.equation, x, precision=precision)
    kept = max(len(op.output), 1)
    summed = tuple(range(kept, x.ndim))
    ones = jnp.ones(x.shape[kept:], x.dtype)
    dims = ((summed, tuple(range(len(summed)))), ((), ()))
    sums = jax.lax.dot_general(x, ones, dims, precision=precision)
    return sums if op.output else jnp.sum(sums)


def rowdot_einsum(op: Op, x: jax.Array, y: jax.Array, precision: Any = None) -> jax.Array:
    """A :func:`row_dot` einsum by the native kernel, on both arrays seen as (rows, cols).
    Operands of other dtypes than float32 and float64, or of two dtypes, use ``jnp.einsum``.

    >>> import numpy as np
    >>> from shardwise._xla import native as _native
    >>> a = np.arange(24.0, dtype=np.float32).reshape(2, 3, 4)
    >>> not _native.available() or rowdot_einsum(Op.parse("ijk,ijk->i"), a, a).tolist() == [
    ...     506.0, 3818.0]
    True
    """
    from shardwise._xla import native as _native

    x, y = jnp.asarray(x), jnp.asarray(y)
    supported = _native.KERNELS["rowdot"].target(x.dtype) is not None
    if x.dtype != y.dtype or not supported or x.shape != y.shape:
        return jnp.einsum(op.equation, x, y, precision=precision)
    kept = x.shape[: len(op.output)]
    rows, cols = math.prod(kept), math.prod(x.shape[len(kept) :])
    return _native.rowdot(x.reshape(rows, cols), y.reshape(rows, cols)).reshape(kept)


def matmul_einsum(op: Op, a: jax.Array, b: jax.Array, precision: Any = None) -> jax.Array:
    """A :func:`mat_mul` einsum by the native kernel. Operands of other dtypes than float32
    and float64, or of two dtypes, use ``jnp.einsum``."""
    from shardwise._xla import native as _native

    a, b = jnp.asarray(a), jnp.asarray(b)
    if a.dtype != b.dtype or _native.KERNELS["matmul"].target(a.dtype) is None:
        return jnp.einsum(op.equation, a, b, precision=precision)
    return _native.matmul(a, b)


def _aligned(term: str, output: str, x: jax.Array) -> jax.Array:
    """``x`` (indices ``term``, all in ``output``) transposed to output order and broadcastable."""
    present = [i for i in output if i in term]
    x = jnp.transpose(x, [term.index(i) for i in present]) if present else x
    shape = [x.shape[present.index(i)] if i in present else 1 for i in output]
    return x.reshape(shape)


def unrolled_einsum(op: Op, *arrays: jax.Array) -> jax.Array:
    """The einsum as a sum, over every value of the contracted indices, of broadcast products;
    floats narrower than 32 bits are multiplied and added in float32, as ``jnp.einsum`` and
    NumPy accumulate them (added in float16, 2,055 ones and eight more came to 2,048), and
    the result rounded once.

    >>> import numpy as np
    >>> a = np.arange(6.0).reshape(2, 3)
    >>> np.asarray(unrolled_einsum(Op.parse("nd,nd->n"), a, a)).tolist()
    [5.0, 50.0]
    >>> h = np.full((1, 8), 2055 / 8, np.float16)
    >>> float(unrolled_einsum(Op.parse("nd,nd->n"), h, np.ones((1, 8), np.float16))[0])
    2056.0
    """
    dtype = jnp.result_type(*arrays)
    if jnp.issubdtype(dtype, jnp.floating) and jnp.dtype(dtype).itemsize < 4:
        wide = [jnp.asarray(x, jnp.float32) for x in arrays]
        return unrolled_einsum(op, *wide).astype(dtype)
    sizes: dict[str, int] = {}
    for term, x in zip(op.inputs, arrays, strict=True):
        sizes.update(zip(term, x.shape, strict=True))
    contracted = op.contracted
    total: jax.Array | None = None
    for values in itertools.product(*(range(sizes[i]) for i in contracted)):
        fixed = dict(zip(contracted, values, strict=True))
        product: jax.Array | None = None
        for term, x in zip(op.inputs, arrays, strict=True):
            for index in reversed([i for i in term if i in fixed]):
                x = jax.lax.index_in_dim(x, fixed[index], term.index(index), keepdims=False)
            rest = "".join(i for i in term if i not in fixed)
            factor = _aligned(rest, op.output, x)
            product = factor if product is None else product * factor
        assert product is not None
        total = product if total is None else total + product
    assert total is not None
    shape = tuple(sizes[i] for i in op.output)
    return jnp.broadcast_to(total, shape)


def local_einsum(op: Op, kernel: Kernel, *arrays: jax.Array, precision: Any = None) -> jax.Array:
    """Compute the einsum with the chosen kernel."""
    if kernel == "unrolled":
        return unrolled_einsum(op, *arrays)
    if kernel == "ones":
        (x,) = arrays
        return ones_einsum(op, x, precision=precision)
    if kernel == "rowdot":
        x, y = arrays
        return rowdot_einsum(op, x, y, precision=precision)
    if kernel == "matmul":
        a, b = arrays
        return matmul_einsum(op, a, b, precision=precision)
    return jnp.einsum(op.equation, *arrays, precision=precision)
