"""Host memory for CPU devices: aligned buffers that the devices use in place, in huge pages.

On CPU a device's memory is host memory, so how it is allocated decides how fast every
memory-bound kernel runs. ``jax.device_put`` copies each shard into memory of 4 KiB pages;
streaming through those costs a TLB miss per page and stops the hardware prefetcher at every
page boundary. NumPy asks Linux for transparent huge pages (2 MiB) for large arrays, so memory-bound
kernels read NumPy's memory faster than JAX's (``benchmarks/`` has the figures).
:func:`put_cpu` copies each shard once into a
2 MiB-aligned NumPy buffer and hands it to its device without a second copy (a CPU device
uses 64-byte-aligned host memory in place), so shardwise's kernels read huge pages too.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import math
import mmap
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from shardwise._caches import cached

HUGE_PAGE = 2 << 20
"""The size and alignment of a transparent huge page on x86-64 and most arm64 Linux."""

MIN_HUGE_BYTES = 4 << 20
"""Shards smaller than this are placed by ``jax.device_put`` as usual: NumPy asks for huge
pages only from 4 MiB, and small shards gain nothing."""


MALLOC_ENV = "SHARDWISE_MALLOC_TUNING"
"""Set to ``0`` to leave the C allocator's settings alone (see :func:`keep_freed_memory_warm`)."""

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


@cached(maxsize=1)
def keep_freed_memory_warm() -> bool:
    """Have glibc's ``malloc`` keep freed memory for reuse rather than hand it back to the
    system, for the whole process: allocations under 16 MiB come from its heaps, and free
    space at a heap's top is returned only past 64 MiB. Returns whether the settings took.

    A CPU device's output buffers are ``malloc``'d for every call; by default glibc maps each
    large one afresh and unmaps it when freed, so every call faults its output's pages in
    again. With these settings repeated calls reuse warm memory (``benchmarks/`` has the
    figures). The cost is that some freed memory (at most 64 MiB at the top of each heap)
    stays resident. Opt-in: the ``shardwise`` command calls it; a program that runs many
    small sharded calls on CPU devices may call ``shardwise.keep_freed_memory_warm()``.
    ``SHARDWISE_MALLOC_TUNING=0`` turns it off. A no-op where the C library is not glibc.
    """
    if os.environ.get(MALLOC_ENV, "").strip() == "0":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    # both together: setting either one alone turns off glibc's own adaptive threshold and
    # is slower than the default
    trim = mallopt(_M_TRIM_THRESHOLD, 64 << 20)
    return bool(trim and mallopt(_M_MMAP_THRESHOLD, 16 << 20))


HUGE_PAGE_TUNABLE = "glibc.malloc.hugetlb=1"
"""The glibc (2.35 and later) setting that makes ``malloc`` ask for transparent huge pages
for the blocks it maps: read once, when a process starts, from ``GLIBC_TUNABLES``."""


def huge_page_environ(
    environ: Mapping[str, str], libc: str | None, thp: str | None
) -> dict[str, str] | None:
    """The environment to run the ``shardwise`` command again in so that glibc's ``malloc``
    asks for huge pages for large blocks, or None when that gains nothing or was asked not
    to (``SHARDWISE_MALLOC_TUNING=0``).

    A CPU device's output of more than 32 MiB (the most glibc serves from its heaps) is
    mapped afresh on every call and faulted in 4 KiB at a time; with
    :data:`HUGE_PAGE_TUNABLE` it is faulted in 2 MiB at a time, the same memory resident.
    Only where Linux gives huge pages on request (``madvise`` mode; with ``always`` every
    large mapping gets them anyway).

    Args:
        environ: the process's environment.
        libc: ``os.confstr("CS_GNU_LIBC_VERSION")``, e.g. ``"glibc 2.36"``.
        thp: the contents of ``/sys/kernel/mm/transparent_hugepage/enabled``.

    >>> huge_page_environ({}, "glibc 2.36", "always [madvise] never")["GLIBC_TUNABLES"]
    'glibc.malloc.hugetlb=1'
    >>> huge_page_environ({}, "glibc 2.31", "always [madvise] never") is None
    True
    """
    if environ.get(MALLOC_ENV, "").strip() == "0" or not thp or "[madvise]" not in thp:
        return None
    name, _, version = (libc or "").partition(" ")
    try:
        major, minor = (int(v) for v in version.split(".")[:2])
    except ValueError:
        return None
    tunables = environ.get("GLIBC_TUNABLES", "")
    if name != "glibc" or (major, minor) < (2, 35) or "glibc.malloc.hugetlb" in tunables:
        return None
    return {
        **environ,
        "GLIBC_TUNABLES": f"{tunables}:{HUGE_PAGE_TUNABLE}" if tunables else HUGE_PAGE_TUNABLE,
    }


