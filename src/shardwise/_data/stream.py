"""Out-of-core execution: stream inputs larger than memory through the mesh, within a memory
budget, resumably.

The inputs are cut into chunks along one index — an index of the output (each chunk gives its
own slice of it; an input without that index is read whole, once) or a contracted index every
input shares (the chunks' partial sums are added up). Each chunk is read while the previous
one computes (double buffering; a ``.npy`` chunk nobody can truncate is memory-mapped instead
and used in place on CPU devices), split over every device of the mesh, and its result is
written on another thread and flushed to disk on a third, before a manifest records it as
done. The manifest is the single commit point: an interrupted run leaves ``OUT.partial`` and
``OUT.manifest.json``, never a file that looks complete, and the same command resumes where it
stopped.

One run at a time writes an output (an exclusive lock on ``OUT.lock``; a finished run in a
folder that cannot be written is only read back, without one). Its work files are
created exclusively and never through symbolic links; it removes only files it created; and a
resume trusts nothing it reads back (the manifest, the partial output, the inputs: files by
their ctime too, other inputs by the blocks done chunks read): a resumed run's result is a
fresh run's on the inputs as they are now, or the resume is refused.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import secrets
import time
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from shardwise._data.budget import Chunking, check_resumable, padding_note, parse_chunk, plan_stream
from shardwise._data.chunks import ChunkWriter, Program, compile_program
from shardwise._data.finished import finished, read_back
from shardwise._data.manifest import Manifest
from shardwise._data.reader import ChunkReader
from shardwise._data.result import StreamResult
from shardwise._data.result import peak_rss as peak_rss
from shardwise._data.sink import Sink, is_zarr, remove
from shardwise._data.sources import Source, open_source
from shardwise._data.workfiles import lock_path, manifest_path, own_files, start_over
from shardwise._errors import ArgumentError, ShapeError, ShardwiseError, ShardwiseWarning
from shardwise._files import TEMPORARY_SUFFIX, LockHeld, exclusive_lock, identity
from shardwise._model.mesh import MeshSpec
from shardwise._model.op import Op
from shardwise._model.units import parse_bytes
from shardwise._runtime.distributed import multi_process, process_index


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
        mesh: the mesh each chunk is split over (by default the one set with
            ``jax.set_mesh``, else every device).
        out: the ``.npy`` file or Zarr directory (named ``*.zarr``, or one that exists) to
            write; any other name is refused.
        budget: host memory for the data, e.g. ``"1GiB"``; the runtime's own overhead (JAX,
            compiled programs) comes on top.
        chunk: size of a chunk along the streamed index, or ``"auto"`` (the largest that fits).
        checksum: fingerprint input files by SHA-256 of all their bytes too (by default:
            size, mtime, ctime, inode and a hash of sampled blocks, so any write, even one
            whose mtime was put back, refuses a resume; with SHA-256 a resume compares the
            bytes instead, whatever else changed); a resume of a run that did compares SHA-256
            whatever it is asked. Inputs that are not files are checked on resume by reading
            the blocks the done chunks read again.
        layout: each chunk's layout on the mesh: by default the streamed index split over
            every mesh axis; ``"auto"`` for the planner's best for the chunk's shapes; or an
            index layout such as ``"n=x,d=y"`` (it must divide the chunk).
        on_chunk: called as chunks are recorded as done (durable; several may be recorded
            at once) with (chunks done so far, chunk count, bytes read). An exception it
            raises stops the run within a chunk or two and reaches the caller; the chunks
            recorded are kept, so the same call resumes.

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
    """:func:`stream`, with ``scope`` to hold JAX's 64-bit mode for 64-bit inputs, the open
    inputs and output, and the output's lock."""
    from shardwise._xla.dtypes import supported, wide
    from shardwise._xla.meshes import jax_mesh, on_mesh

    op = Op.parse(equation)
    chunk = parse_chunk(chunk)
    if multi_process():
        raise ArgumentError(
            f"stream (shardwise run) runs in one process, but this is process "
            f"{process_index()} of several (shardwise launch): its output is one file that "
            "one process writes. Run it without launch: one process streams through all its "
            "devices."
        )
    target, limit = _checked(out, budget)
    sources = []
    for k, x in enumerate(inputs):
        sources.append(open_source(x, k))
        scope.callback(sources[-1].close)
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
    scope.enter_context(on_mesh(jmesh := jax_mesh(mesh)))  # (not a mesh set around the call)
    spec = MeshSpec.parse(jmesh)
    sizes = op.sizes([s.shape for s in sources])
    sink = Sink(target, tuple(sizes[i] for i in op.output), dtype)
    if (unwritable := _lock(scope, sink)) is not None:  # only read: a finished run, or the error
        return read_back(op, sources, sink, checksum, unwritable)
    scope.callback(sink.close)
    begun = _begin(op, sources, sink, spec.size, limit, chunk, checksum)
    if isinstance(begun, StreamResult):
        return begun
    manifest, plan = begun, begun.plan
    chunk_layout = {plan.index: spec.names} if layout is None else layout
    cpu = all(d.platform == "cpu" for d in jmesh.devices.flat)
    writer: ChunkWriter | None = None
    try:
        chunking = Chunking.of(op, sources, plan, cpu)
        writer = ChunkWriter(chunking, sink, manifest, on_chunk)
        writer.check_resumed()
        reader = ChunkReader(chunking)
        reader.check_resumed(manifest)
        todo = manifest.todo()
        start_time = time.perf_counter()
        compile_ = functools.partial(compile_program, op, chunking, dtype, jmesh, chunk_layout)
        _run_chunks(todo, reader, writer, compile_)
        writer.finish()
    except BaseException:
        if not (manifest.done or manifest.complete or (writer and writer.bytes_read)):
            _discard(manifest, sink)  # stopped before it read a chunk: nothing worth keeping
        raise
    seconds = time.perf_counter() - start_time
    done = plan.chunks - len(todo)
    return StreamResult(sink.path, plan.chunks, len(todo), done, seconds, writer.bytes_read, plan)


