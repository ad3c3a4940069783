"""Measure the devices at hand and write a profile: memory bandwidth, matmul FLOP/s, and
all-reduce / all-gather latency and bandwidth along each mesh axis.

Every figure is per device while all devices of the mesh work at once, which is what the
cost model needs (on simulated CPU devices the devices share the host's cores).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from shardwise._model.mesh import MeshSpec
from shardwise._model.profile import Link, Profile, local_name
from shardwise._runtime.timing import median_seconds
from shardwise._xla.resources import device_capacity


def _flat(mesh: Mesh) -> P:
    return P(tuple(mesh.axis_names))


def memory_bandwidth(mesh: Mesh, per_device_bytes: int, repeat: int) -> float:
    """Bytes per second one device reads, the best of a sum (read) and a scale (read + write)."""
    n = mesh.size * (per_device_bytes // 4)
    x = jax.device_put(jnp.ones((n,), jnp.float32), NamedSharding(mesh, _flat(mesh)))
    local_sum = jax.jit(
        jax.shard_map(
            lambda b: jnp.sum(b, keepdims=True),
            mesh=mesh,
            in_specs=_flat(mesh),
            out_specs=_flat(mesh),
        )
    )
    scale = jax.jit(lambda b: b * 1.0001)
    read = per_device_bytes / median_seconds(lambda: local_sum(x), repeat)
    copy = 2 * per_device_bytes / median_seconds(lambda: scale(x), repeat)
    return max(read, copy)


def matmul_flops(mesh: Mesh, size: int, dtype: str, repeat: int) -> float:
    """FLOP/s of one device doing a ``size``³ matmul while every device does one."""
    a = jax.device_put(jnp.ones((mesh.size, size, size), dtype), NamedSharding(mesh, _flat(mesh)))
    mm = jax.jit(lambda x: jnp.einsum("bij,bjk->bik", x, x))
    return 2 * size**3 / median_seconds(lambda: mm(a), repeat)


def matmul_bandwidth(mesh: Mesh, rows: int, k: int, n: int, repeat: int) -> float:
    """Bytes per second one device moves in a memory-bound matmul, while every device does one:
    ``rows`` rows against its own ``k`` × ``n`` weight (an MLP layer's data-parallel shape)."""
    sharding = NamedSharding(mesh, _flat(mesh))
    x = jax.device_put(jnp.ones((mesh.size, rows, k), jnp.float32), sharding)
    w = jax.device_put(jnp.ones((mesh.size, k, n), jnp.float32), sharding)
    mm = jax.jit(lambda a, b: jnp.einsum("bij,bjk->bik", a, b))
    moved = 4 * (rows * k + k * n + rows * n)
    return moved / median_seconds(lambda: mm(x, w), repeat)


def collective_link(mesh: Mesh, axis: str, kind: str, small: int, large: int, repeat: int) -> Link:
    """Fit latency and bandwidth of a ring collective along ``axis`` from a small and a
    large message (bytes per device)."""
    p = mesh.shape[axis]
    steps = 2 * (p - 1) if kind == "all-reduce" else p - 1
    factor = steps / p

    def timed(nbytes: int) -> float:
        per = max(nbytes // 4, 1)
        if kind == "all-gather":
            per = max(per // p, 1)
        x = jax.device_put(
            jnp.ones((mesh.size * per,), jnp.float32), NamedSharding(mesh, _flat(mesh))
        )
        if kind == "all-reduce":
            body = partial(jax.lax.psum, axis_name=axis)
        else:
            body = partial(jax.lax.all_gather, axis_name=axis, tiled=True)
        others = tuple(a for a in mesh.axis_names if a != axis)
        out = P((*others, axis)) if kind == "all-reduce" else P(others or None)
        f = jax.jit(
            jax.shard_map(body, mesh=mesh, in_specs=_flat(mesh), out_specs=out, check_vma=False)
        )
        return median_seconds(lambda: f(x), repeat)

    t_small, t_large = timed(small), timed(large)
    latency = max(t_small / max(steps, 1), 1e-7)
    moved = factor * large
    bandwidth = moved / max(t_large - steps * latency, t_large * 0.1)
    return Link(latency_s=latency, bandwidth_Bps=bandwidth)


def calibrate(
    mesh: Mesh,
    per_device_bytes: int = 64 * 2**20,
    matmul_size: int = 512,
    repeat: int = 5,
    on_step: Callable[[str], None] | None = None,
) -> Profile:
    """Measure ``mesh``'s devices and return a profile named ``local-<platform>-<count>``."""
    device = mesh.devices.flat[0]
    platform = device.platform
    spec = MeshSpec.parse(mesh)

    def step(what: str) -> None:
        if on_step is not None:
            on_step(what)

    step("memory bandwidth")
    bandwidth = memory_bandwidth(mesh, per_device_bytes, repeat)
    flops: dict[str, float] = {}
    for dtype in ("float32", "bfloat16"):
        step(f"{dtype} matmul")
        flops[dtype] = matmul_flops(mesh, matmul_size, dtype, repeat)
    step("memory-bound matmul")
    gemm = matmul_bandwidth(mesh, 32, 1024, 4096, repeat)
    links: dict[str, Link] = {}
    measured: dict[str, float] = {}
    for axis, size in spec.axes:
        if size < 2:
            continue
        for kind in ("all-reduce", "all-gather"):
            step(f"{kind} along {axis}")
            link = collective_link(mesh, axis, kind, 1024, per_device_bytes // 8, repeat)
            measured[f"{kind}:{axis}:latency_s"] = link.latency_s
            measured[f"{kind}:{axis}:bandwidth_Bps"] = link.bandwidth_Bps
            if kind == "all-reduce":
                links[axis] = link
    default = (
        Link(
            latency_s=float(np.median([lk.latency_s for lk in links.values()])),
            bandwidth_Bps=float(np.median([lk.bandwidth_Bps for lk in links.values()])),
        )
        if links
        else Link(latency_s=1e-5, bandwidth_Bps=bandwidth)
    )
    stamp = time.strftime("%Y-%m-%d")
    return Profile(
        name=local_name(platform, mesh.size),
        platform=platform,
        flops_per_s=flops,
        memory_Bps=bandwidth,
        memory_bytes=device_capacity(device),
        link=default,
        axis_links=links,
        matmul_Bps=min(gemm, bandwidth),
        sources={
            "all": f"shardwise calibrate on {mesh.size} {platform} devices "
            f"({getattr(device, 'device_kind', platform)}), mesh {spec.describe()}, {stamp}; "
            f"per-device figures while every device works at once",
            **{k: f"{v:.4g}" for k, v in measured.items()},
        },
    )
