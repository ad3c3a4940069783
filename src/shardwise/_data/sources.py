"""Where streamed data come from: NumPy arrays, ``.npy`` files, Zarr arrays and Dask arrays.

A ``.npy`` input is opened once and read with ``pread`` into warm buffers through that one
descriptor; its size, mtime, ctime and inode are checked before and after every chunk, so an
input changed or truncated mid-run stops the run with a clear error. The ctime (the time of
the inode's last change) is what no user can set back: a write whose mtime was put back with
``touch`` or ``os.utime`` still moves it.

Inputs with no such stamp (arrays in memory, Zarr array objects, Dask arrays) are
:attr:`Source.stamped` false: a streamed run records a checksum of the blocks it read of them
for each chunk, and a resume reads those blocks again and compares. It is memory-mapped and used in
place (:meth:`Source.map_rows`) only where nobody can truncate it — on a read-only file system
— since touching a map past a truncated file's end kills the process (``SIGBUS``).
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import mmap
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np

from shardwise._data.dask import is_dask
from shardwise._errors import ArgumentError, ArgumentTypeError, ShardwiseError
from shardwise._extras import require
from shardwise._files import read_exactly

SAMPLES, BLOCK = 64, 4096
"""An input's sampled fingerprint hashes this many blocks of this many bytes, evenly spread."""


def _zarr() -> Any:
    return require("zarr", "reading or writing Zarr")


