"""Computing a streamed run's chunks and landing their results on disk.

:class:`Program` computes a chunk's result from its input blocks (read by
:class:`~shardwise._data.reader.ChunkReader`); :class:`ChunkWriter` writes each chunk's result,
or adds it to the running sum, and records it in the manifest, with evidence of its bytes and
the checksums of the blocks it read of inputs that are not files, once it is durable.
"""

from __future__ import annotations

import math
import os
import threading
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from shardwise._data.budget import Chunking, sum_dtype
from shardwise._data.manifest import Manifest
from shardwise._data.sink import Sink
from shardwise._data.workfiles import accumulator_name, start_over
from shardwise._errors import ShardwiseError
from shardwise._files import NEW, open_regular
from shardwise._model.op import Op
from shardwise._runtime.hostmem import cpu_only, in_place

Pieces = list[tuple[int, np.ndarray]]
"""A chunk's result: blocks, each with where it starts along the streamed index."""


class ChunkWriter:
    """Lands each chunk's result in the output (or adds it to the running sum) and records it
    in the manifest once it is durable, with evidence of what was written: a checksum of
    sampled bytes of each chunk's result, or of all of the running sum's bytes. A resumed
    run checks that evidence first (:meth:`check_resumed`).

    ``bytes_read`` is the input read so far, for ``on_chunk`` (chunks done, chunk count, bytes
    read), called after each record (one record may hold several chunks). Once ``on_chunk``
    raises, it is not called again and ``stopped`` is set, so that the run stops.
    """

    def __init__(
        self,
        chunking: Chunking,
        sink: Sink,
        manifest: Manifest,
        on_chunk: Callable[[int, int, int], None] | None,
    ) -> None:
        self.chunking = chunking
        self.sink = sink
        self.manifest = manifest
        self.on_chunk = on_chunk
        self.stopped = False
        self.bytes_read = 0
        self._folder = sink.path.parent
        # chunks written, not yet durable nor recorded: their evidence and reads checksums
        self._landed: dict[int, tuple[int, list[int] | None]] = {}
        self._lock = threading.Lock()
        self._acc: np.ndarray | None = None
        if chunking.plan.accumulate:
            self._acc = self._load_sum()
            sink.extra = 2 * self._acc.nbytes  # the running sum is saved anew each chunk

    def _load_sum(self) -> np.ndarray:
        """The running sum recorded in the manifest, its checksum checked, or zeros."""
        acc, sink = self.manifest.accumulator, self.sink
        wide = sum_dtype(sink.dtype)
        if acc is None:
            return np.zeros(sink.shape, wide)
        try:
            with os.fdopen(open_regular(self._folder / acc["name"]), "rb") as f:
                arr = np.load(f, allow_pickle=False)
        except (OSError, ValueError, EOFError) as e:
            raise self._damaged(acc["name"], f"it cannot be read: {e}") from None
        crc = _crc(arr, self.manifest.done)
        if arr.shape != sink.shape or arr.dtype not in (wide, sink.dtype) or crc != acc["crc32"]:
            raise self._damaged(acc["name"], "it does not hold the sum of the chunks recorded")
        return np.ascontiguousarray(arr, dtype=wide)  # (kept in the output's type before)

    def check_resumed(self) -> None:
        """Refuse to resume when a chunk recorded as done does not hold what was written."""
        ch, sink = self.chunking, self.sink
        if ch.plan.accumulate:
            return
        axis = max(ch.out_axis, 0)
        row = math.prod(n for k, n in enumerate(sink.shape) if k != axis) * sink.dtype.itemsize
        for c in sorted(self.manifest.done):
            lo, hi = ch.span(c)
            if evidence(sink.reader(axis, lo, hi), (hi - lo) * row) != self.manifest.evidence(c):
                raise self._damaged(
                    sink.partial.name, f"chunk {c} does not hold the bytes recorded for it"
                )

    def _damaged(self, name: str, why: str) -> ShardwiseError:
        return ShardwiseError(
            f"{name} is damaged or was changed since the run recorded it ({why}); "
            f"{start_over(self.manifest.path)}."
        )

    def commit(self, c: int, pieces: Pieces, reads: list[int] | None = None) -> None:
        """Land chunk ``c``'s result; its record (with ``reads``, the checksum of the blocks it
        read of the inputs that are not files) follows once it is durable."""
        ch, sink = self.chunking, self.sink
        lo, hi = ch.span(c)
        if ch.plan.accumulate:  # the running sum is saved durably, then recorded, chunk by chunk
            assert self._acc is not None
            ((_, result),) = pieces
            self._acc = self._acc + result
            name = accumulator_name(sink.path, c, self.manifest.token)
            try:
                _save_array(self._folder / name, self._acc)
            except OSError as e:
                raise sink.failed(e) from None
            crc = _crc(self._acc, self.manifest.done | {c})
            self._record([c], accumulator={"name": name, "crc32": crc}, reads=_of(c, reads))
            return
        written = []
        for start, block in pieces:  # each block's rows past the chunk's end are padding
            if start < hi - lo:
                index = [slice(None)] * block.ndim
                index[ch.out_axis] = slice(0, hi - lo - start)
                part = np.ascontiguousarray(block[tuple(index)], dtype=sink.dtype)
                sink.write(ch.out_axis, lo + start, part, durable=False)
                written.append(part)
        if ch.out_axis != 0 and len(written) > 1:  # the chunk's bytes in C order
            written = [np.concatenate(written, axis=ch.out_axis)]
        crc = evidence(*_joined(written))
        with self._lock:
            self._landed[c] = (crc, reads)

    def sync(self) -> None:
        """Make every landed chunk durable with one flush, then record them all in the
        manifest (the commit point). Meant to run on its own thread while later chunks
        compute and land, so one flush covers many chunks and nobody waits for it."""
        with self._lock:
            batch = dict(self._landed)
            self._landed.clear()
        if batch:
            self.sink.sync()
            reads = {c: r for c, (_, r) in batch.items() if r is not None}
            evidence = {c: crc for c, (crc, _) in batch.items()}
            self._record(sorted(batch), evidence=evidence, reads=reads)

    def finish(self) -> None:
        """Write the running sum (if chunks were summed), record the run as complete and give
        the output its real name."""
        acc = self._acc
        if acc is not None:
            acc = acc.astype(self.sink.dtype, copy=False)
            self.sink.write(0, 0, acc if acc.ndim else acc.reshape(()))
        try:
            old = self.manifest.finish()
        except OSError as e:
            raise self.sink.failed(e) from None
        self.sink.finish()
        self._drop(old)

    def _record(
        self,
        chunks: list[int],
        evidence: dict[int, int] | None = None,
        accumulator: dict[str, Any] | None = None,
        reads: dict[int, list[int]] | None = None,
    ) -> None:
        try:
            old = self.manifest.record(chunks, evidence, accumulator, reads)
        except OSError as e:
            raise self.sink.failed(e) from None
        self._drop(old)
        if self.on_chunk is not None and not self.stopped:
            plan = self.chunking.plan
            try:
                self.on_chunk(len(self.manifest.done), plan.chunks, self.bytes_read)
            except BaseException:
                self.stopped = True
                raise

    def _drop(self, name: str | None) -> None:
        if name:
            (self._folder / name).unlink(missing_ok=True)


