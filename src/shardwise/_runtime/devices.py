"""Devices: simulated CPU devices and what the platform has.

JAX fixes the number of CPU devices when its backend first starts, so the
request for simulated devices must come before any JAX computation.
"""

from __future__ import annotations

import numbers
import os
import sys

from shardwise._errors import MeshError

ENV_CPU_DEVICES = "SHARDWISE_CPU_DEVICES"
"""Environment variable: number of simulated CPU devices for the ``shardwise`` command and the
processes ``shardwise launch`` starts (see :func:`apply_env`)."""

MAX_CPU_DEVICES = 4096
"""The most CPU devices shardwise simulates in one process: the chips of a TPU v4 pod, the
largest single mesh worth rehearsing on one host. XLA starts a host thread for every simulated
device (two each for the first 256) with the backend, and its memory and start-up grow with the
count: 100000 devices take gigabytes and never finish starting, and where the operating system
refuses a thread XLA aborts the whole process, which Python cannot catch. Larger meshes can
still be planned: ``plan_einsum`` with a mesh given as text (and a profile) needs no devices."""

_BACKEND_ADDRESS_SPACE = 2 << 30
"""Address space kept free for the JAX backend itself and the program (bytes)."""


def cpu_device_limit() -> tuple[int, str]:
    """The most CPU devices this process can simulate, and what sets that bound:
    :data:`MAX_CPU_DEVICES`, or this process's limits on address space (every device thread
    reserves a stack) and on threads (``ulimit -v`` and ``ulimit -u``), where they are lower.

    >>> cpu_device_limit()[0] <= MAX_CPU_DEVICES
    True
    """
    bounds = [(MAX_CPU_DEVICES, "shardwise's limit, the chips of a TPU v4 pod")]
    try:
        import resource
    except ImportError:  # (not on Windows)
        return bounds[0]
    stack = resource.getrlimit(resource.RLIMIT_STACK)[0]
    per_thread = (stack if 0 < stack < 1 << 30 else 8 << 20) + (64 << 10)  # stack + guard
    space, used = resource.getrlimit(resource.RLIMIT_AS)[0], _status_field("VmSize")
    if space != resource.RLIM_INFINITY and used is not None:
        free = (space - used - _BACKEND_ADDRESS_SPACE) // per_thread
        bounds.append((_devices_for(free), "this process's address space limit, ulimit -v"))
    threads = resource.getrlimit(resource.RLIMIT_NPROC)[0]
    if threads != resource.RLIM_INFINITY:
        free = threads - (_status_field("Threads", scale=1) or 1) - 16
        bounds.append((_devices_for(free), "the limit on threads, ulimit -u"))
    best = min(bounds)
    return max(best[0], 1), best[1]


def _devices_for(threads: int) -> int:
    """How many devices ``threads`` host threads can serve (two threads each for the first 256)."""
    return threads // 2 if threads <= 512 else threads - 256


def _status_field(name: str, scale: int = 1024) -> int | None:
    """A number from ``/proc/self/status`` (``VmSize`` in bytes, ``Threads``), or ``None``."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(name + ":"):
                    return int(line.split()[1]) * scale
    except (OSError, ValueError, IndexError):
        return None
    return None


def backend_started() -> bool:
    """True once JAX has created its backends (after which the device count is fixed)."""
    from jax._src import xla_bridge

    return bool(xla_bridge.backends_are_initialized())


def use_cpu_devices(count: int) -> None:
    """Simulate ``count`` CPU devices; call before any JAX computation.

    On a host with a GPU or TPU the real devices stay the default; this only
    changes how many devices the CPU platform shows.

    Args:
        count: number of CPU devices, at least 1.

    Raises:
        MeshError: when ``count`` is not positive, more than this process can simulate
            (:func:`cpu_device_limit`), or JAX has already started with a different number
            of CPU devices.
    """
    import jax

    if isinstance(count, bool) or not isinstance(count, numbers.Integral) or count < 1:
        raise MeshError(
            f"cannot simulate {count!r} CPU devices: the count must be a whole number of at "
            "least 1."
        )
    count = int(count)
    started = backend_started()
    have = len(jax.devices("cpu")) if started else None
    if have == count:
        return
    limit, why = cpu_device_limit()
    if count > limit:
        raise MeshError(
            f"cannot simulate {count} CPU devices: this process can simulate at most {limit} "
            f"({why}). Each simulated device is a host thread, and XLA aborts the process if "
            f"one cannot start. Use a mesh of at most {limit} devices; to plan a larger mesh, "
            "give it as text with a profile (shardwise plan --mesh x=… --profile …), which "
            "needs no devices."
        )
    if started:
        fact = f"asked for {count} simulated CPU devices, but JAX has already started with {have}."
        raise MeshError(
            f"{fact} Request devices before any JAX computation: call "
            f"shardwise.use_cpu_devices({count}) right after import.",
            shell=f"{fact} Give --devices {count}, or set {ENV_CPU_DEVICES}={count}.",
        )
    jax.config.update("jax_num_cpu_devices", count)


def apply_env() -> None:
    """Apply ``SHARDWISE_CPU_DEVICES`` if it is set (the ``shardwise`` command, the processes
    ``shardwise launch`` starts and Dask workers call this; ``import shardwise`` does not)."""
    raw = os.environ.get(ENV_CPU_DEVICES, "").strip()
    if not raw:
        return
    try:
        count = int(raw)
    except ValueError:
        raise MeshError(
            f"{ENV_CPU_DEVICES}={raw!r} is not a whole number; set it to the number of "
            "CPU devices to simulate, e.g. 8."
        ) from None
    use_cpu_devices(count)


def device_summary() -> dict[str, object]:
    """Platform, count and processes of the default devices, e.g.
    ``{"platform": "cpu", "count": 8, "processes": 1}``."""
    import jax

    devices = jax.devices()
    return {
        "platform": devices[0].platform,
        "count": len(devices),
        "processes": int(jax.process_count()),
    }
