"""Dask arrays in, Dask arrays out: each block runs through JAX on the mesh.

``shardwise.einsum`` given a Dask array builds the same blockwise graph Dask's own
``einsum`` does — every combination of blocks computes its partial einsum, and partial
sums over contracted indices are added up by Dask — but each block's einsum runs in JAX
on the mesh's devices. A large block is sharded over the whole mesh with the planner's
best layout; a small one (under :data:`SPLIT_MIN_BYTES` per device) runs whole on one
device, the devices taking blocks in turn, because a collective per block costs more than
a small block's compute (``benchmarks/`` has the figures). A block that
is summed whole (``data.mean()``) is not even copied: its 64-byte-aligned part is used in
place by its device, and the few elements before and after it are added on the host; a
whole-array sum takes its blocks in groups, two per device, so that the devices sum them
at once (:func:`_grouped_sum`).
Under ``dask.distributed`` the blocks run on
the workers, each with its own devices (set ``SHARDWISE_CPU_DEVICES`` in the workers'
environment to simulate CPU devices there): the path for CPU clusters larger than one
machine. float64 blocks are computed in float64 (JAX's x64 mode, inside the block only).
"""

from __future__ import annotations

import itertools
import math
import os
from typing import Any

import numpy as np

from shardwise._caches import cached
from shardwise._errors import ShapeError
from shardwise._extras import require
from shardwise._model.mesh import MeshSpec
from shardwise._model.op import Op


def is_dask(x: Any) -> bool:
    """Whether ``x`` is a Dask array."""
    return type(x).__module__.startswith("dask.") and hasattr(x, "chunks")


def _dask_array() -> Any:
    return require("dask.array", "Dask arrays")


@cached(maxsize=8)
def _local_mesh(spec: MeshSpec | None) -> Any:
    """The mesh on this process's devices (each Dask worker builds its own, with
    ``SHARDWISE_CPU_DEVICES`` simulated CPU devices if its environment sets that)."""
    from shardwise._model.mesh import build_mesh, mesh
    from shardwise._runtime.devices import apply_env

    if _in_worker():
        apply_env()
    return mesh("auto") if spec is None else build_mesh(spec)


SPLIT_MIN_BYTES = 4 << 20
"""A block is sharded over the mesh only when each device's share is at least this."""

_turns = itertools.count()
"""Which device takes the next small block (blocks run in turn on every device)."""


def _next_device(mesh: Any) -> Any:
    """The device whose turn it is to take a whole block."""
    devices = mesh.devices.flat
    return devices[next(_turns) % len(devices)]


@cached(maxsize=64)
def _program(
    equation: str, shapes: tuple[tuple[int, ...], ...], extra: int, on_cpu: bool = False
) -> Any:
    """The jitted local einsum for blocks of ``shapes`` on one device (a CPU device if
    ``on_cpu``), with ``extra`` singleton axes appended, so that a block is one dispatch."""
    import jax

    from shardwise._xla.kernels import local_einsum, native_kernel

    op = Op.parse(equation)
    kernel = native_kernel(op, op.sizes(list(shapes)), on_cpu)

    def block(*xs: Any) -> Any:
        out = local_einsum(op, kernel, *xs)
        return out.reshape(out.shape + (1,) * extra)

    return jax.jit(block)


@cached(maxsize=64)
def _sum_program(extra: int) -> Any:
    """The jitted sum of a block's aligned part plus the sum of the rest, as ``extra``
    singleton axes."""
    import jax

    # in the block's own type, as NumPy's einsum adds (JAX's sum widens an int8 to int32, and
    # the sum had then depended on how much of the block lay before its first aligned byte)
    return jax.jit(
        lambda middle, rest: (
            (middle.sum(dtype=middle.dtype) + rest).astype(middle.dtype).reshape((1,) * extra)
        )
    )


def _sum_in_place(block: np.ndarray, device: Any, extra: int) -> Any:
    """The sum of every element of ``block``, its aligned part used in place by ``device``
    (a JAX array, perhaps still being computed)."""
    import jax

    flat = np.ascontiguousarray(block).reshape(-1)
    margin = 64 // flat.itemsize if 64 % flat.itemsize == 0 else 0
    if not margin or flat.size <= 2 * margin:
        return _program("i->", (flat.shape,), extra)(jax.device_put(flat, device))
    skip = (-flat.ctypes.data % 64) // flat.itemsize  # elements before the first aligned one
    stop = skip + flat.size - margin  # the same length whatever the alignment: one program
    rest = np.concatenate([flat[:skip], flat[stop:]]).sum(dtype=flat.dtype)
    return _sum_program(extra)(jax.device_put(flat[skip:stop], device), rest)


