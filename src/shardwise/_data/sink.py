"""Where a streamed run's result goes: a ``.npy`` file or a Zarr folder.

It is written into ``<out>.partial`` — created exclusively (never through a symbolic link,
never over anything already there), recorded by inode in the run's manifest, and checked to be
that very file before every use — with ``pwrite`` at the data offset, and renamed to ``<out>``,
replacing nothing, when the run is done.
"""

from __future__ import annotations

import contextlib
import errno
import io
import math
import os
import shutil
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from shardwise._data.sources import Source, _zarr
from shardwise._errors import ArgumentError, ShardwiseError
from shardwise._files import NEW, drop_cached, free_bytes, identity, open_regular, place, write_all
from shardwise._model.units import format_bytes

_free_bytes = free_bytes  # looked up here, so that tests can pretend a disk is full


class Sink:
    """The output, written chunk by chunk into ``<out>.partial`` and renamed when complete.

    The partial output is first created as ``<out>.partial.<token>.tmp`` (``token``: the
    run's, in its manifest), recorded by inode in the manifest, then moved to its name: every
    later use checks that the file there is still that inode.
    """

    def __init__(self, path: Path, shape: tuple[int, ...], dtype: np.dtype[Any]) -> None:
        self.path = path
        self.shape = shape
        self.dtype = dtype
        self.zarr = path.suffix != ".npy"
        self.partial = path.with_name(path.name + ".partial")
        self.offset = 0
        self.inode: int | None = None
        self.extra = 0  # bytes the run needs beside the output (its running sums)
        self._fd: int | None = None
        self._written = 0
        self._unsynced: list[tuple[int, int]] = []  # (position, length) of writes not flushed
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def refuse_as_input(self, sources: Sequence[Source]) -> None:
        """Refuse inputs that are the output or its partial output (written while read)."""
        own = {identity(p) for p in (self.path, self.partial)} - {None}
        for n, s in enumerate(sources):
            if s.path is not None and os.stat(s.path).st_ino in own:
                raise ArgumentError(
                    f"input {n} {s.name!r} is the output {str(self.path)!r} or its partial "
                    "output; choose another output."
                )

    def tmp(self, token: str) -> Path:
        """The partial output's name before its inode is recorded."""
        return self.path.with_name(f"{self.path.name}.partial.{token}.tmp")

    def create(self, token: str) -> int:
        """Allocate the partial output under :meth:`tmp` (checks space and permissions up
        front); return its inode."""
        parent = self.path.parent if str(self.path.parent) else Path(".")
        if not parent.is_dir():
            raise ArgumentError(
                f"cannot write {str(self.path)!r}: folder {str(parent)!r} does not exist."
            )
        free = _free_bytes(parent)
        if free is not None and free < self.nbytes:
            raise ShardwiseError(
                f"not enough disk space for {str(self.path)!r}: it needs {self.nbytes:,} bytes "
                f"and {free:,} are free on its disk."
            )
        tmp = self.tmp(token)
        try:
            if self.zarr:
                os.mkdir(tmp)
                _zarr().open_array(str(tmp), mode="w", shape=self.shape, dtype=self.dtype)
                self.inode = os.lstat(tmp).st_ino
                return self.inode
            self._fd = os.open(tmp, os.O_RDWR | NEW, 0o666)
            header = io.BytesIO()
            descr = np.lib.format.dtype_to_descr(self.dtype)
            meta = {"descr": descr, "fortran_order": False, "shape": self.shape}
            np.lib.format.write_array_header_1_0(header, meta)
            write_all(self._fd, header.getvalue(), 0)
            self.offset = len(header.getvalue())
            if self.nbytes:
                os.posix_fallocate(self._fd, self.offset, self.nbytes)
            os.fsync(self._fd)
            self.inode = os.fstat(self._fd).st_ino
            return self.inode
        except OSError as e:
            self.close()
            if not isinstance(e, FileExistsError):  # what is there is not this run's
                remove(tmp)
            raise self.failed(e, started=False) from None

    def publish(self, token: str) -> None:
        """Move the partial output from :meth:`tmp` to its name, replacing nothing."""
        try:
            place(self.tmp(token), self.partial)
        except OSError as e:
            raise self.failed(e, started=False) from None

    def reopen(self, inode: int, token: str) -> bool:
        """Open the partial output of an interrupted run: the file of inode ``inode``, moved to
        its name first if a kill came before; False when neither name holds it. Refused when
        something else lies at its name, or its size or header are not the run's."""
        tmp, name = self.tmp(token), self.partial.name
        here = identity(self.partial)
        if here is None:
            if identity(tmp) != inode:
                return False
            self.publish(token)
        elif here != inode:
            raise ShardwiseError(
                f"{name} is not the file this run created (it was replaced or moved); "
                f"remove it and {self.path.name}.manifest.json to start over."
            )
        elif identity(tmp) == inode:  # killed between linking and unlinking
            os.unlink(tmp)
        self.inode = inode
        try:
            if self.zarr:
                if os.path.islink(self.partial) or not os.path.isdir(self.partial):
                    raise OSError(errno.ELOOP, "not a folder", str(self.partial))
                arr = _zarr().open_array(str(self.partial), mode="r")
                found = (tuple(arr.shape), np.dtype(arr.dtype), self.nbytes)
            else:
                self._fd = open_regular(self.partial, os.O_RDWR)
                if os.fstat(self._fd).st_ino != inode:  # replaced since it was looked at
                    raise OSError(errno.ELOOP, "replaced", str(self.partial))
                with os.fdopen(os.dup(self._fd), "rb") as f:
                    np.lib.format.read_magic(f)
                    shape, _, dtype = np.lib.format.read_array_header_1_0(f)
                    self.offset = f.tell()
                found = (tuple(shape), np.dtype(dtype), os.fstat(self._fd).st_size - self.offset)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise ShardwiseError(
                    f"{name} is a symbolic link or was replaced: not the file this run "
                    f"created; remove it and {self.path.name}.manifest.json to start over."
                ) from None
            raise self._damaged(f"it cannot be read ({e})") from None
        except (ValueError, SyntaxError) as e:
            raise self._damaged(f"it cannot be read ({e})") from None
        if found != (self.shape, self.dtype, self.nbytes):
            raise self._damaged(
                f"it holds {found[2]:,} bytes of shape {found[0]} {found[1]}, not "
                f"{self.nbytes:,} bytes of shape {self.shape} {self.dtype}"
            )
        return True

    def _damaged(self, why: str) -> ShardwiseError:
        return ShardwiseError(
            f"the partial output {self.partial.name} is damaged: {why}. Delete it and "
            f"{self.path.name}.manifest.json to start over."
        )

    def write(self, axis: int, start: int, block: np.ndarray, durable: bool = True) -> None:
        """Write ``block`` at ``start`` along ``axis``; durably unless told otherwise (then
        :meth:`sync` makes every write so far durable at once)."""
        block = np.ascontiguousarray(block, dtype=self.dtype).reshape(np.shape(block))
        try:
            if self.zarr:
                self._same()
                arr = _zarr().open_array(str(self.partial), mode="r+")
                index: list[Any] = [slice(None)] * len(self.shape)
                if self.shape:
                    index[axis] = slice(start, start + block.shape[axis])
                arr[tuple(index) if index else ...] = block
                self._written += block.nbytes
                return
            if axis != 0 and self.shape:
                raise ShardwiseError("a .npy output is written along its first axis only.")
            assert self._fd is not None
            row = math.prod(self.shape[1:]) * self.dtype.itemsize
            pos = self.offset + start * row
            write_all(self._fd, block.reshape(-1).view(np.uint8).data, pos)
            if durable:
                # the file was allocated in full up front: only the data need to reach the
                # disk, not the metadata
                os.fdatasync(self._fd)
                drop_cached(self._fd, [(pos, block.nbytes)])
            else:
                with self._lock:
                    self._unsynced.append((pos, block.nbytes))
        except OSError as e:
            raise self.failed(e) from None

    def reader(self, axis: int, start: int, stop: int) -> Callable[[int, int], bytes]:
        """Bytes ``[a:b]`` of the output's slice ``[start:stop]`` along ``axis`` (laid out in
        C order), as written so far: read where they lie in a ``.npy`` file; from the slice,
        read whole, in a Zarr folder."""
        if self.zarr:
            index = [slice(None)] * len(self.shape)
            index[axis] = slice(start, stop)
            self._same()
            part = _zarr().open_array(str(self.partial), mode="r")[tuple(index)]
            data = np.ascontiguousarray(part, dtype=self.dtype).reshape(-1).view(np.uint8)
            return lambda a, b: data[a:b].tobytes()
        fd, row = self._fd, math.prod(self.shape[1:]) * self.dtype.itemsize
        assert fd is not None
        return lambda a, b: os.pread(fd, b - a, self.offset + start * row + a)

    def sync(self) -> None:
        """Make every write so far durable (one flush for many chunks costs less disk time
        than a flush per chunk)."""
        if self.zarr:
            return
        with self._lock:
            written, self._unsynced = self._unsynced, []
        try:
            assert self._fd is not None
            os.fdatasync(self._fd)
            drop_cached(self._fd, written)
        except OSError as e:
            raise self.failed(e) from None

    def _same(self) -> None:
        if identity(self.partial) != self.inode:
            raise ShardwiseError(
                f"{self.partial.name} was replaced while this run wrote it; remove it and "
                f"{self.path.name}.manifest.json to start over."
            )

    def failed(self, e: OSError, started: bool = True) -> ShardwiseError:
        """The error for ``e``, met writing the output or its work files."""
        where = f"cannot write {str(self.path)!r}"
        if isinstance(e, FileExistsError | IsADirectoryError) or e.errno == errno.ELOOP:
            return ShardwiseError(
                f"{where}: {e.filename or 'a work file'} is in the way (a file or link "
                "shardwise did not write); move it away or choose another output."
            )
        if isinstance(e, PermissionError) or e.errno == errno.EROFS:
            return ShardwiseError(
                f"{where}: {e.strerror}. Choose an output in a folder you can write to."
            )
        if e.errno == errno.ENAMETOOLONG:  # (its work files' names are longer still)
            return ShardwiseError(
                f"{where}: {e.strerror} (with its work files' endings, .manifest.json and "
                ".partial); give the output a shorter name."
            )
        why = e.strerror or str(e)
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            left = 0 if not self.zarr and started else self.nbytes - self._written
            why += (
                f"; the run needs about {format_bytes(left + self.extra + 65536)} more on that disk"
            )
        kept = "Earlier chunks are kept; free" if started else "Free"
        return ShardwiseError(
            f"{where}: {why}. {kept} space (or fix the cause) and run the same command to resume."
        )

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def finish(self) -> None:
        """Make the output visible under its real name, replacing nothing."""
        self.close()
        self._same()
        try:
            place(self.partial, self.path)
        except OSError as e:
            raise self.failed(e) from None


ZARR_MARKERS = (".zarray", ".zgroup", "zarr.json")
"""The files at the top of a Zarr folder (format 2's array and group, format 3's metadata)."""


def is_zarr(path: Path) -> bool:
    """Whether ``path`` is a Zarr folder: one that holds Zarr's metadata at its top."""
    return path.is_dir() and any((path / name).is_file() for name in ZARR_MARKERS)


def remove(path: Path) -> None:
    """Remove ``path`` (a file, or a folder with what is in it), if it is there; only for work
    files the caller created."""
    with contextlib.suppress(FileNotFoundError):
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
