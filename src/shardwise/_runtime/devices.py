"""Devices: simulated CPU devices and what the platform has.

JAX fixes the number of CPU devices when its backend first starts, so the
request for simulated devices must come before any JAX computation.
"""

from __future__ import annotations

import os

from shardwise._errors import MeshError

ENV_CPU_DEVICES = "SHARDWISE_CPU_DEVICES"
"""Environment variable: number of simulated CPU devices for the ``shardwise`` command and the
processes ``shardwise launch`` starts (see :func:`apply_env`)."""


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
        MeshError: when ``count`` is not positive, or JAX has already started
            with a different number of CPU devices.
    """
    import jax

    if count < 1:
        raise MeshError(f"cannot simulate {count} CPU devices: the count must be at least 1.")
    if backend_started():
        have = len(jax.devices("cpu"))
        if have == count:
            return
        raise MeshError(
            f"asked for {count} simulated CPU devices, but JAX has already started with "
            f"{have}. Request devices before any JAX computation: call "
            f"shardwise.use_cpu_devices({count}) right after import (for the shardwise "
            f"command: --devices {count} or {ENV_CPU_DEVICES}={count})."
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
