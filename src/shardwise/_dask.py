"""Dask arrays in, Dask arrays out: each block runs through JAX on the mesh.

``shardwise.einsum`` given a Dask array builds the same blockwise graph Dask's own
``einsum`` does — every combination of blocks computes its partial einsum, and partial
sums over contracted indices are added up by Dask — but each block's einsum runs sharded
on the mesh, with the planner's best layout. Under ``dask.distributed`` the blocks run on
the workers, each with its own devices (set ``SHARDWISE_CPU_DEVICES`` in the workers'
environment to simulate CPU devices there): the path for CPU clusters larger than one
machine. float64 blocks are computed in float64 (JAX's x64 mode, inside the block only).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from shardwise._errors import MissingExtraError
from shardwise._mesh import MeshSpec
from shardwise._op import Op


def is_dask(x: Any) -> bool:
    """Whether ``x`` is a Dask array."""
    return type(x).__module__.startswith("dask.") and hasattr(x, "chunks")


def _dask_array() -> Any:
    try:
        import dask.array as da
    except ImportError:
        raise MissingExtraError(
            "Dask arrays need dask; install the extra with pip install 'shardwise[dask]'."
        ) from None
    return da


@functools.lru_cache(maxsize=8)
def _local_mesh(spec: MeshSpec | None) -> Any:
    """The mesh on this process's devices (each Dask worker builds its own)."""
    from shardwise._mesh import build_mesh, mesh

    return mesh("auto") if spec is None else build_mesh(spec)


def _block(*blocks: np.ndarray, equation: str, spec: MeshSpec | None, extra: int) -> np.ndarray:
    """One block's einsum on the mesh; singleton axes stand for the contracted indices."""
    import jax

    from shardwise._api import einsum

    wide = any(np.dtype(b.dtype) == np.float64 for b in blocks)
    with jax.enable_x64(wide):
        out = einsum(equation, *blocks, mesh=_local_mesh(spec), layout="auto")
        result = np.asarray(out)
    return result.reshape(result.shape + (1,) * extra)


def dask_einsum(equation: str, *arrays: Any, mesh: Any = None) -> Any:
    """``einsum`` of Dask (and NumPy) arrays as a lazy Dask array; ``.compute()`` runs it.

    Args:
        equation: an einsum equation.
        *arrays: Dask arrays, or arrays Dask can wrap.
        mesh: a mesh description (``"x=2,y=4"``, a ``MeshSpec`` or a JAX mesh, taken by its
            shape); ``None`` uses every device of the process that runs each block.
    """
    da = _dask_array()
    op = Op.parse(equation)
    spec = None if mesh is None else MeshSpec.parse(mesh)
    op.sizes([x.shape for x in arrays])
    wrapped = [x if is_dask(x) else da.from_array(np.asarray(x)) for x in arrays]
    if len(op.inputs) > 1:
        # sum each operand over the indices no other operand or the output needs first (as
        # opt_einsum does): ij,jk-> becomes ij->j and jk->j, then j,j->, O(n²) not O(n³)
        terms = []
        for k, (term, x) in enumerate(zip(op.inputs, wrapped, strict=True)):
            others = "".join(t for j, t in enumerate(op.inputs) if j != k) + op.output
            kept = "".join(i for i in term if i in others)
            if kept != term:
                wrapped[k] = dask_einsum(f"{term}->{kept}", x, mesh=mesh)
            terms.append(kept)
        if terms != list(op.inputs):
            return dask_einsum(f"{','.join(terms)}->{op.output}", *wrapped, mesh=mesh)
    args: list[Any] = []
    for term, x in zip(op.inputs, wrapped, strict=True):
        args += [x, term]
    dtype = np.result_type(*(a.dtype for a in args[::2]))
    keep = op.output + op.contracted
    blocks = da.blockwise(
        _block,
        keep,
        *args,
        dtype=dtype,
        adjust_chunks={i: 1 for i in op.contracted},
        equation=op.equation,
        spec=spec,
        extra=len(op.contracted),
        concatenate=True,
        meta=np.empty((0,) * len(keep), dtype),  # so Dask never calls the block function here
    )
    if not op.contracted:
        return blocks
    return blocks.sum(axis=tuple(range(len(op.output), len(keep))), dtype=dtype)


def dask_mean(x: Any, mesh: Any = None) -> Any:
    """The mean of a Dask array, each block summed on the mesh."""
    letters = "abcdefghijklmnopqrstuvwxyz"[: x.ndim]
    return dask_einsum(f"{letters}->", x, mesh=mesh) / x.size
