"""The local computation on each device, chosen for speed by shape.

XLA's CPU reduction over a short minor dimension is slow: the tutorial's
(10⁷, 3) batched dot takes 33 ms as ``jnp.einsum`` on 8 simulated devices but
8 ms written as three multiply-adds, at the memory limit (measured on the 2-core
CI machine kind; see ``benchmarks/``). So when each output element sums only a
few products, the contraction is unrolled into multiply-adds over slices, which
XLA fuses into one streaming loop; otherwise ``jnp.einsum`` (``dot_general``)
is used. Both give results equal to NumPy within the dtype's tolerance.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Literal, TypeAlias

import jax
import jax.numpy as jnp

from shardwise._op import Op

Kernel: TypeAlias = Literal["unrolled", "einsum"]

UNROLL_MAX = 8
"""Most products per output element that are unrolled (terms of the contraction). At 3 the
unrolled form is 4× faster than XLA's CPU reduction; past a few dozen terms the unrolled
program grows and dot_general catches up, so the cut is kept small."""


def choose_kernel(op: Op, sizes: dict[str, int]) -> Kernel:
    """``"unrolled"`` for a contraction of at most :data:`UNROLL_MAX` terms, else ``"einsum"``.

    >>> choose_kernel(Op.parse("nd,nd->n"), {"n": 10**7, "d": 3})
    'unrolled'
    >>> choose_kernel(Op.parse("nd,nd->n"), {"n": 4000, "d": 10000})
    'einsum'
    """
    if not op.contracted:
        return "einsum"
    terms = math.prod(sizes[i] for i in op.contracted)
    return "unrolled" if terms <= UNROLL_MAX else "einsum"


def _aligned(term: str, output: str, x: jax.Array) -> jax.Array:
    """``x`` (indices ``term``, all in ``output``) transposed to output order and broadcastable."""
    present = [i for i in output if i in term]
    x = jnp.transpose(x, [term.index(i) for i in present]) if present else x
    shape = [x.shape[present.index(i)] if i in present else 1 for i in output]
    return x.reshape(shape)


def unrolled_einsum(op: Op, *arrays: jax.Array) -> jax.Array:
    """The einsum as a sum, over every value of the contracted indices, of broadcast products.

    >>> import numpy as np
    >>> a = np.arange(6.0).reshape(2, 3)
    >>> np.asarray(unrolled_einsum(Op.parse("nd,nd->n"), a, a)).tolist()
    [5.0, 50.0]
    """
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
    return jnp.einsum(op.equation, *arrays, precision=precision)