def _discard(manifest: Manifest, sink: Sink) -> None:
    """Remove the work files of a run stopped before it read any chunk (a layout refused, a
    failed compile): nothing in them is worth resuming, and left behind they would refuse a
    corrected command on the same output as "another run"."""
    sink.close()
    for path in (sink.partial, sink.tmp(manifest.token)):
        if identity(path) == manifest.partial:
            remove(path)
    manifest.path.unlink(missing_ok=True)


def _checked(out: str | os.PathLike[str], budget: str | int) -> tuple[Path, int]:
    """The output's path and the budget in bytes, or a clear error."""
    target = Path(out)
    if target.name in ("", ".", ".."):
        raise ArgumentError(
            f"the output {str(out)!r} names no file; give a .npy file or a Zarr folder to "
            "write, e.g. --out result.npy."
        )
    if len(target.name.encode()) > NAME_MAX:  # (with its work files' endings, longer still)
        raise ArgumentError(
            f"the output's name is {len(target.name.encode())} bytes ({target.name[:24]}…), "
            f"over the {NAME_MAX} an output's may have (a name holds 255 bytes, and its work "
            "files add .manifest.json and a temporary ending); give it a shorter name."
        )
    if not target.parent.is_dir():
        raise ArgumentError(
            f"cannot write {str(target)!r}: folder {str(target.parent)!r} does not exist."
        )
    if target.suffix != ".npy" and target.suffix != ".zarr" and not is_zarr(target):
        raise ArgumentError(
            f"the output {str(out)!r} is neither a .npy file nor a Zarr folder; name it "
            f"{target.stem}.npy for a .npy file, or {target.stem}.zarr for a Zarr folder "
            "(or give an existing Zarr folder)."
        )
    limit = parse_bytes(budget)
    if limit <= 0:
        raise ArgumentError(
            f"a memory budget of {budget!r} holds no data; give a positive size, e.g. "
            "budget='1GiB'.",
            shell=f"--host-memory {budget} holds no data; give a positive size, e.g. "
            "--host-memory 1GiB.",
        )
    return target, limit


NAME_MAX = 255 - len(".manifest.json") - TEMPORARY_SUFFIX
"""The longest output name whose work files' names (the manifest's, as it is written) are
within the 255 bytes of a name."""


