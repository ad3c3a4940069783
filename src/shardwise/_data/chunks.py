"""Reading a streamed run's chunks of input and landing their results on disk.

:class:`ChunkReader` fills each chunk's input blocks (or maps them, on CPU devices) and lets
the mapped pages go after use; :class:`ChunkWriter` writes each chunk's result, or adds it to
the running sum, and records it in the manifest once it is durable.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from shardwise._data.budget import StreamPlan
from shardwise._data.manifest import Manifest
from shardwise._data.sources import Sink, Source
from shardwise._model.op import Op
from shardwise._runtime.hostmem import aligned_empty

Pieces = list[tuple[int, np.ndarray]]
"""A chunk's result: blocks, each with where it starts along the streamed index."""


@dataclass(frozen=True, slots=True)
class Chunking:
    """Where a run's chunks lie in its inputs and output: the fixed context of the run.

    Attributes:
        plan: how the inputs are cut into chunks.
        sources: the inputs.
        axes: each input's axis along the streamed index.
        shapes: each input's shape in a chunk, the last chunk padded to it (so one compiled
            program serves every chunk).
        out_axis: the output's axis along the streamed index (-1 when chunks are summed).
        mappable: whether chunks are memory-mapped ``.npy`` rows used in place.
    """

    plan: StreamPlan
    sources: tuple[Source, ...]
    axes: tuple[int, ...]
    shapes: tuple[tuple[int, ...], ...]
    out_axis: int
    mappable: bool

    @classmethod
    def of(cls, op: Op, sources: Sequence[Source], plan: StreamPlan, cpu: bool) -> Chunking:
        """The chunking of ``op``'s inputs by ``plan``; ``cpu``: every device is a CPU (on
        CPU devices a full chunk of ``.npy`` inputs is computed straight from the page cache)."""
        axes = tuple(t.index(plan.index) for t in op.inputs)
        shapes = []
        for s, axis in zip(sources, axes, strict=True):
            shape = list(s.shape)
            shape[axis] = plan.chunk
            shapes.append(tuple(shape))
        out_axis = op.output.index(plan.index) if not plan.accumulate else -1
        mappable = all(s.mappable and a == 0 for s, a in zip(sources, axes, strict=True)) and cpu
        return cls(plan, tuple(sources), axes, tuple(shapes), out_axis, mappable)

    def span(self, c: int) -> tuple[int, int]:
        """Chunk ``c``'s start and stop along the streamed index."""
        return c * self.plan.chunk, min((c + 1) * self.plan.chunk, self.plan.total)


class ChunkReader:
    """Reads each chunk's input blocks: into two warm buffers per input, used in turn (chunk
    c+1 is read into one while chunk c computes from the other; fresh pages cost more to
    fault in than to fill), or, when mappable, as memory maps of the rows."""

    def __init__(self, chunking: Chunking) -> None:
        self.chunking = chunking
        self._buffers: list[list[np.ndarray]] = [[], []]

    def read(self, c: int, slot: int) -> list[np.ndarray]:
        """Chunk ``c``'s block of each input, read into buffer ``slot`` (0 or 1)."""
        ch = self.chunking
        lo, hi = ch.span(c)
        if ch.mappable:  # the last chunk's missing rows are padded per device when placed
            return [s.map_rows(lo, hi) for s in ch.sources]
        if not self._buffers[slot]:
            self._buffers[slot] = [
                aligned_empty(shape, s.dtype)
                for shape, s in zip(ch.shapes, ch.sources, strict=True)
            ]
        blocks = []
        for k, s in enumerate(ch.sources):
            buf = self._buffers[slot][k]
            s.read(ch.axes[k], lo, hi, out=buf)
            if hi - lo < ch.plan.chunk:  # pad the last chunk to split evenly; zeros add nothing
                tail = [slice(None)] * buf.ndim
                tail[ch.axes[k]] = slice(hi - lo, None)
                buf[tuple(tail)] = 0
            blocks.append(buf)
        return blocks

    @staticmethod
    def release(mapped: list[np.ndarray]) -> None:
        """Let the pages of mapped blocks go from this process's memory."""
        for rows in mapped:
            Source.release_rows(rows)


class ChunkWriter:
    """Lands each chunk's result in the output (or adds it to the running sum) and records it
    in the manifest once it is durable.

    ``bytes_read`` is the input read so far, for ``on_chunk`` (chunks done, chunk count, bytes
    read), called after each record.
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
        self.bytes_read = 0
        self._folder = sink.path.parent
        self._landed: list[int] = []  # chunks written but not yet durable nor in the manifest
        self._lock = threading.Lock()
        self._acc: np.ndarray | None = None
        if chunking.plan.accumulate:
            name = manifest.accumulator
            self._acc = np.load(self._folder / name) if name else np.zeros(sink.shape, sink.dtype)

    def commit(self, c: int, pieces: Pieces) -> None:
        """Land chunk ``c``'s result; its record follows once it is durable."""
        ch = self.chunking
        lo, hi = ch.span(c)
        if ch.plan.accumulate:  # the running sum is saved durably, then recorded, chunk by chunk
            assert self._acc is not None
            ((_, result),) = pieces
            self._acc = self._acc + result
            name = f"{self.sink.path.name}.acc.{c}.npy"
            _save_array(self._folder / name, self._acc)
            self._record([c], accumulator=name)
            return
        for start, block in pieces:  # each block's rows past the chunk's end are padding
            if start < hi - lo:
                index = [slice(None)] * block.ndim
                index[ch.out_axis] = slice(0, hi - lo - start)
                self.sink.write(ch.out_axis, lo + start, block[tuple(index)], durable=False)
        with self._lock:
            self._landed.append(c)

    def sync(self) -> None:
        """Make every landed chunk durable with one flush, then record them all in the
        manifest (the commit point). Meant to run on its own thread while later chunks
        compute and land, so one flush covers many chunks and nobody waits for it."""
        with self._lock:
            batch = self._landed[:]
            self._landed.clear()
        if batch:
            self.sink.sync()
            self._record(batch)

    def finish(self) -> None:
        """Write the running sum (if chunks were summed), give the output its real name and
        record the run as complete."""
        acc = self._acc
        if acc is not None:
            self.sink.write(0, 0, acc if acc.ndim else acc.reshape(()))
        self.sink.finish()
        self._drop(self.manifest.finish())

    def _record(self, chunks: list[int], accumulator: str | None = None) -> None:
        old = self.manifest.record(chunks, accumulator)
        if self.on_chunk is not None:
            plan = self.chunking.plan
            self.on_chunk(len(self.manifest.done), plan.chunks, self.bytes_read)
        self._drop(old)

    def _drop(self, name: str | None) -> None:
        if name:
            (self._folder / name).unlink(missing_ok=True)


def _save_array(path: Path, arr: np.ndarray) -> None:
    """Write ``arr`` as ``.npy`` durably (it is named in the manifest only afterwards)."""
    with open(path, "wb") as f:
        np.save(f, arr)
        f.flush()
        os.fsync(f.fileno())
