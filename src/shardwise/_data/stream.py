"""Out-of-core execution: stream inputs larger than memory through the mesh, within a memory
budget, resumably.

The inputs are cut into chunks along one index — a batch index (each chunk gives its own
slice of the output) or, where there is none, a contracted index every input shares (the
chunks' partial sums are added up). Each chunk is read while the previous one computes
(double buffering; on CPU devices a ``.npy`` chunk is memory-mapped instead and used in
place), split over every device of the mesh, and its result is written on another thread
and flushed to disk on a third, before a manifest records it as done. The manifest is the
single commit point: an interrupted run leaves ``OUT.partial`` and ``OUT.manifest.json``,
never a file that looks complete, and the same command resumes where it stopped.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from shardwise._data.budget import StreamPlan, plan_stream
from shardwise._data.chunks import Chunking, ChunkReader, ChunkWriter, Pieces
from shardwise._data.manifest import Manifest, manifest_path
from shardwise._data.sources import Sink, Source, open_source
from shardwise._errors import ArgumentError, ShapeError
from shardwise._model.mesh import MeshSpec
from shardwise._model.op import Op
from shardwise._model.units import format_bytes, parse_bytes
from shardwise._runtime.hostmem import cpu_only, in_place


@dataclass(frozen=True, slots=True)
class StreamResult:
    """What a streamed run did."""

    out: Path
    chunks: int
    computed: int
    skipped: int
    seconds: float
    bytes_read: int
    plan: StreamPlan

    @property
    def throughput(self) -> float:
        """Bytes of input read per second in this run."""
        return self.bytes_read / self.seconds if self.seconds else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "out": str(self.out),
            "chunks": self.chunks,
            "computed": self.computed,
            "skipped": self.skipped,
            "seconds": self.seconds,
            "bytes_read": self.bytes_read,
            "throughput_Bps": self.throughput,
            "index": self.plan.index,
            "chunk": self.plan.chunk,
            "accumulate": self.plan.accumulate,
            "predicted_peak_bytes": self.plan.peak_bytes,
        }


def peak_rss() -> int | None:
    """This process's peak resident memory in bytes (Linux ``VmHWM``: the address space made
    by exec, unlike ``ru_maxrss``, which keeps the peak of a forked parent's copy)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def stream(
    equation: str,
    *inputs: Any,
    mesh: Any = "auto",
    out: str | os.PathLike[str],
    budget: str | int = "2GiB",
    chunk: int | str = "auto",
    checksum: bool = False,
    layout: Any = None,
    on_chunk: Callable[[int, int, int], None] | None = None,
) -> StreamResult:
    """Run an einsum over inputs of any size, a chunk at a time, within a memory budget.

    Args:
        equation: e.g. ``"nd,nd->n"``.
        *inputs: NumPy arrays, ``.npy`` paths, Zarr arrays or directories, Dask arrays.
        mesh: the mesh each chunk is split over (every device by default).
        out: ``.npy`` file or Zarr directory (any other name) to write.
        budget: host memory for the data, e.g. ``"1GiB"``; the runtime's own overhead (JAX,
            compiled programs) comes on top.
        chunk: size of a chunk along the streamed index, or ``"auto"`` (the largest that fits).
        checksum: compare inputs by SHA-256 on resume, not only by size and mtime.
        layout: each chunk's layout on the mesh: by default the streamed index split over
            every mesh axis; ``"auto"`` for the planner's best for the chunk's shapes; or an
            index layout such as ``"n=x,d=y"`` (it must divide the chunk).
        on_chunk: called after each chunk with (chunks done, chunk count, bytes read).

    Returns:
        What was done; a finished run repeated does nothing (``computed == 0``).
    """
    with contextlib.ExitStack() as scope:
        return _stream(
            scope, equation, inputs, mesh, out, budget, chunk, checksum, layout, on_chunk
        )


def _stream(
    scope: contextlib.ExitStack,
    equation: str,
    inputs: Sequence[Any],
    mesh: Any,
    out: str | os.PathLike[str],
    budget: str | int,
    chunk: int | str,
    checksum: bool,
    layout: Any,
    on_chunk: Callable[[int, int, int], None] | None,
) -> StreamResult:
    """:func:`stream`, with ``scope`` to hold JAX's 64-bit mode for 64-bit inputs."""
    from shardwise._xla.dtypes import supported, wide
    from shardwise._xla.lower import jax_mesh

    op = Op.parse(equation)
    sources = [open_source(x, k) for k, x in enumerate(inputs)]
    op.sizes([s.shape for s in sources])
    dtypes = {s.dtype for s in sources}
    if len(dtypes) > 1:
        names = ", ".join(f"{s.name} is {s.dtype.name}" for s in sources)
        raise ShapeError(
            f"inputs of {op.equation!r} must share one dtype, but {names}; "
            "convert them to one dtype first."
        )
    dtype = supported(sources[0].dtype, "the inputs")
    scope.enter_context(wide(dtype))  # int64 and float64 are computed in 64 bits
    jmesh = jax_mesh(mesh)
    spec = MeshSpec.parse(jmesh)
    sizes = op.sizes([s.shape for s in sources])
    sink = Sink(Path(out), tuple(sizes[i] for i in op.output), dtype)
    begun = _begin(op, sources, sink, spec.size, parse_bytes(budget), chunk, checksum)
    if isinstance(begun, StreamResult):
        return begun
    manifest, plan = begun, begun.plan
    cpu = all(d.platform == "cpu" for d in jmesh.devices.flat)
    chunking = Chunking.of(op, sources, plan, cpu)
    writer = ChunkWriter(chunking, sink, manifest, on_chunk)
    todo = manifest.todo()
    chunk_layout = {plan.index: spec.names} if layout is None else layout
    start_time = time.perf_counter()
    compile_ = functools.partial(_compile, op, chunking, dtype, jmesh, chunk_layout)
    _run_chunks(todo, ChunkReader(chunking), writer, compile_)
    writer.finish()
    return StreamResult(
        sink.path,
        plan.chunks,
        len(todo),
        plan.chunks - len(todo),
        time.perf_counter() - start_time,
        writer.bytes_read,
        plan,
    )