def huge_page_facts() -> tuple[str | None, str | None]:
    """What :func:`huge_page_environ` decides on, read from this machine: the C library's
    name and version, and Linux's transparent huge page mode (None where unknown)."""
    if not sys.platform.startswith("linux"):
        return None, None
    try:
        libc = os.confstr("CS_GNU_LIBC_VERSION")
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return libc, f.read()
    except (OSError, ValueError):
        return None, None


def rerun_with_huge_pages() -> None:
    """Replace this process by the same command run with :data:`HUGE_PAGE_TUNABLE`, where
    :func:`huge_page_environ` says it gains something; otherwise return. Called first thing
    by the ``shardwise`` command (:mod:`shardwise._main`: only NumPy is imported yet); the
    new process inherits the setting, so it and its children run on."""
    env = huge_page_environ(os.environ, *huge_page_facts())
    if env is None:
        return
    try:
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
    except OSError:
        return  # run on as we are


def aligned_empty(shape: Sequence[int], dtype: Any, align: int = 4096) -> np.ndarray:
    """An uninitialised array whose data start on an ``align``-byte boundary.

    >>> aligned_empty((3, 5), np.float32, align=256).ctypes.data % 256
    0
    """
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    raw = np.empty(nbytes + align, np.uint8)
    offset = (-raw.ctypes.data) % align
    out: np.ndarray = raw[offset : offset + nbytes].view(dtype).reshape(shape)
    return out


def lazy_zeros(shape: Sequence[int], dtype: Any) -> np.ndarray:
    """A page-aligned array of zeros whose memory is allocated only where it is written
    (an anonymous memory map: reading untouched pages costs no memory and no zeroing).

    >>> z = lazy_zeros((4, 1000), np.float32)
    >>> float(z.sum()), z.ctypes.data % 4096
    (0.0, 0)
    """
    dtype = np.dtype(dtype)
    count = int(np.prod(shape))
    if count == 0:
        return np.zeros(shape, dtype)
    return np.frombuffer(mmap.mmap(-1, count * dtype.itemsize), dtype).reshape(shape)


def cpu_only(sharding: Any, shape: tuple[int, ...]) -> dict[Any, Any] | None:
    """Each device's index into ``shape``, if every device is a CPU device of this process."""
    if not sharding.is_fully_addressable:
        return None
    devices = sharding.addressable_devices_indices_map(shape)
    if any(d.platform != "cpu" for d in devices):
        return None
    return dict(devices)


