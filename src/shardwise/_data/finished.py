"""A finished run seen again: its result, with nothing left to compute, whether its folder
may be written (a kill's leftovers put right) or not (a read-only disk: only read)."""

from __future__ import annotations

import os
from collections.abc import Sequence

from shardwise._data.manifest import Manifest
from shardwise._data.result import StreamResult
from shardwise._data.sink import Sink
from shardwise._data.sources import Source
from shardwise._data.workfiles import manifest_path
from shardwise._errors import ArgumentError
from shardwise._files import identity
from shardwise._model.op import Op


def finished(manifest: Manifest, sink: Sink) -> StreamResult | None:
    """The result of a finished run whose output lies under its name (moved there now if a
    kill came first); None when the output is gone; an error when something else is there."""
    target = sink.path
    here = identity(target)
    if here is None and identity(sink.partial) == manifest.partial:
        sink.inode = manifest.partial
        sink.finish()
    elif here is None:
        return None
    elif here != manifest.partial:
        raise ArgumentError(
            f"{str(target)!r} already exists and no finished run of this "
            "command wrote it; remove it or choose another output."
        )
    elif identity(sink.partial) == here:  # a kill came between linking and unlinking
        os.unlink(sink.partial)
    return _result(manifest, sink)


def read_back(
    op: Op, sources: Sequence[Source], sink: Sink, checksum: bool, error: OSError
) -> StreamResult:
    """The result of a run finished in a folder this process cannot write (``error``, met
    taking the lock: a read-only disk or folder), read without a lock or a work file: the
    manifest says it finished, for these inputs, and its output lies under its name, so
    there is nothing to do. Anything else raises ``error`` as :meth:`Sink.failed` says it."""
    manifest = Manifest.load(manifest_path(sink.path))
    if manifest is None or not manifest.complete:
        raise sink.failed(error, started=False) from None
    sink.refuse_as_input(sources)
    fingerprints = [s.fingerprint(checksum or manifest.checksums) for s in sources]
    sizes = op.sizes([s.shape for s in sources])
    manifest.check(op, fingerprints, sink.shape, sink.dtype, sizes)
    if identity(sink.path) != manifest.partial:  # (gone, or another file: a run must write)
        raise sink.failed(error, started=False) from None
    return _result(manifest, sink)


def _result(manifest: Manifest, sink: Sink) -> StreamResult:
    """What repeating a finished run did: nothing (every chunk done before)."""
    plan = manifest.plan
    return StreamResult(sink.path, plan.chunks, 0, plan.chunks, 0.0, 0, plan)
