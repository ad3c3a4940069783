"""Where streamed data come from and go to: NumPy arrays, ``.npy`` files, Zarr arrays and
Dask arrays in; ``.npy`` files and Zarr arrays out.

``.npy`` files are written with plain ``pwrite`` at the data offset. They are read either
with ``pread`` into warm buffers or, where the devices can use host memory in place (CPU
devices), one chunk at a time through a memory map of just that chunk
(:meth:`Source.map_rows`): the devices then compute from the page cache with no copy at
all, and the map is dropped when the chunk is done, so mapped pages never pile up in the
process's resident memory.
"""

from __future__ import annotations

import functools
import hashlib
import mmap
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from shardwise._data.dask import is_dask
from shardwise._errors import (
    ArgumentError,
    ArgumentTypeError,
    MissingExtraError,
    ShardwiseError,
)


def _zarr() -> Any:
    try:
        import zarr
    except ImportError:
        raise MissingExtraError(
            "reading or writing Zarr needs the zarr package; install the extra with "
            "pip install 'shardwise[zarr]'."
        ) from None
    return zarr


@dataclass
class Source:
    """A read-only 2-or-more-dimensional array read in slices along one axis."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    kind: str
    obj: Any = None
    path: Path | None = None
    offset: int = 0

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * self.dtype.itemsize

    def read(self, axis: int, start: int, stop: int, out: np.ndarray | None = None) -> np.ndarray:
        """The slice ``[start:stop]`` along ``axis``: into the leading part of ``out`` when
        given (reusing warm memory is much faster than faulting in fresh pages), else a new
        array."""
        if self.kind == "npy" and axis == 0:
            assert self.path is not None
            row = int(np.prod(self.shape[1:])) * self.dtype.itemsize
            if out is None:
                out = np.empty((stop - start, *self.shape[1:]), self.dtype)
            else:
                out = out[: stop - start]
            with open(self.path, "rb", buffering=0) as f:
                view = out.reshape(-1).view(np.uint8).data
                done, want, pos = 0, (stop - start) * row, self.offset + start * row
                while done < want:
                    n = os.preadv(f.fileno(), [view[done:]], pos + done)
                    if n <= 0:
                        raise ShardwiseError(f"{self.name} ended early: is it truncated?")
                    done += n
            return out
        index = [slice(None)] * len(self.shape)
        index[axis] = slice(start, stop)
        if self.kind == "npy":
            assert self.path is not None
            arr = np.load(self.path, mmap_mode="r")
            data = np.array(arr[tuple(index)])
            if out is None:
                return data
            target = out[tuple(slice(0, n) for n in data.shape)]
            np.copyto(target, data)
            return target
        part = self.obj[tuple(index)]
        if self.kind == "dask":
            part = part.compute()
        data = np.asarray(part, dtype=self.dtype)
        if out is None:
            return data
        target = out[tuple(slice(0, n) for n in data.shape)]
        np.copyto(target, data)
        return target

    @property
    def mappable(self) -> bool:
        """Whether :meth:`map_rows` can serve this source."""
        return self.kind == "npy" and self.path is not None and os.name == "posix"

    def map_rows(self, start: int, stop: int) -> np.ndarray:
        """Rows ``[start:stop]`` of a ``.npy`` file as a read-only array over a memory map of
        just those rows, its pages already mapped (read from disk if they were not cached).
        The map is released with the last reference."""
        assert self.mappable and self.path is not None and stop > start
        row = int(np.prod(self.shape[1:])) * self.dtype.itemsize
        pos = self.offset + start * row
        base = pos - pos % mmap.ALLOCATIONGRANULARITY
        length = (stop - start) * row
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        with open(self.path, "rb") as f:
            if os.fstat(f.fileno()).st_size < pos + length:
                raise ShardwiseError(f"{self.name} ended early: is it truncated?")
            mapped = mmap.mmap(
                f.fileno(), pos - base + length, flags=flags, prot=mmap.PROT_READ, offset=base
            )
        count = (stop - start) * int(np.prod(self.shape[1:]))
        rows = np.frombuffer(mapped, self.dtype, count=count, offset=pos - base)
        return rows.reshape(stop - start, *self.shape[1:])

    @staticmethod
    def release_rows(rows: np.ndarray) -> None:
        """Drop the pages of rows from :meth:`map_rows` from this process's resident memory
        now, rather than whenever the last reference goes (they stay in the page cache;
        touching them again maps them again)."""
        base: Any = rows
        while isinstance(base, np.ndarray):
            base = base.base
        if isinstance(base, memoryview):
            base = base.obj
        if isinstance(base, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED"):
            base.madvise(mmap.MADV_DONTNEED)

    def fingerprint(self, checksum: bool = False) -> dict[str, Any]:
        """What identifies this input's contents (size and mtime, or a checksum on request)."""
        data: dict[str, Any] = {
            "name": self.name,
            "shape": list(self.shape),
            "dtype": self.dtype.name,
            "kind": self.kind,
        }
        if self.path is not None:
            paths = (
                [self.path]
                if self.path.is_file()
                else sorted(p for p in self.path.rglob("*") if p.is_file())
            )
            data["size"] = sum(p.stat().st_size for p in paths)
            data["mtime_ns"] = max(p.stat().st_mtime_ns for p in paths)
            if checksum:
                h = hashlib.sha256()
                for p in paths:
                    with open(p, "rb") as f:
                        for block in iter(functools.partial(f.read, 1 << 20), b""):
                            h.update(block)
                data["sha256"] = h.hexdigest()
        return data