@dataclass
class Source:
    """A read-only array read in slices along one axis; a ``.npy`` file is read through ``fd``,
    and ``stamp`` is its (size, mtime_ns, inode, ctime_ns) when opened. ``dtype`` is in native
    byte order; ``swap``: the file holds the other one (its bytes are swapped as read)."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    kind: str
    obj: Any = None
    path: Path | None = None
    offset: int = 0
    fd: int | None = None
    stamp: tuple[int, int, int, int] | None = None
    swap: bool = False

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    @property
    def stamped(self) -> bool:
        """Whether this input lies in files whose change a resume sees from their metadata
        (size, mtime, inode and ctime); else a resume compares what it reads."""
        return self.path is not None

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def check(self) -> None:
        """Refuse to go on when this ``.npy`` input changed since it was opened."""
        if self.fd is None or self.stamp is None or self.path is None:
            return
        st = os.fstat(self.fd)
        now = st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns
        with contextlib.suppress(OSError):
            if os.stat(self.path).st_ino != st.st_ino:
                now = (*now[:2], -1, now[3])
        if now != self.stamp:
            names = ("size", "mtime", "file", "ctime")
            what = [k for k, a, b in zip(names, now, self.stamp, strict=True) if a != b]
            raise ShardwiseError(
                f"input {self.name} changed or was truncated while this run read it "
                f"({', '.join(what)} changed); chunks finished before are kept: restore the "
                "input and run the same command to resume."
            )

    def read(
        self, axis: int | None, start: int = 0, stop: int = 0, out: np.ndarray | None = None
    ) -> np.ndarray:
        """The slice ``[start:stop]`` along ``axis``, or the whole array when ``axis`` is None:
        into the leading part of ``out`` when given (reusing warm memory is much faster than
        faulting in fresh pages), else a new array."""
        shape = list(self.shape)
        if axis is not None:
            shape[axis] = stop - start
        if out is None:
            out = np.empty(shape, self.dtype)
        elif shape:
            out = out[tuple(slice(0, n) for n in shape)]
        if self.kind == "npy":
            self.check()
            self._pread(axis, start, stop, out)
            self.check()  # a change while reading: these rows may mix old and new
            if self.swap:
                out.byteswap(inplace=True)
            return out
        index: list[Any] = [slice(None)] * len(self.shape)
        if axis is not None:
            index[axis] = slice(start, stop)
        part = self.obj[tuple(index)]
        if self.kind == "dask":
            part = part.compute()
        np.copyto(out, np.asarray(part, dtype=self.dtype))
        return out

    def _pread(self, axis: int | None, start: int, stop: int, out: np.ndarray) -> None:
        """Read the slice (the whole array when ``axis`` is None) into ``out`` with ``pread``:
        one read per run of contiguous bytes in the file (one in all along the first axis)."""
        assert self.fd is not None
        if out.size == 0:
            return
        if axis is None:
            runs: list[tuple[Any, int]] = [(..., self.offset)]
        else:
            inner = math.prod(self.shape[axis + 1 :]) * self.dtype.itemsize
            runs = [
                (outer, self.offset + (k * self.shape[axis] + start) * inner)
                for k, outer in enumerate(np.ndindex(*self.shape[:axis]))
            ]
        for outer, pos in runs:
            part = out[outer]  # the slice's rows of one index before ``axis``
            assert part.flags.c_contiguous  # else the bytes would land in a copy
            if not read_exactly(self.fd, part.reshape(-1).view(np.uint8).data, pos):
                raise ShardwiseError(
                    f"input {self.name} ended early (truncated while this run read it?); "
                    "chunks finished before are kept: restore it and run the same command."
                )

    @property
    def mappable(self) -> bool:
        """Whether :meth:`map_rows` can serve this source safely: a ``.npy`` file nobody can
        truncate while it is mapped (it lies on a read-only file system)."""
        if self.kind != "npy" or self.fd is None or self.swap or os.name != "posix":
            return False
        try:
            return bool(os.fstatvfs(self.fd).f_flag & os.ST_RDONLY)
        except OSError:
            return False

    def map_rows(self, start: int, stop: int) -> np.ndarray:
        """Rows ``[start:stop]`` of a ``.npy`` file as a read-only array over a memory map of
        just those rows, its pages already mapped (read from disk if they were not cached).
        The map is released with the last reference."""
        assert self.mappable and self.fd is not None and stop > start
        self.check()
        row = math.prod(self.shape[1:]) * self.dtype.itemsize
        pos = self.offset + start * row
        base = pos - pos % mmap.ALLOCATIONGRANULARITY
        length = (stop - start) * row
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        mapped = mmap.mmap(
            self.fd, pos - base + length, flags=flags, prot=mmap.PROT_READ, offset=base
        )
        count = (stop - start) * math.prod(self.shape[1:])
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
        """What identifies this input's contents: shape and dtype; for files their size,
        mtime, ctime and inode and a hash of ``SAMPLES`` blocks spread over them (``sample``);
        for arrays in memory a hash of rows spread over them (a quick first check: the blocks
        each chunk read are checked on resume); with ``checksum``, SHA-256 of all the bytes
        too; for a Dask array only its shape and dtype (reading it to hash it would compute
        it)."""
        data: dict[str, Any] = {
            "name": self.name,
            "shape": list(self.shape),
            "dtype": self.dtype.name,
            "kind": self.kind,
        }
        if self.kind == "dask":  # its graph's name can change from process to process
            return data
        if self.path is not None:
            data.update(_file_fingerprint(self, checksum))
            return data
        arr = self.obj
        if arr is not None and len(self.shape) > 0 and self.shape[0] > 0:
            rows = np.unique(np.linspace(0, self.shape[0] - 1, SAMPLES).astype(np.int64))
            corner = tuple(slice(0, min(n, 64)) for n in self.shape[1:])  # bounded reads
            sampled = np.stack([np.asarray(arr[(int(i), *corner)], dtype=self.dtype) for i in rows])
            data["sample"] = hashlib.blake2b(sampled.tobytes(), digest_size=16).hexdigest()
            if checksum and isinstance(arr, np.ndarray):
                data["sha256"] = hashlib.sha256(np.ascontiguousarray(arr).data).hexdigest()
        return data


def _file_fingerprint(source: Source, checksum: bool) -> dict[str, Any]:
    """Size, mtime, ctime, inode, sampled hash (and SHA-256 with ``checksum``) of a ``.npy``
    file or of a Zarr folder's files (its listing, the latest mtime and ctime of any, and blocks
    of up to ``SAMPLES`` of them)."""
    assert source.path is not None
    sample = hashlib.blake2b(digest_size=16)
    full = hashlib.sha256() if checksum else None
    if source.fd is not None and source.stamp is not None:
        size, mtime, inode, ctime = source.stamp
        _digest(source.fd, size, sample, full)
    else:
        paths = sorted(p for p in source.path.rglob("*") if p.is_file())
        stats = [p.stat() for p in paths]
        size = sum(s.st_size for s in stats)
        mtime = max([s.st_mtime_ns for s in stats], default=0)
        ctime = max([s.st_ctime_ns for s in stats], default=0)
        inode = os.stat(source.path).st_ino
        pick = {round(k * (len(paths) - 1) / (SAMPLES - 1)) for k in range(SAMPLES)}
        for k, (p, s) in enumerate(zip(paths, stats, strict=True)):
            sample.update(f"{p.relative_to(source.path)}\0{s.st_size}\0".encode())
            if k in pick or full is not None:
                fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    _digest(fd, s.st_size, sample if k in pick else None, full)
                finally:
                    os.close(fd)
    found = {
        "size": size,
        "mtime_ns": mtime,
        "ctime_ns": ctime,
        "inode": inode,
        "sample": sample.hexdigest(),
    }
    return found if full is None else {**found, "sha256": full.hexdigest()}


def _digest(fd: int, length: int, sample: Any, full: Any) -> None:
    """Hash ``SAMPLES`` blocks of ``fd`` spread over its ``length`` bytes into ``sample``, and
    all of its bytes into ``full``, each when given."""
    if sample is not None:
        step = max(0, length - BLOCK) / (SAMPLES - 1)
        for pos in sorted({round(k * step) for k in range(SAMPLES)}):
            sample.update(os.pread(fd, BLOCK, pos))
    pos = 0
    while full is not None and (block := os.pread(fd, 1 << 20, pos)):
        full.update(block)
        pos += len(block)


def _native(dtype: Any) -> np.dtype[Any]:
    """``dtype`` in this machine's byte order: inputs saved big- and little-endian are read
    alike and computed together.

    >>> _native(">f4").isnative, _native("<f4").isnative, _native(">f4").name
    (True, True, 'float32')
    """
    native: np.dtype[Any] = np.dtype(dtype).newbyteorder("=")
    return native


def open_source(value: Any, k: int) -> Source:
    """A NumPy array, a ``.npy`` path, a Zarr array or path, or a Dask array."""
    if isinstance(value, str | os.PathLike):
        path = Path(value)
        if not path.exists():
            raise ArgumentError(f"input {k} {str(path)!r} does not exist.")
        if path.is_file() and path.suffix == ".npy":
            return _open_npy(path, k)
        if path.is_dir():
            zarr = _zarr()
            try:
                arr = zarr.open_array(str(path), mode="r")
            except (ValueError, OSError) as e:  # zarr's "no array found", a group, unreadable
                why = str(e).strip()
                raise ArgumentError(
                    f"input {k} {str(path)!r} is a folder but not a Zarr array ({why}); give a "
                    ".npy file or a Zarr array's folder (one that zarr.open_array opens)."
                ) from None
            return Source(
                str(path), tuple(arr.shape), _native(arr.dtype), "zarr", obj=arr, path=path
            )
        raise ArgumentError(f"input {k} {str(path)!r} is neither a .npy file nor a Zarr directory.")
    if is_dask(value):
        return Source(
            f"dask array {k}", tuple(value.shape), _native(value.dtype), "dask", obj=value
        )
    if type(value).__module__.startswith("zarr"):
        return Source(
            f"zarr array {k}", tuple(value.shape), _native(value.dtype), "zarr", obj=value
        )
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        if isinstance(value, jax.Array):  # (one on an Explicit mesh cannot be indexed without
            value = np.asarray(value)  # saying its result's layout: read it on the host once)
        return Source(f"array {k}", tuple(value.shape), _native(value.dtype), "numpy", obj=value)
    raise ArgumentTypeError(
        f"input {k} is a {type(value).__name__}; give a NumPy array, a .npy path, a Zarr "
        "array or directory, or a Dask array."
    )


def _open_npy(path: Path, k: int) -> Source:
    """A ``.npy`` input, opened once, its header checked against the file's size."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        with os.fdopen(os.dup(fd), "rb") as f:
            version = np.lib.format.read_magic(f)
            read_header = (
                np.lib.format.read_array_header_1_0
                if version == (1, 0)
                else np.lib.format.read_array_header_2_0
            )
            shape, fortran, dtype = read_header(f)
            offset = f.tell()
        st = os.fstat(fd)
        what = f"input {k} {str(path)!r}"
        if fortran:
            raise ArgumentError(
                f"{what} is in Fortran order; save it in C order (np.ascontiguousarray) to "
                "stream it."
            )
        dtype = np.dtype(dtype)
        if any(n < 0 for n in shape) or dtype.hasobject or dtype.itemsize == 0:
            raise ArgumentError(
                f"{what} has a damaged header: shape {tuple(shape)}, dtype {dtype}; a .npy "
                "file to stream holds a C-order array of numbers. Save it again."
            )
        nbytes = math.prod(shape) * dtype.itemsize
        if offset + nbytes > st.st_size:
            raise ArgumentError(
                f"{what} claims {nbytes:,} bytes of data (shape {tuple(shape)}, {dtype}) but "
                f"holds {max(0, st.st_size - offset):,} after its header: it is truncated or "
                "its header is damaged. Save it again."
            )
    except ArgumentError:
        os.close(fd)
        raise
    except (ValueError, OSError, SyntaxError) as e:
        os.close(fd)
        raise ArgumentError(f"input {k} {str(path)!r} is not a readable .npy file ({e}).") from None
    stamp = (st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)
    return Source(
        str(path),
        tuple(shape),
        _native(dtype),
        "npy",
        path=path,
        offset=offset,
        fd=fd,
        stamp=stamp,
        swap=not dtype.isnative,
    )


COMPARED = ("size", "mtime_ns", "ctime_ns", "inode", "sample", "token")
"""The fingerprint's keys compared on resume where both fingerprints hold them."""


def changes(old: dict[str, Any], new: dict[str, Any], ignore: str = "") -> list[str]:
    """What differs between two fingerprints of an input: everything both hold (but
    ``ignore``), or only SHA-256 when both hold it (the same bytes are the same input, moved or
    touched)."""
    shape = [k for k in ("shape", "dtype", "kind") if old[k] != new[k]]
    if shape:
        return shape
    if "sha256" in old and "sha256" in new:
        return [] if old["sha256"] == new["sha256"] else ["sha256"]
    return [k for k in COMPARED if k in old and k in new and old[k] != new[k] and k != ignore]