def _of(c: int, reads: list[int] | None) -> dict[int, list[int]] | None:
    return None if reads is None else {c: reads}


SPANS, SPAN = 32, 4096
"""A chunk's evidence is a checksum of this many spans of this many bytes of its result."""


def spans(length: int) -> list[tuple[int, int]]:
    """The spans of ``length`` bytes whose checksum is a chunk's evidence: all of them when
    few, else ``SPANS`` spans of ``SPAN`` bytes spread evenly, first and last included.

    >>> spans(100)
    [(0, 100)]
    >>> found = spans(10**6)
    >>> len(found), found[0], found[-1]
    (32, (0, 4096), (995904, 1000000))
    """
    if length <= SPANS * SPAN:
        return [(0, length)]
    step = (length - SPAN) / (SPANS - 1)
    return [(round(k * step), round(k * step) + SPAN) for k in range(SPANS)]


def evidence(read: Callable[[int, int], bytes], length: int) -> int:
    """The CRC-32 of ``length`` and of the :func:`spans` of ``length`` bytes, ``read(a, b)``
    giving bytes ``[a:b]``.

    >>> data = bytes(range(256)) * 1000
    >>> halves = [np.frombuffer(data[:1000], np.uint8), np.frombuffer(data[1000:], np.uint8)]
    >>> evidence(lambda a, b: data[a:b], len(data)) == evidence(*_joined(halves))
    True
    """
    crc = zlib.crc32(length.to_bytes(8, "little"))
    for a, b in spans(length):
        crc = zlib.crc32(read(a, b), crc)
    return crc