def _begin(
    op: Op,
    sources: Sequence[Source],
    sink: Sink,
    devices: int,
    limit: int,
    chunk: int | str,
    checksum: bool,
) -> Manifest | StreamResult:
    """The manifest of the run writing ``sink``: the interrupted run's, checked, to resume,
    or a new one; or the result of a finished run, which has nothing left to do."""
    target = sink.path
    path = manifest_path(target)
    fingerprints = [s.fingerprint(checksum) for s in sources]
    manifest = Manifest.load(path)
    if manifest is not None:
        manifest.check(op, fingerprints, sink.shape, sink.dtype, checksum)
    if target.exists():
        if manifest is not None and manifest.complete:
            plan = manifest.plan
            return StreamResult(target, plan.chunks, 0, plan.chunks, 0.0, 0, plan)
        raise ArgumentError(
            f"{str(target)!r} already exists and no finished run of this "
            "command wrote it; remove it or choose another output."
        )
    if manifest is not None and sink.partial.exists():
        plan = manifest.plan
        if plan.peak_bytes > limit:
            raise ArgumentError(
                f"the interrupted run used chunks needing {format_bytes(plan.peak_bytes)}, "
                f"over the budget of {format_bytes(limit)}; resume with --budget "
                f"{format_bytes(plan.peak_bytes)}, or delete {sink.partial.name} and "
                f"{path.name} to start over."
            )
        sink.open_existing()
        return manifest
    plan = plan_stream(op, sources, devices, limit, chunk)
    sink.create()
    return Manifest.start(path, op, fingerprints, sink.shape, sink.dtype, plan)


@dataclass(frozen=True, slots=True)
class _Program:
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
        pieces = None if ch.plan.accumulate else _shard_blocks(result, ch.out_axis)
        if pieces is None:
            pieces = [(0, np.asarray(jax.device_get(result)))]
        return pieces


def _compile(op: Op, chunking: Chunking, dtype: np.dtype[Any], jmesh: Any, layout: Any) -> _Program:
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
    return _Program(fn, shardings(the_plan, jmesh), chunking)


def _run_chunks(
    todo: list[int],
    reader: ChunkReader,
    writer: ChunkWriter,
    compile_: Callable[[], _Program],
) -> None:
    """Compute the chunks ``todo`` in four overlapping stages: reading chunk c+1, computing
    chunk c, writing chunk c-1 and flushing what was written before; each stage runs in
    order on its own thread (computing on this one)."""
    with (
        ThreadPoolExecutor(max_workers=1) as reads,
        ThreadPoolExecutor(max_workers=1) as writes,
        ThreadPoolExecutor(max_workers=1) as syncs,
    ):
        pending = reads.submit(reader.read, todo[0], 0) if todo else None
        program = compile_() if todo else None  # while the first chunk is read
        writing: Future[None] | None = None
        flushes: list[Future[None]] = []
        for n, c in enumerate(todo):
            assert pending is not None and program is not None
            blocks = pending.result()
            pending = (
                reads.submit(reader.read, todo[n + 1], (n + 1) % 2) if n + 1 < len(todo) else None
            )
            writer.bytes_read += sum(b.nbytes for b in blocks)
            pieces = program(blocks)
            if reader.chunking.mappable:  # on the reader's thread, before it maps the next
                reads.submit(reader.release, blocks)
            del blocks
            if writing is not None:
                writing.result()  # at most one result waits to be written (bounded memory)
                for finished in [f for f in flushes if f.done()]:
                    finished.result()  # a failed flush (disk full) stops the run here
                    flushes.remove(finished)
                flushes.append(syncs.submit(writer.sync))
            writing = writes.submit(writer.commit, c, pieces)
            del pieces
        if writing is not None:
            writing.result()
        flushes.append(syncs.submit(writer.sync))
        for f in flushes:
            f.result()


def _shard_blocks(result: Any, axis: int) -> list[tuple[int, np.ndarray]] | None:
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