def _on_mesh(equation: str, blocks: tuple[np.ndarray, ...], mesh: Any) -> np.ndarray:
    """One block's einsum sharded over ``mesh`` with the planner's best layout for it."""
    from shardwise._planner.layout import plan_arrays
    from shardwise._xla.check import ensure_close
    from shardwise._xla.explain import compile_sound
    from shardwise._xla.lower import jitted, place

    plan, _ = plan_arrays(equation, *blocks, mesh=mesh, layout="auto")
    if plan.empty:  # nothing to compute: NumPy's zeros (or an empty result)
        return np.zeros(plan.output_shape, plan.dtype)
    compile_sound(plan, mesh)  # refused if XLA left out a sum
    result = np.asarray(jitted(plan, mesh)(*place(plan, mesh, blocks)))
    if os.environ.get("SHARDWISE_CHECK", "") == "1":  # as shardwise.einsum does
        ensure_close(plan, blocks, result)
    return result


def _in_worker() -> bool:
    """Whether this runs on a ``dask.distributed`` worker (whose results travel by pickle)."""
    try:
        from distributed import get_worker

        get_worker()
    except (ImportError, ValueError):
        return False
    return True


def _block(
    *blocks: np.ndarray, equation: str, spec: MeshSpec | None, extra: int, fetch: bool = True
) -> Any:
    """One block's einsum in JAX on the mesh's devices; singleton axes stand for the
    contracted indices. With ``fetch=False`` (partial sums, in this process) the result is
    the JAX array, returned while its devices may still compute: Dask moves on to the next
    block at once, and :func:`_add` waits for all of them together."""
    import jax

    from shardwise._xla.dtypes import result_dtype, wide

    mesh = _local_mesh(spec)
    share = max(b.nbytes for b in blocks) // mesh.devices.size
    op = Op.parse(equation)
    dtype = result_dtype(blocks)  # NumPy's, as Dask's own einsum gives
    with wide(dtype):
        if share >= SPLIT_MIN_BYTES or mesh.devices.size == 1:
            whole = _on_mesh(equation, blocks, mesh)
            return whole.reshape(whole.shape + (1,) * extra)
        blocks = tuple(b if b.dtype == dtype else b.astype(dtype) for b in blocks)
        device = _next_device(mesh)
        if len(op.inputs) == 1 and not op.output:
            result = _sum_in_place(blocks[0], device, extra)
        else:
            placed = [jax.device_put(b, device) for b in blocks]
            shapes = tuple(b.shape for b in blocks)
            on_cpu = device.platform == "cpu"
            result = _program(op.equation, shapes, extra, on_cpu)(*placed)
    return np.asarray(result) if fetch or _in_worker() else result


GROUP_BYTES = 256 << 20
"""Most bytes of blocks one task of a grouped sum holds (see :func:`_grouped_sum`)."""


def _sum_group(*blocks: np.ndarray, spec: MeshSpec | None) -> np.ndarray:
    """The sum of every element of several blocks, each summed on its own device and all
    of them at once."""
    from shardwise._xla.dtypes import wide_blocks

    mesh = _local_mesh(spec)
    with wide_blocks(blocks):
        return _add([_sum_in_place(b, _next_device(mesh), 0) for b in blocks])


def _client_active() -> bool:
    """Whether a ``dask.distributed`` client will run the graph (blocks then stay where the
    cluster keeps them: grouping them would move them between workers)."""
    try:
        from distributed import default_client

        default_client()  # type: ignore[no-untyped-call]
    except (ImportError, ValueError):
        return False
    return True