def in_place(block: np.ndarray, sharding: Any, shape: Sequence[int] | None = None) -> Any:
    """``block`` as a global array, each CPU device using its own aligned rows of it in place
    (``jax.device_put`` to a single CPU device does not copy aligned host memory; to a
    sharding it does). The caller must not change ``block`` until the computation is done.

    ``shape`` (default ``block.shape``) may be longer than ``block`` along the first axis:
    the missing rows are zeros, and only the devices that hold some of them get a buffer of
    their own.
    """
    import jax

    full = tuple(block.shape if shape is None else shape)
    devices = cpu_only(sharding, full)
    if devices is None:
        if full != block.shape:
            padded = np.zeros(full, block.dtype)
            padded[: block.shape[0]] = block
            block = padded
        return jax.device_put(block, sharding)
    pieces = []
    for device, index in devices.items():
        bounds = [i.indices(n) for i, n in zip(index, full, strict=False)]
        if not full or bounds[0][1] <= block.shape[0]:
            pieces.append(jax.device_put(block[index], device))
            continue
        part = lazy_zeros([len(range(*b)) for b in bounds], block.dtype)
        start = bounds[0][0]
        have = max(0, block.shape[0] - start)
        part[:have] = block[(slice(start, start + have), *index[1:])]
        pieces.append(jax.device_put(part, device))
    return jax.make_array_from_single_device_arrays(full, sharding, pieces)


def put_cpu(host: np.ndarray, sharding: Any) -> Any:
    """``host`` placed with ``sharding``, each CPU device's shard copied once into its own
    huge-page buffer (see the module's note); anything else goes to ``jax.device_put``.

    The result never shares memory with ``host``: changing ``host`` afterwards changes
    nothing on the devices.
    """
    import jax

    devices = cpu_only(sharding, host.shape)
    shard_bytes = math.prod(sharding.shard_shape(host.shape)) * host.dtype.itemsize
    if devices is None or shard_bytes < MIN_HUGE_BYTES:
        return jax.device_put(host, sharding)
    pieces = []
    staging = _STAGING.get()
    for device, index in devices.items():
        part = host[index]
        if staging is None:
            buffer = aligned_empty(part.shape, part.dtype, align=HUGE_PAGE)
        else:
            buffer = staging.take(part.shape, part.dtype)
        np.copyto(buffer, part)
        pieces.append(jax.device_put(buffer, device))
    return jax.make_array_from_single_device_arrays(host.shape, sharding, pieces)


class Staging:
    """Host buffers for CPU devices' shards that are used again once their arrays are gone:
    placing one layout after another (``plan --verify`` of an einsum's strategies) otherwise
    asks the system for fresh memory each time, and the first touch of every page of it had
    cost more than the runs timed. Within :func:`staged`,
    :func:`put_cpu` copies each shard into the smallest free buffer that holds it, or a new
    one; :meth:`recycle` deletes the arrays placed and frees their buffers. Placing the
    largest layout first, every later one fits in its buffers.
    """

    def __init__(self) -> None:
        self._free: list[np.ndarray] = []
        self._lent: list[np.ndarray] = []

    def take(self, shape: Sequence[int], dtype: Any) -> np.ndarray:
        """An uninitialised, 2 MiB-aligned array of ``shape`` and ``dtype``."""
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        fits = [b for b in self._free if b.nbytes >= nbytes]
        if fits:
            raw = min(fits, key=lambda b: b.nbytes)
            self._free.remove(raw)
        else:
            raw = aligned_empty((nbytes,), np.uint8, align=HUGE_PAGE)
        self._lent.append(raw)
        out: np.ndarray = raw[:nbytes].view(dtype).reshape(shape)
        return out

    def recycle(self, arrays: Sequence[Any]) -> None:
        """Delete ``arrays`` (the only holders of the buffers lent since the last call:
        nothing must still read them) and make their buffers free to take again."""
        for array in arrays:
            array.delete()
        self._free += self._lent
        self._lent = []


_STAGING: contextvars.ContextVar[Staging | None] = contextvars.ContextVar(
    "shardwise_staging", default=None
)


@contextlib.contextmanager
def staged() -> Iterator[Staging]:
    """:func:`put_cpu` takes its buffers from one :class:`Staging` until the block ends."""
    staging = Staging()
    token = _STAGING.set(staging)
    try:
        yield staging
    finally:
        _STAGING.reset(token)
