"""The machine's physical limits, measured: memory bandwidth and sgemm FLOP/s.

Bandwidth is the best of several multi-threaded and single-threaded tests — NumPy read
(``sum``) and copy, a jitted ``sum`` over an array split across as many devices as there
are cores, a jitted STREAM triad over all devices, and PyTorch's multi-threaded ``sum`` and
copy where PyTorch is installed — because a single-threaded figure understates what the
machine can move.
"""

from __future__ import annotations

import functools
import os
import platform
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from shardwise._extras import require
from shardwise._runtime.hostmem import HUGE_PAGE_TUNABLE
from shardwise._runtime.timing import best_seconds


def measure_machine(nbytes: int = 320 * 10**6, gemm: int = 2048, repeat: int = 5) -> dict[str, Any]:
    """Memory bandwidth (GB/s, several tests and their best) and sgemm GFLOP/s."""
    import jax
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    cores = os.cpu_count() or 1
    n = nbytes // 4
    x = np.ones(n, np.float32)
    y = np.empty_like(x)
    read = nbytes / best_seconds(lambda: x.sum(), repeat) / 1e9
    copy = 2 * nbytes / best_seconds(lambda: np.copyto(y, x), repeat) / 1e9
    devices = jax.devices()
    results = {"numpy_read_gbps": read, "numpy_copy_gbps": copy}
    for label, count in (
        ("jax_read_gbps", min(cores, len(devices))),
        ("jax_read_all_devices_gbps", len(devices)),
    ):
        total, read_bytes = _jax_sum(x, devices[:count])
        results[label] = read_bytes / best_seconds(total, repeat) / 1e9
    mesh = Mesh(np.array(devices), ("d",))
    m = n // 2 - (n // 2) % len(devices)
    a = jax.device_put(x[:m], NamedSharding(mesh, P("d")))
    b = jax.device_put(x[:m], NamedSharding(mesh, P("d")))
    triad = jax.jit(lambda a, b: a + 1.5 * b)
    results["jax_triad_gbps"] = 3 * a.nbytes / best_seconds(lambda: triad(a, b), repeat) / 1e9
    try:  # PyTorch's reductions and copies use every core: often the best figure
        torch = require("torch", "the PyTorch peer")

        torch.set_num_threads(cores)
        tx, ty = torch.from_numpy(x), torch.from_numpy(y)
        results["torch_read_gbps"] = nbytes / best_seconds(lambda: tx.sum(), repeat) / 1e9
        results["torch_copy_gbps"] = 2 * nbytes / best_seconds(lambda: ty.copy_(tx), repeat) / 1e9
    except ImportError:
        pass
    g = np.ones((gemm, gemm), np.float32)
    sgemm = 2 * gemm**3 / best_seconds(lambda: g @ g, max(2, repeat // 2)) / 1e9
    return {
        "cores": cores,
        "memory_read_gbps": max(v for k, v in results.items() if "read" in k),
        "memory_copy_gbps": max(v for k, v in results.items() if "copy" in k),
        "memory_gbps": max(results.values()),
        "probe_bytes": nbytes,  # (the tiny suite's 8 MB fits a cache: its figure is the cache's)
        "sgemm_gflops": sgemm,
        # whether glibc's malloc asks for huge pages in this process (the shardwise command
        # sets it up; it speeds every large fresh buffer, the peers' too)
        "malloc_huge_pages": HUGE_PAGE_TUNABLE in os.environ.get("GLIBC_TUNABLES", ""),
        "tests": results,
    }


LIBRARIES = ("jax", "jaxlib", "numpy", "shardwise")
"""The libraries every benchmark runs on; a peer's (torch, dask) is added where it ran."""

PEER_LIBRARIES = ("torch", "dask")
"""The peers a benchmark may run beside shardwise that are not among :data:`LIBRARIES`."""


def host(peers: Sequence[str] = (), cpuinfo: Path = Path("/proc/cpuinfo")) -> dict[str, Any]:
    """What a benchmark ran on besides its measured limits: the CPU's model, the system and
    Python, and the version of each library (``None`` where one is not installed), so that
    results from two machines or two installs can be told apart.

    >>> sorted(host(["numpy", "torch"])["versions"])
    ['jax', 'jaxlib', 'numpy', 'shardwise', 'torch']
    """
    names = [*LIBRARIES, *(p for p in peers if p in PEER_LIBRARIES)]
    return {
        "cpu": cpu_model(cpuinfo),
        "system": platform.platform(),
        "python": platform.python_version(),
        "versions": {name: _version(name) for name in names},
    }


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model: Linux's ``model name``, else what :mod:`platform` says, else
    ``"unknown CPU"``."""
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass  # (not Linux, or not readable: platform's word below)
    return platform.processor() or platform.machine() or "unknown CPU"


def _version(name: str) -> str | None:
    if name == "shardwise":  # (the code imported, where an older install's metadata may lie)
        import shardwise

        return shardwise.__version__
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def bandwidth_probe(nbytes: int = 320 * 10**6) -> tuple[Any, int]:
    """A read of ``nbytes`` by the usually fastest reader (PyTorch's multi-threaded ``sum``,
    else a jitted ``sum`` over every device), to be timed in turn with a workload's runners:
    the bandwidth it shows in that same window is the workload's fair roofline, since this
    machine's bandwidth swings by 2× from minute to minute. Returns the call and its bytes.
    """
    x = np.ones(nbytes // 4, np.float32)
    try:
        torch = require("torch", "the PyTorch peer")

        torch.set_num_threads(os.cpu_count() or 1)
        tx = torch.from_numpy(x)
        return (lambda: tx.sum()), x.nbytes
    except ImportError:
        import jax

        return _jax_sum(x, jax.devices())


def _jax_sum(x: np.ndarray, devices: Sequence[Any]) -> tuple[Callable[[], Any], int]:
    """A jitted ``sum`` of ``x`` split over ``devices`` (its tail trimmed to divide evenly),
    and the bytes it reads."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(devices), ("d",))
    arr = jax.device_put(x[: x.size - x.size % len(devices)], NamedSharding(mesh, P("d")))
    return functools.partial(jax.jit(jnp.sum), arr), arr.nbytes