def open_source(value: Any, k: int) -> Source:
    """A NumPy array, a ``.npy`` path, a Zarr array or path, or a Dask array."""
    if isinstance(value, str | os.PathLike):
        path = Path(value)
        if not path.exists():
            raise ArgumentError(f"input {k} {str(path)!r} does not exist.")
        if path.is_file() and path.suffix == ".npy":
            try:
                with open(path, "rb") as f:
                    version = np.lib.format.read_magic(f)
                    read_header = (
                        np.lib.format.read_array_header_1_0
                        if version == (1, 0)
                        else np.lib.format.read_array_header_2_0
                    )
                    shape, fortran, dtype = read_header(f)
                    offset = f.tell()
            except (ValueError, OSError) as e:
                raise ArgumentError(
                    f"input {k} {str(path)!r} is not a readable .npy file ({e})."
                ) from None
            if fortran:
                raise ArgumentError(
                    f"input {k} {str(path)!r} is in Fortran order; save it in "
                    "C order (np.ascontiguousarray) to stream it."
                )
            return Source(str(path), tuple(shape), np.dtype(dtype), "npy", path=path, offset=offset)
        if path.is_dir():
            arr = _zarr().open_array(str(path), mode="r")
            return Source(
                str(path), tuple(arr.shape), np.dtype(arr.dtype), "zarr", obj=arr, path=path
            )
        raise ArgumentError(f"input {k} {str(path)!r} is neither a .npy file nor a Zarr directory.")
    if is_dask(value):
        return Source(
            f"dask array {k}", tuple(value.shape), np.dtype(value.dtype), "dask", obj=value
        )
    if type(value).__module__.startswith("zarr"):
        return Source(
            f"zarr array {k}", tuple(value.shape), np.dtype(value.dtype), "zarr", obj=value
        )
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return Source(f"array {k}", tuple(value.shape), np.dtype(value.dtype), "numpy", obj=value)
    raise ArgumentTypeError(
        f"input {k} is a {type(value).__name__}; give a NumPy array, a .npy path, a Zarr "
        "array or directory, or a Dask array."
    )