def _joined(blocks: list[np.ndarray]) -> tuple[Callable[[int, int], bytes], int]:
    """A reader of the bytes of ``blocks`` one after another, and their length."""
    views = [b.reshape(-1).view(np.uint8) for b in blocks]
    starts = [0]
    for v in views:
        starts.append(starts[-1] + len(v))

    def read(a: int, b: int) -> bytes:
        return b"".join(
            v[max(a - s, 0) : max(b - s, 0)].tobytes()
            for v, s in zip(views, starts, strict=False)
            if s < b and s + len(v) > a
        )

    return read, starts[-1]


def _crc(arr: np.ndarray, chunks: set[int]) -> int:
    """The CRC-32 of the list of ``chunks`` summed and of the sum's bytes: evidence that binds
    the running sum to the chunks the manifest records as done."""
    crc = zlib.crc32(",".join(map(str, sorted(chunks))).encode())
    return zlib.crc32(np.ascontiguousarray(arr).reshape(-1).view(np.uint8).data, crc)


def _save_array(path: Path, arr: np.ndarray) -> None:
    """Write ``arr`` as ``.npy`` to a new file (never over another, never through a link),
    durably (it is named in the manifest only afterwards); removed again if that fails."""
    fd = os.open(path, os.O_WRONLY | NEW, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            np.save(f, arr)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        path.unlink(missing_ok=True)
        raise


@dataclass(frozen=True, slots=True)
class Program:
    """The one compiled program every chunk runs, and how its result reaches the host."""

    fn: Callable[..., Any]
    targets: Sequence[Any]
    chunking: Chunking

    def __call__(self, blocks: list[np.ndarray]) -> Pieces:
        """A chunk's result, computed from its input ``blocks``, as host arrays."""
        import jax

        ch = self.chunking
        placed = [
            in_place(b, t, shape)
            for b, t, shape in zip(blocks, self.targets, ch.shapes, strict=True)
        ]
        result = self.fn(*placed)
        del placed
        pieces = None if ch.plan.accumulate else shard_blocks(result, ch.out_axis)
        if pieces is None:
            pieces = [(0, np.asarray(jax.device_get(result)))]
        return pieces


def compile_program(
    op: Op, chunking: Chunking, dtype: np.dtype[Any], jmesh: Any, layout: Any
) -> Program:
    """Plan and compile the program for every chunk's padded shapes."""
    import jax

    from shardwise._planner.layout import plan_arrays
    from shardwise._xla.explain import compile_sound
    from shardwise._xla.lower import shardings

    the_plan, _ = plan_arrays(
        op.equation,
        *(jax.ShapeDtypeStruct(shape, dtype) for shape in chunking.shapes),
        mesh=jmesh,
        layout=layout,
    )
    fn = compile_sound(the_plan, jmesh)  # refused if XLA left out a sum
    return Program(fn, shardings(the_plan, jmesh), chunking)


def shard_blocks(result: Any, axis: int) -> list[tuple[int, np.ndarray]] | None:
    """The devices' own blocks of ``result`` with where each starts along ``axis``, as host
    arrays without a copy (CPU devices), when every block is whole along the other axes;
    else None. Writing these spares assembling the chunk's result in a fresh host array."""
    if cpu_only(result.sharding, result.shape) is None:
        return None
    blocks: dict[int, np.ndarray] = {}
    for shard in result.addressable_shards:
        for k, (part, size) in enumerate(zip(shard.index, result.shape, strict=True)):
            if k != axis and part.indices(size) != (0, size, 1):
                return None
        start = shard.index[axis].indices(result.shape[axis])[0]
        blocks.setdefault(start, np.asarray(shard.data))  # replicas: write one
    return sorted(blocks.items(), key=lambda item: item[0])