def _lock(scope: contextlib.ExitStack, sink: Sink) -> OSError | None:
    """Become the one run writing ``sink`` (until ``scope`` closes), or fail at once; the
    error, returned, where its folder cannot be written (read-only): a run finished there is
    read back without a lock (:func:`~shardwise._data.finished.read_back`)."""
    try:
        scope.enter_context(exclusive_lock(lock_path(sink.path)))
    except LockHeld as e:
        who = f"process {e.pid}" if e.pid else "another process"
        raise ShardwiseError(
            f"{str(sink.path)!r} is being written by {who}; wait for it to finish, or stop "
            "it (the same command then resumes its work)."
        ) from None
    except OSError as e:
        if e.errno in (errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP):
            raise ShardwiseError(
                f"cannot lock {str(lock_path(sink.path))!r}: its file system does not support "
                f"file locks ({e.strerror}), and shardwise will not write an output that a "
                "second run could write at the same time; choose an output on a local disk "
                "(or a file system mounted with locks, e.g. Lustre's -o flock)."
            ) from None
        if isinstance(e, PermissionError) or e.errno == errno.EROFS:
            return e
        raise sink.failed(e, started=False) from None
    return None


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
    manifest = Manifest.load(path)
    sink.refuse_as_input(sources)
    want = checksum or (manifest is not None and manifest.checksums)
    fingerprints = [s.fingerprint(want) for s in sources]
    if manifest is not None:
        manifest.check(
            op, fingerprints, sink.shape, sink.dtype, op.sizes([s.shape for s in sources])
        )
        _clean(manifest, sink)
        if manifest.complete:
            done = finished(manifest, sink)
            if done is not None:
                return done
            manifest = None  # its output was removed: the run starts over
    if os.path.lexists(target):
        raise ArgumentError(
            f"{str(target)!r} already exists and no finished run of this "
            "command wrote it; remove it or choose another output."
        )
    if manifest is None:
        if os.path.lexists(sink.partial):
            raise ArgumentError(
                f"{sink.partial.name} exists but no run of shardwise recorded it in "
                f"{path.name}; shardwise will not overwrite it: move it away."
            )
        plan = plan_stream(op, sources, devices, limit, chunk, first_axis=not sink.zarr)
        if not sink.zarr and (note := padding_note(op, sources, plan, devices)):
            warnings.warn(note, ShardwiseWarning, stacklevel=4)
        token = secrets.token_hex(8)
        inode = sink.create(token)
        try:
            manifest = Manifest.start(
                path, op, fingerprints, sink.shape, sink.dtype, plan, token, inode
            )
        except OSError as e:
            sink.close()
            remove(sink.tmp(token))
            raise sink.failed(e, started=False) from None
        sink.publish(token)
        return manifest
    check_resumable(manifest.plan, devices, limit, start_over(manifest.path))
    if chunk != "auto" and chunk != manifest.plan.chunk:
        warnings.warn(
            f"resuming the run begun in chunks of {manifest.plan.chunk}, not of {chunk}: its "
            f"finished chunks are kept as they were cut; {start_over(manifest.path)} in "
            f"chunks of {chunk}.",
            ShardwiseWarning,
            stacklevel=4,
        )
    if not sink.reopen(manifest.partial, manifest.token):
        if manifest.done:
            raise ShardwiseError(
                f"the partial output {sink.partial.name} is gone, but {path.name} records "
                f"chunks in it; delete {path.name} to start over."
            )
        try:
            manifest.restart(sink.create(manifest.token))
        except OSError as e:
            raise sink.failed(e, started=False) from None
        sink.publish(manifest.token)
    return manifest


def _clean(manifest: Manifest, sink: Sink) -> None:
    """Remove what earlier attempts of this run left and nothing names any more: files
    whose names hold the run's token (only it creates those)."""
    pattern = own_files(sink.path, manifest.token)
    keep = {manifest.accumulator["name"]} if manifest.accumulator else set()
    folder = sink.path.parent if str(sink.path.parent) else Path(".")
    for entry in os.scandir(folder):
        if entry.name in keep or not pattern.fullmatch(entry.name):
            continue
        if entry.name == sink.tmp(manifest.token).name and entry.inode() == manifest.partial:
            continue  # the partial output, not yet moved to its name
        remove(folder / entry.name)


def _run_chunks(
    todo: list[int],
    reader: ChunkReader,
    writer: ChunkWriter,
    compile_: Callable[[], Program],
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
            if writer.stopped:  # on_chunk raised: stop here, with what is recorded kept
                for f in flushes:
                    f.result()
            blocks, read_sum = pending.result()
            pending = (
                reads.submit(reader.read, todo[n + 1], (n + 1) % 2) if n + 1 < len(todo) else None
            )
            writer.bytes_read += reader.input_bytes(c, blocks)
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
            writing = writes.submit(writer.commit, c, pieces, read_sum)
            del pieces
        if writing is not None:
            writing.result()
        flushes.append(syncs.submit(writer.sync))
        for f in flushes:
            f.result()
