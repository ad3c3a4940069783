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
import json
import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from shardwise._data.sources import Sink, Source, open_source
from shardwise._errors import ArgumentError, ShapeError, ShardwiseError
from shardwise._model.mesh import MeshSpec
from shardwise._model.op import Op
from shardwise._model.units import format_bytes, parse_bytes
from shardwise._runtime.hostmem import aligned_empty, cpu_only, in_place

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
        total: that index's size.
        chunk: its size in one chunk (a multiple of the mesh's device count).
        chunks: number of chunks.
        chunk_bytes: host memory one chunk needs, all buffers counted.
        fixed_bytes: host memory independent of the chunk size (the accumulator).
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


def plan_stream(
    op: Op,
    sources: Sequence[Source],
    devices: int,
    budget: int,
    chunk: int | str = "auto",
) -> StreamPlan:
    """Choose the chunk index and size, or say why the budget cannot work and what would.

    >>> from shardwise._data.sources import Source
    >>> src = Source("a", (1000, 3), np.dtype("float32"), "numpy")
    >>> p = plan_stream(Op.parse("nd,nd->n"), [src, src], devices=8, budget=32768)
    >>> (p.index, p.chunk, p.chunks, p.peak_bytes <= 32768)
    ('n', 384, 3, True)
    """
    sizes = op.sizes([s.shape for s in sources])
    shared = [i for i in op.contracted if all(i in t for t in op.inputs)]
    candidates = [*op.batch, *shared]
    if candidates:
        # the longest index, preferring the leading axis (read with plain pread) and batch
        index = max(
            candidates, key=lambda i: (sizes[i], all(t[0] == i for t in op.inputs), i in op.batch)
        )
        accumulate = index not in op.batch
    else:
        raise ArgumentError(
            f"cannot stream {op.equation!r}: chunks run along an index that every input has "
            "(a batch index, or a contracted one); this equation has none."
        )
    width = sources[0].dtype.itemsize
    per_row = sum(math.prod(sizes[i] for i in t if i != index) * width for t in op.inputs) * BUFFERS
    out_rest = math.prod(sizes[i] for i in op.output if i != index) * width
    fixed = 2 * out_rest if accumulate else 0
    if not accumulate:
        per_row += OUT_COPIES * out_rest
    total = sizes[index]
    # each device's rows start on a 64-byte boundary (16 rows of any dtype), so the CPU
    # devices can use the read buffers in place instead of copying them
    granule = devices * ALIGN_ROWS
    smallest = granule
    need = fixed + smallest * per_row
    if isinstance(chunk, str):
        if chunk != "auto":
            raise ArgumentError(f"chunk {chunk!r} is neither 'auto' nor a whole number.")
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
            f"{devices} devices, needs {format_bytes(need)}); use --budget "
            f"{format_bytes(need * 1.05)} or more."
        )
    return StreamPlan(index, accumulate, total, rows, -(-total // rows), rows * per_row, fixed)


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


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder if str(folder) else ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _save_array(path: Path, arr: np.ndarray) -> None:
    with open(path, "wb") as f:
        np.save(f, arr)
        f.flush()
        os.fsync(f.fileno())


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
    import jax

    from shardwise._api import _jax_mesh, _supported, plan_einsum, shardings, wide
    from shardwise._xla.explain import compile_sound

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
    dtype = _supported(sources[0].dtype, "the inputs")
    scope.enter_context(wide(dtype))  # int64 and float64 are computed in 64 bits
    jmesh = _jax_mesh(mesh)
    spec = MeshSpec.parse(jmesh)
    limit = parse_bytes(budget)
    target = Path(out)
    manifest_path = target.with_name(target.name + ".manifest.json")
    fingerprints = [s.fingerprint(checksum) for s in sources]
    sizes = op.sizes([s.shape for s in sources])
    out_shape = tuple(sizes[i] for i in op.output)
    sink = Sink(target, out_shape, dtype)

    manifest: dict[str, Any] | None = None
    if manifest_path.exists():
        manifest = json.loads(manifest_path.read_text())
        _check_same(manifest, op, fingerprints, out_shape, dtype, checksum, manifest_path)
    if target.exists():
        if manifest is not None and manifest.get("complete"):
            plan = StreamPlan(**manifest["plan"])
            return StreamResult(target, plan.chunks, 0, plan.chunks, 0.0, 0, plan)
        raise ArgumentError(
            f"{str(target)!r} already exists and no finished run of this "
            "command wrote it; remove it or choose another output."
        )
    if manifest is not None and sink.partial.exists():
        plan = StreamPlan(**manifest["plan"])
        if plan.peak_bytes > limit:
            raise ArgumentError(
                f"the interrupted run used chunks needing {format_bytes(plan.peak_bytes)}, "
                f"over the budget of {format_bytes(limit)}; resume with --budget "
                f"{format_bytes(plan.peak_bytes)}, or delete {sink.partial.name} and "
                f"{manifest_path.name} to start over."
            )
        sink.open_existing()
    else:
        plan = plan_stream(op, sources, spec.size, limit, chunk)
        sink.create()
        manifest = {
            "equation": op.equation,
            "inputs": fingerprints,
            "out_shape": list(out_shape),
            "dtype": dtype.name,
            "plan": _plan_json(plan),
            "done": [],
            "accumulator": None,
            "complete": False,
        }
        _write_json(manifest_path, manifest)
    assert manifest is not None

    done = set(manifest["done"])
    acc: np.ndarray | None = None
    if plan.accumulate:
        acc_name = manifest.get("accumulator")
        acc = np.load(target.parent / acc_name) if acc_name else np.zeros(out_shape, dtype)
    axis_of = {k: t.index(plan.index) for k, t in enumerate(op.inputs)}
    out_axis = op.output.index(plan.index) if not plan.accumulate else -1
    todo = [c for c in range(plan.chunks) if c not in done]
    chunk_layout = {plan.index: spec.names} if layout is None else layout
    start_time = time.perf_counter()
    bytes_read = 0

    shapes = []  # every chunk's padded shape per input: one compiled program serves them all
    for k, s in enumerate(sources):
        shape = list(s.shape)
        shape[axis_of[k]] = plan.chunk
        shapes.append(tuple(shape))
    # two warm buffers per input, used in turn: chunk c+1 is read into one while chunk c
    # computes from the other (fresh pages cost more to fault in than to fill)
    buffers: list[list[np.ndarray]] = [[], []]

    # on CPU devices a full chunk of .npy inputs is computed straight from the page cache
    mappable = all(s.mappable and axis_of[k] == 0 for k, s in enumerate(sources)) and all(
        d.platform == "cpu" for d in jmesh.devices.flat
    )

    def read(c: int, slot: int) -> list[np.ndarray]:
        lo, hi = c * plan.chunk, min((c + 1) * plan.chunk, plan.total)
        if mappable:  # the last chunk's missing rows are padded per device when placed
            return [s.map_rows(lo, hi) for s in sources]
        if not buffers[slot]:
            buffers[slot] = [
                aligned_empty(shape, s.dtype) for shape, s in zip(shapes, sources, strict=True)
            ]
        blocks = []
        for k, s in enumerate(sources):
            buf = buffers[slot][k]
            s.read(axis_of[k], lo, hi, out=buf)
            if hi - lo < plan.chunk:  # pad the last chunk to split evenly; zeros add nothing
                tail = [slice(None)] * buf.ndim
                tail[axis_of[k]] = slice(hi - lo, None)
                buf[tuple(tail)] = 0
            blocks.append(buf)
        return blocks

    def release(mapped: list[np.ndarray]) -> None:
        for rows in mapped:
            Source.release_rows(rows)

    landed: list[int] = []  # chunks written but not yet durable nor in the manifest
    lock = threading.Lock()

    def record(batch: list[int]) -> None:
        done.update(batch)
        manifest["done"] = sorted(done)
        _write_json(manifest_path, manifest)
        if on_chunk is not None:
            on_chunk(len(done), plan.chunks, bytes_read)

    def sync() -> None:
        """Make every landed chunk durable with one flush, then record them all in the
        manifest (the commit point). Runs on its own thread while later chunks compute and
        land, so the disk flushes many chunks at once and nobody waits for it."""
        with lock:
            batch = landed[:]
            landed.clear()
        if batch:
            sink.sync()
            record(batch)

    def commit(c: int, pieces: list[tuple[int, np.ndarray]]) -> None:
        """Land chunk ``c``'s result, given as blocks and where each starts along the streamed
        index; its record follows once it is durable."""
        nonlocal acc
        lo, hi = c * plan.chunk, min((c + 1) * plan.chunk, plan.total)
        if plan.accumulate:  # the running sum is saved durably, then recorded, chunk by chunk
            assert acc is not None
            ((_, result),) = pieces
            acc = acc + result
            name = f"{target.name}.acc.{c}.npy"
            _save_array(target.parent / name, acc)
            old = manifest.get("accumulator")
            manifest["accumulator"] = name
            record([c])
            if old:
                (target.parent / old).unlink(missing_ok=True)
            return
        for start, block in pieces:  # each block's rows past the chunk's end are padding
            if start < hi - lo:
                index = [slice(None)] * block.ndim
                index[out_axis] = slice(0, hi - lo - start)
                sink.write(out_axis, lo + start, block[tuple(index)], durable=False)
        with lock:
            landed.append(c)

    # four stages overlap: reading chunk c+1, computing chunk c, writing chunk c-1 and
    # flushing what was written before; each runs in order on its own thread
    with (
        ThreadPoolExecutor(max_workers=1) as reader,
        ThreadPoolExecutor(max_workers=1) as writer,
        ThreadPoolExecutor(max_workers=1) as syncer,
    ):
        pending = reader.submit(read, todo[0], 0) if todo else None
        if todo:  # compile the one program every chunk runs while the first chunk is read
            the_plan, _ = plan_einsum(
                op.equation,
                *(jax.ShapeDtypeStruct(shape, dtype) for shape in shapes),
                mesh=jmesh,
                layout=chunk_layout,
            )
            fn = compile_sound(the_plan, jmesh)  # refused if XLA left out a sum
            targets = shardings(the_plan, jmesh)
        writing = None
        flushes: list[Future[None]] = []
        for n, c in enumerate(todo):
            assert pending is not None
            blocks = pending.result()
            pending = reader.submit(read, todo[n + 1], (n + 1) % 2) if n + 1 < len(todo) else None
            bytes_read += sum(b.nbytes for b in blocks)
            placed = [
                in_place(b, t, shape) for b, t, shape in zip(blocks, targets, shapes, strict=True)
            ]
            result = fn(*placed)
            del placed
            pieces = None if plan.accumulate else _shard_blocks(result, out_axis)
            if pieces is None:
                pieces = [(0, np.asarray(jax.device_get(result)))]
            del result
            if mappable:  # on the reader's thread, before it maps the chunk after next
                reader.submit(release, blocks)
            del blocks
            if writing is not None:
                writing.result()  # at most one result waits to be written (bounded memory)
                for finished in [f for f in flushes if f.done()]:
                    finished.result()  # a failed flush (disk full) stops the run here
                    flushes.remove(finished)
                flushes.append(syncer.submit(sync))
            writing = writer.submit(commit, c, pieces)
            del pieces
        if writing is not None:
            writing.result()
        flushes.append(syncer.submit(sync))
        for f in flushes:
            f.result()
    if plan.accumulate:
        assert acc is not None
        sink.write(0, 0, acc) if acc.ndim else _write_scalar(sink, acc)
    sink.finish()
    manifest["complete"] = True
    old = manifest.get("accumulator")
    manifest["accumulator"] = None
    _write_json(manifest_path, manifest)
    if old:
        (target.parent / old).unlink(missing_ok=True)
    return StreamResult(
        target,
        plan.chunks,
        len(todo),
        plan.chunks - len(todo),
        time.perf_counter() - start_time,
        bytes_read,
        plan,
    )


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


def _write_scalar(sink: Sink, value: np.ndarray) -> None:
    sink.write(0, 0, value.reshape(()))


def _plan_json(plan: StreamPlan) -> dict[str, Any]:
    return {f: getattr(plan, f) for f in StreamPlan.__slots__}


def _check_same(
    manifest: dict[str, Any],
    op: Op,
    fingerprints: list[dict[str, Any]],
    out_shape: tuple[int, ...],
    dtype: np.dtype[Any],
    checksum: bool,
    path: Path,
) -> None:
    """Refuse to resume when the command or its inputs changed since the manifest was written."""
    start_over = f"delete {path.name} and the partial output to start over"
    if (
        manifest.get("equation") != op.equation
        or manifest.get("out_shape") != list(out_shape)
        or manifest.get("dtype") != dtype.name
    ):
        raise ArgumentError(
            f"{path.name} belongs to another run ({manifest.get('equation')!r}, shape "
            f"{manifest.get('out_shape')}, {manifest.get('dtype')}); choose another output or "
            f"{start_over}."
        )
    before = manifest.get("inputs", [])
    for k, (old, new) in enumerate(zip(before, fingerprints, strict=False)):
        keys = ["shape", "dtype", "size", "mtime_ns"] + (["sha256"] if checksum else [])
        changed = [key for key in keys if key in old and old.get(key) != new.get(key)]
        if changed:
            raise ShardwiseError(
                f"input {k} ({new['name']}) changed since the last run ({', '.join(changed)} "
                f"differ); restore it, or {start_over}."
            )