class Sink:
    """The output, written chunk by chunk into ``<out>.partial`` and renamed when complete."""

    def __init__(self, path: Path, shape: tuple[int, ...], dtype: np.dtype[Any]) -> None:
        self.path = path
        self.shape = shape
        self.dtype = dtype
        self.zarr = path.suffix != ".npy"
        self.partial = path.with_name(path.name + ".partial")
        self.offset = 0
        self._unsynced: list[tuple[int, int]] = []  # (position, length) of writes not flushed
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * self.dtype.itemsize

    def create(self) -> None:
        """Allocate the partial output (checks space and permissions up front)."""
        parent = self.path.parent if str(self.path.parent) else Path(".")
        if not parent.exists():
            raise ArgumentError(
                f"cannot write {str(self.path)!r}: folder {str(parent)!r} does not exist."
            )
        free = _free_bytes(parent)
        if free is not None and free < self.nbytes:
            raise ShardwiseError(
                f"not enough disk space for {str(self.path)!r}: it needs {self.nbytes:,} bytes "
                f"and {free:,} are free on its disk."
            )
        try:
            if self.zarr:
                _zarr().open_array(str(self.partial), mode="w", shape=self.shape, dtype=self.dtype)
                return
            header = {
                "descr": np.lib.format.dtype_to_descr(self.dtype),
                "fortran_order": False,
                "shape": self.shape,
            }
            with open(self.partial, "wb") as f:
                np.lib.format.write_array_header_1_0(f, header)
                self.offset = f.tell()
                if self.nbytes:
                    os.posix_fallocate(f.fileno(), self.offset, self.nbytes)
        except PermissionError:
            raise ShardwiseError(
                f"cannot write {str(self.path)!r}: permission denied. Choose "
                "an output in a folder you can write to."
            ) from None
        except OSError as e:
            raise ShardwiseError(f"cannot write {str(self.path)!r}: {e.strerror or e}.") from None

    def open_existing(self) -> None:
        """Reopen a partial output left by an interrupted run."""
        if not self.zarr:
            with open(self.partial, "rb") as f:
                np.lib.format.read_magic(f)
                np.lib.format.read_array_header_1_0(f)
                self.offset = f.tell()

    def write(self, axis: int, start: int, block: np.ndarray, durable: bool = True) -> None:
        """Write ``block`` at ``start`` along ``axis``; durably unless told otherwise (then
        :meth:`sync` makes every write so far durable at once)."""
        block = np.ascontiguousarray(block, dtype=self.dtype)
        try:
            if self.zarr:
                arr = _zarr().open_array(str(self.partial), mode="r+")
                index = [slice(None)] * len(self.shape)
                index[axis] = slice(start, start + block.shape[axis])
                arr[tuple(index)] = block
                return
            if axis != 0 and self.shape:
                raise ShardwiseError("a .npy output is written along its first axis only.")
            row = int(np.prod(self.shape[1:])) * self.dtype.itemsize
            with open(self.partial, "r+b", buffering=0) as f:
                data = block.reshape(-1).view(np.uint8).data
                pos = self.offset + start * row
                done = 0
                while done < len(data):
                    done += os.pwritev(f.fileno(), [data[done:]], pos + done)
                if durable:
                    # the file was allocated in full up front: only the data need to reach
                    # the disk, not the metadata
                    os.fdatasync(f.fileno())
                    _drop_cached(f.fileno(), [(pos, len(data))])
                else:
                    with self._lock:
                        self._unsynced.append((pos, len(data)))
        except OSError as e:
            raise self._failed(e) from None

    def sync(self) -> None:
        """Make every write so far durable (one flush for many chunks costs less disk time
        than a flush per chunk)."""
        if self.zarr:
            return
        with self._lock:
            written, self._unsynced = self._unsynced, []
        try:
            with open(self.partial, "r+b", buffering=0) as f:
                os.fdatasync(f.fileno())
                _drop_cached(f.fileno(), written)
        except OSError as e:
            raise self._failed(e) from None

    def _failed(self, e: OSError) -> ShardwiseError:
        return ShardwiseError(
            f"cannot write {str(self.path)!r}: {e.strerror or e}. Earlier chunks are kept; "
            "free space and run the same command to resume."
        )

    def finish(self) -> None:
        """Make the output visible under its real name, atomically."""
        os.replace(self.partial, self.path)


def _drop_cached(fd: int, spans: list[tuple[int, int]]) -> None:
    """Let the page cache drop these spans of the output, now on disk.

    A streamed run writes as much output as it likes, so its pages would otherwise crowd
    the page cache (and the inputs in it) until the kernel evicts them. Freeing them at
    once also lets the next chunk's writes reuse the same, recently used memory: in a
    virtual machine that hands free memory back to its host, writing into memory that has
    been handed back costs a fault on the host for every page.
    """
    if not hasattr(os, "posix_fadvise"):
        return
    for pos, length in spans:
        try:
            os.posix_fadvise(fd, pos, length, os.POSIX_FADV_DONTNEED)
        except OSError:  # only advice: the data are on disk whatever the cache does
            return


def _free_bytes(folder: Path) -> int | None:
    try:
        import shutil

        return shutil.disk_usage(folder).free
    except OSError:
        return None
