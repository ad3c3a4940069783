"""How a streamed einsum is cut into chunks, whether they fit the memory budget, and where
each chunk lies in the inputs and the output."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardwise._data.sources import Source
from shardwise._errors import ArgumentError
from shardwise._model.op import Op
from shardwise._model.units import format_bytes
from shardwise._xla.dtypes import mean_dtypes

ALIGN_ROWS = 16
"""Rows per device in a chunk come in multiples of this, so every device's block starts on a
64-byte boundary whatever the dtype."""

BUFFERS = 3
"""Copies of each input chunk alive at once: the one computing (on CPU devices its device
copy is host memory too), and the next one being read. (Mapped ``.npy`` chunks need two.)"""

OUT_COPIES = 3
"""Copies of each chunk's result alive at once: the devices' result, its host copy (none on
CPU devices, whose blocks are written as they are), and the previous chunk's result being
written."""


@dataclass(frozen=True, slots=True)
class StreamPlan:
    """How a streamed einsum is cut into chunks, checked against the budget before any work.

    Attributes:
        index: the index the chunks run along.
        accumulate: whether chunks are partial sums (a contracted index) to be added up.
        total: that index's size (0 when an input is empty: then there is no chunk).
        chunk: its size in one chunk (a multiple of the mesh's device count).
        chunks: number of chunks.
        chunk_bytes: host memory one chunk needs, all buffers counted.
        fixed_bytes: host memory independent of the chunk size (the running sum, and the
            inputs without the chunk index, read whole).
    """

    index: str
    accumulate: bool
    total: int
    chunk: int
    chunks: int
    chunk_bytes: int
    fixed_bytes: int

    @property
    def peak_bytes(self) -> int:
        """Predicted host memory for the data (the runtime's own overhead comes on top)."""
        return self.chunk_bytes + self.fixed_bytes


@dataclass(frozen=True, slots=True)
class Chunking:
    """Where a run's chunks lie in its inputs and output: the fixed context of the run.

    Attributes:
        plan: how the inputs are cut into chunks.
        sources: the inputs.
        axes: each input's axis along the streamed index (None where it has none: it is read
            whole, and the same for every chunk).
        shapes: each input's shape in a chunk, the last chunk padded to it (so one compiled
            program serves every chunk).
        out_axis: the output's axis along the streamed index (-1 when chunks are summed).
        mappable: whether chunks are memory-mapped ``.npy`` rows used in place.
    """

    plan: StreamPlan
    sources: tuple[Source, ...]
    axes: tuple[int | None, ...]
    shapes: tuple[tuple[int, ...], ...]
    out_axis: int
    mappable: bool

    @classmethod
    def of(cls, op: Op, sources: Sequence[Source], plan: StreamPlan, cpu: bool) -> Chunking:
        """The chunking of ``op``'s inputs by ``plan``; ``cpu``: every device is a CPU (on
        CPU devices a full chunk of ``.npy`` inputs is computed straight from the page cache)."""
        axes = tuple(t.index(plan.index) if plan.index in t else None for t in op.inputs)
        shapes = []
        for s, axis in zip(sources, axes, strict=True):
            shape = list(s.shape)
            if axis is not None:
                shape[axis] = plan.chunk
            shapes.append(tuple(shape))
        out_axis = op.output.index(plan.index) if not plan.accumulate else -1
        mappable = all(s.mappable and a == 0 for s, a in zip(sources, axes, strict=True)) and cpu
        return cls(plan, tuple(sources), axes, tuple(shapes), out_axis, mappable)

    def span(self, c: int) -> tuple[int, int]:
        """Chunk ``c``'s start and stop along the streamed index."""
        return c * self.plan.chunk, min((c + 1) * self.plan.chunk, self.plan.total)


def plan_stream(
    op: Op,
    sources: Sequence[Source],
    devices: int,
    budget: int,
    chunk: int | str = "auto",
    first_axis: bool = False,
) -> StreamPlan:
    """Choose the chunk index and size, or say why the budget cannot work and what would.

    Chunks run along an index of the output (each chunk gives a slice of it; an input without
    that index is read whole, once, for every chunk) or along a contracted index every input
    has (the chunks' results are added up): the longest whose smallest chunk fits the budget.
    ``first_axis``: the output is written along its first axis only (a ``.npy`` file), so
    chunks that each give a slice of it run along that axis.

    >>> import numpy as np
    >>> from shardwise._data.sources import Source
    >>> src = Source("a", (1000, 3), np.dtype("float32"), "numpy")
    >>> p = plan_stream(Op.parse("nd,nd->n"), [src, src], devices=8, budget=32768)
    >>> (p.index, p.chunk, p.chunks, p.peak_bytes <= 32768)
    ('n', 384, 3, True)
    >>> w = Source("w", (3,), np.dtype("float32"), "numpy")
    >>> plan_stream(Op.parse("nd,d->n"), [src, w], devices=8, budget=32768).index
    'n'
    """
    sizes = op.sizes([s.shape for s in sources])
    # each device's rows start on a 64-byte boundary (16 rows of any dtype), so the CPU
    # devices can use the read buffers in place instead of copying them
    granule = devices * ALIGN_ROWS
    if 0 in sizes.values():
        return _empty_plan(op, sizes, granule)
    candidates, hint = _candidates(op, sizes, granule, first_axis)
    if not candidates:
        raise ArgumentError(
            f"cannot stream {op.equation!r}: chunks run along an index of the output, or a "
            "contracted index that every input has; this equation has none."
        )
    width, sum_width = sources[0].dtype.itemsize, sum_dtype(sources[0].dtype).itemsize
    costs = {i: _costs(op, sizes, width, i, sum_width) for i in candidates}

    def preference(i: str) -> tuple[bool, int, bool, bool]:
        """Fitting the budget first; then the longest index, preferring the leading axis
        (read with plain pread) and batch."""
        fits = costs[i][0] + granule * costs[i][1] <= budget
        return fits, sizes[i], all(t[:1] == i for t in op.inputs), i in op.batch

    index = max(candidates, key=preference)
    accumulate = index not in op.output
    fixed, per_row = costs[index]
    total = sizes[index]
    smallest = granule
    need = fixed + smallest * per_row
    chunk = parse_chunk(chunk)
    if isinstance(chunk, str):
        rows = (budget - fixed) // per_row // granule * granule if budget > fixed else 0
        rows = min(rows, -(-total // granule) * granule)
    else:
        rows = int(chunk)
        if rows < 1 or rows % granule:
            raise ArgumentError(
                f"chunk {rows} must be a positive multiple of {granule} ({ALIGN_ROWS} rows for "
                f"each of the {devices} devices it is split over)."
            )
        need = fixed + rows * per_row
    if rows < smallest or fixed + rows * per_row > budget:
        raise ArgumentError(
            f"a memory budget of {format_bytes(budget)} cannot hold the smallest chunk of "
            f"{op.equation!r} ({max(rows, smallest)} along index {index!r}, split over "
            f"{devices} devices, needs {format_bytes(need)}); give a budget of "
            f"{format_bytes(need * 1.05)} or more (--host-memory from the command line).{hint}"
        )
    return StreamPlan(index, accumulate, total, rows, -(-total // rows), rows * per_row, fixed)


def _candidates(
    op: Op, sizes: dict[str, int], granule: int, first_axis: bool
) -> tuple[list[str], str]:
    """The indices a run may be cut along (see :func:`plan_stream`), and what to say where a
    ``.npy`` output (``first_axis``) keeps it from its long index (:func:`_first_axis`)."""
    shared = [i for i in op.contracted if all(i in t for t in op.inputs)]
    candidates = [*op.batch, *shared, *op.free]
    return _first_axis(op, sizes, candidates, granule) if first_axis else (candidates, "")


def padding_note(op: Op, sources: Sequence[Source], plan: StreamPlan, devices: int) -> str:
    """What to tell a run on a ``.npy`` output that its chunks pad a short index (``""`` when
    they do not): the output, written along its first axis only, kept the run from its long
    index, so the chunks run along one shorter than a chunk, and every padded row of it
    holds the long index's length of zeros, read, computed and counted in the budget.

    >>> import numpy as np
    >>> from shardwise._data.sources import Source
    >>> x, w = Source("x", (20, 8), np.dtype("float32"), "numpy"), Source(
    ...     "w", (8, 1000), np.dtype("float32"), "numpy")
    >>> op = Op.parse("nd,dk->nk")
    >>> plan = plan_stream(op, [x, w], devices=8, budget=2**30, first_axis=True)
    >>> padding_note(op, [x, w], plan, devices=8)[:52]
    "the last chunk of 20 rows along 'n' is padded to 128"
    """
    if not plan.chunks or plan.total % plan.chunk == 0:
        return ""
    sizes = op.sizes([s.shape for s in sources])
    _, hint = _candidates(op, sizes, devices * ALIGN_ROWS, first_axis=True)
    if not hint:  # (a short last chunk of a run along its long index costs a chunk at most)
        return ""
    last = plan.total - (plan.chunks - 1) * plan.chunk
    return (
        f"the last chunk of {last:,} rows along {plan.index!r} is padded to {plan.chunk:,} "
        f"({plan.chunk - last:,} rows of zeros, read and computed like the rest).{hint}"
    )


def _empty_plan(op: Op, sizes: dict[str, int], granule: int) -> StreamPlan:
    """The plan of a run with an empty input: no chunk, along an index of size 0 — of the
    output where it has one (the output is empty too), else a contracted one (the result is
    the sum of nothing, zeros, written as the running sum).

    >>> plan = _empty_plan(Op.parse("nd,nd->"), {"n": 0, "d": 3}, 128)
    >>> plan.index, plan.accumulate, plan.chunks
    ('n', True, 0)
    """
    zero = [i for i, n in sizes.items() if n == 0]
    index = next((i for i in zero if i in op.output), zero[0])
    return StreamPlan(index, index not in op.output, 0, granule, 0, 0, 0)


def _first_axis(
    op: Op, sizes: dict[str, int], candidates: list[str], granule: int
) -> tuple[list[str], str]:
    """The ``candidates`` a ``.npy`` output (written along its first axis only) leaves, and
    what to say where that keeps a run from its long index (its chunks then pad a short one
    many times over)."""
    kept = [i for i in candidates if i not in op.output or op.output.index(i) == 0]
    if not candidates:  # (said by the caller: nothing to stream along)
        return kept, ""
    longest = max(candidates, key=lambda i: sizes[i])
    if longest in kept or (kept and max(sizes[i] for i in kept) >= granule):
        return kept, ""
    return kept, (
        f" A .npy output is written along its first axis only, so the run cannot be cut "
        f"along {longest!r} ({sizes[longest]:,} long): write the output as .zarr, or put "
        f"{longest!r} first in the output's indices."
    )


def parse_chunk(chunk: int | str) -> int | str:
    """``chunk`` as ``"auto"`` or a whole number (given as one, or as text: ``"256"``).

    >>> parse_chunk("256"), parse_chunk(" auto"), parse_chunk(-128)
    (256, 'auto', -128)
    """
    if isinstance(chunk, str):
        text = chunk.strip()
        if text == "auto":
            return text
        try:
            return int(text)
        except ValueError:
            raise ArgumentError(f"chunk {chunk!r} is neither 'auto' nor a whole number.") from None
    if isinstance(chunk, bool) or not isinstance(chunk, numbers.Integral):
        raise ArgumentError(f"chunk {chunk!r} is neither 'auto' nor a whole number.")
    return int(chunk)  # (a NumPy integer too)


def _costs(
    op: Op, sizes: dict[str, int], width: int, index: str, sum_width: int
) -> tuple[int, int]:
    """Host bytes a run along ``index`` needs whatever its chunk size, and for each row of a
    chunk: :data:`BUFFERS` of each input's chunk (an input without ``index`` is read once,
    whole) and :data:`OUT_COPIES` of the result's, or twice the running sum when the chunks
    are added up (``width``: bytes per element; ``sum_width``: the running sum's,
    :func:`sum_dtype`)."""
    fixed = per_row = 0
    for term in op.inputs:
        rest = math.prod(sizes[i] for i in term if i != index) * width
        if index in term:
            per_row += BUFFERS * rest
        else:
            fixed += rest
    out_rest = math.prod(sizes[i] for i in op.output if i != index) * width
    if index in op.output:
        per_row += OUT_COPIES * out_rest
    else:
        fixed += 2 * out_rest // width * sum_width
    return fixed, per_row


def sum_dtype(dtype: np.dtype) -> np.dtype:
    """The type a running sum of chunks of ``dtype`` is kept in: float32 for floats narrower
    (bfloat16, float16), whose running sum stops growing once it is large beside each chunk's
    part (a bfloat16 sum of 1,563 chunks of about 32 each stuck at 16,384, where the sum was
    50,000); the type itself for any other.

    >>> import ml_dtypes
    >>> sum_dtype(np.dtype(ml_dtypes.bfloat16)), sum_dtype(np.dtype("int8"))
    (dtype('float32'), dtype('int8'))
    """
    summed, given = mean_dtypes(dtype)  # (a mean gives a float in its own type, not an int)
    return summed if given == dtype else dtype


def plan_from_json(data: dict[str, Any], bad: Callable[[str], Exception]) -> StreamPlan:
    """A plan read back from a manifest, its fields' types and arithmetic checked; ``bad(why)``
    is the error to raise otherwise.

    >>> plan_from_json({"index": "n", "accumulate": False, "total": 10, "chunk": 4,
    ...                 "chunks": 3, "chunk_bytes": 96, "fixed_bytes": 0}, ValueError).chunks
    3
    >>> plan_from_json({"index": "n", "accumulate": False, "total": 10, "chunk": 4,
    ...                 "chunks": 9, "chunk_bytes": 96, "fixed_bytes": 0}, ValueError)
    Traceback (most recent call last):
    ValueError: the plan cuts 10 into 9 chunks of 4
    """
    fields = StreamPlan.__slots__
    counts = [data.get(f) for f in fields if f not in ("index", "accumulate")]
    if (
        set(data) != set(fields)
        or not isinstance(data["index"], str)
        or len(data["index"]) != 1
        or not isinstance(data["accumulate"], bool)
        or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts)
    ):
        raise bad(f"the plan is {data!r}")
    total, chunk, chunks = data["total"], data["chunk"], data["chunks"]
    if chunk < 1 or chunks != -(-total // chunk):
        raise bad(f"the plan cuts {total} into {chunks} chunks of {chunk}")
    return StreamPlan(**data)


def check_resumable(plan: StreamPlan, devices: int, limit: int, again: str) -> None:
    """Refuse to resume a ``plan`` that the budget ``limit`` or the ``devices`` cannot hold
    (``again``: what to delete to start over, :func:`~shardwise._data.manifest.start_over`)."""
    if plan.peak_bytes > limit:
        raise ArgumentError(
            f"the interrupted run used chunks needing {format_bytes(plan.peak_bytes)}, "
            f"over the budget of {format_bytes(limit)}; resume with a budget of "
            f"{format_bytes(plan.peak_bytes)} (--host-memory from the command line), "
            f"or {again}."
        )
    if plan.chunk % devices:
        raise ArgumentError(
            f"the interrupted run cut chunks of {plan.chunk}, which do not split over "
            f"{devices} devices; resume on the mesh it ran on, or {again}."
        )