def _grouped_sum(x: Any, spec: MeshSpec | None, dtype: Any) -> Any | None:
    """The sum of every element of ``x`` as a few tasks that each take a group of blocks —
    two per device — and sum them on the devices at once, or ``None`` where that does not
    apply (large blocks, which are split over the mesh instead; a distributed cluster).

    With one task per block, JAX's dispatch would come on top of Dask's own scheduling of
    every block; grouped, a whole-array sum schedules a few tasks."""
    from dask.delayed import delayed

    da = _dask_array()
    devices = _local_mesh(spec).devices.size
    block_bytes = max(1, math.prod(max(c) for c in x.chunks) * x.dtype.itemsize)
    if _client_active() or block_bytes // devices >= SPLIT_MIN_BYTES or x.npartitions < 2:
        return None
    size = max(1, min(2 * devices, GROUP_BYTES // block_bytes))
    blocks = list(x.to_delayed().ravel())
    partials = [
        delayed(_sum_group, pure=True)(*blocks[k : k + size], spec=spec)
        for k in range(0, len(blocks), size)
    ]
    total = delayed(_add, pure=True)(partials)
    return da.from_delayed(total, shape=(), dtype=dtype)


def _keep(x: Any, axis: Any = None, keepdims: bool = True) -> Any:
    """A block's partial sum as it is (the chunk step of the reduction over blocks)."""
    return x


def _add(parts: Any, axis: tuple[int, ...] = (), keepdims: bool = False) -> np.ndarray:
    """The sum of partial sums (nested lists of NumPy or JAX arrays) over ``axis``, in their
    dtype, as NumPy's einsum adds (a plain ``sum`` would widen int8 and bool to int64)."""
    while isinstance(parts, list) and parts and isinstance(parts[0], list):
        parts = [p for group in parts for p in group]
    items = parts if isinstance(parts, list) else [parts]
    total = np.asarray(items[0]).copy()
    for p in items[1:]:
        total += np.asarray(p)
    return total if keepdims else total.sum(axis=axis, dtype=total.dtype)


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
    for k, x in enumerate(arrays):  # (a mask's result: NaN sizes, which had escaped raw)
        if any(isinstance(n, float) and math.isnan(n) for n in getattr(x, "shape", ())):
            raise ShapeError(
                f"operand {k} of {equation!r} has chunks of unknown size {x.shape} (a Dask "
                "array selected by a mask); call .compute_chunk_sizes() on it first."
            )
    op.sizes([x.shape for x in arrays])
    wrapped = [x if is_dask(x) else da.from_array(np.asarray(x)) for x in arrays]
    if len(op.inputs) > 1:
        # sum each operand over the indices no other operand or the output needs first (as
        # opt_einsum does): ij,jk-> becomes ij->j and jk->j, then j,j->, O(n²) not O(n³)
        # in the type of the whole product, as NumPy's einsum computes (a bool operand summed
        # alone had been a logical or: "l,->" of [T, T, T, F] and 2.0 had given 2.0, not 6.0)
        common = np.result_type(*(x.dtype for x in wrapped))
        terms = []
        for k, (term, x) in enumerate(zip(op.inputs, wrapped, strict=True)):
            others = "".join(t for j, t in enumerate(op.inputs) if j != k) + op.output
            kept = "".join(i for i in term if i in others)
            if kept != term:
                wrapped[k] = dask_einsum(f"{term}->{kept}", x.astype(common), mesh=mesh)
            terms.append(kept)
        if terms != list(op.inputs):
            return dask_einsum(f"{','.join(terms)}->{op.output}", *wrapped, mesh=mesh)
    args: list[Any] = []
    for term, x in zip(op.inputs, wrapped, strict=True):
        args += [x, term]
    dtype = np.result_type(*(a.dtype for a in args[::2]))
    if len(op.inputs) == 1 and not op.output and len(set(op.inputs[0])) == len(op.inputs[0]):
        grouped = _grouped_sum(wrapped[0], spec, dtype)
        if grouped is not None:
            return grouped
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
        fetch=not op.contracted,
        concatenate=True,
        meta=np.empty((0,) * len(keep), dtype),  # so Dask never calls the block function here
    )
    if not op.contracted:
        return blocks
    # the partial sums are added up by a tree reduction that fetches them only when it needs
    # them: every block's computation has been started by then
    return da.reduction(
        blocks,
        chunk=_keep,
        combine=_add,
        aggregate=_add,
        axis=tuple(range(len(op.output), len(keep))),
        dtype=dtype,
        concatenate=False,
        meta=np.empty((0,) * len(op.output), dtype),
    )


def dask_mean(x: Any, mesh: Any = None) -> Any:
    """The mean of a Dask array, each block summed on the mesh, in the types NumPy's ``mean``
    sums and gives it in (:func:`~shardwise._xla.dtypes.mean_dtypes`; each block converted
    as it is read)."""
    from shardwise._xla.dtypes import mean_dtypes

    summed, given = mean_dtypes(x.dtype)
    letters = "abcdefghijklmnopqrstuvwxyz"[: x.ndim]
    total = dask_einsum(f"{letters}->", x.astype(summed), mesh=mesh)
    return (total / x.size).astype(given)
