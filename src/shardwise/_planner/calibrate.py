"""Measure the devices at hand and write a profile: memory bandwidth, matmul FLOP/s, and
all-reduce / all-gather latency and bandwidth along each mesh axis.

Every figure is per device while all devices of the mesh work at once, which is what the
cost model needs (on simulated CPU devices the devices share the host's cores).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from scipy.optimize import nnls

from shardwise._errors import ArgumentError, ShardwiseError
from shardwise._model.mesh import MeshSpec
from shardwise._model.profile import InvalidProfile, Link, Profile
from shardwise._model.profile_files import local_name
from shardwise._model.units import format_bytes
from shardwise._runtime.timing import alternate
from shardwise._xla.resources import device_capacity

MATMULS: tuple[tuple[int, int, int], ...] = (
    (32, 1024, 4096),
    (128, 256, 1024),
    (128, 1024, 256),
    (1024, 256, 256),
    (256, 1024, 1024),
)
"""The matmuls (m, k, n) measured after the square one: a thin one (few rows against a large
weight: the packing rate) first, then shapes of a model's layers split a few ways."""


def _flat(mesh: Mesh) -> P:
    return P(tuple(mesh.axis_names))


def memory_runners(mesh: Mesh, per_device_bytes: int) -> dict[str, Callable[[], object]]:
    """A sum (reads its block) and a scale (reads and writes it) on every device at once."""
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
    return {"memory read": partial(local_sum, x), "memory copy": partial(scale, x)}


def matmul_runner(mesh: Mesh, m: int, k: int, n: int, dtype: str) -> Callable[[], object]:
    """An ``m×k`` by ``k×n`` matmul on every device at once."""
    sharding = NamedSharding(mesh, _flat(mesh))
    x = jax.device_put(jnp.ones((mesh.size, m, k), dtype), sharding)
    w = jax.device_put(jnp.ones((mesh.size, k, n), dtype), sharding)
    return partial(jax.jit(lambda a, b: jnp.einsum("bij,bjk->bik", a, b)), x, w)


def conv_runner(mesh: Mesh, batch: int, side: int) -> Callable[[], object]:
    """A 3x3 convolution of ``batch`` one-feature ``side``x``side`` images into one feature on
    every device at once (its FLOPs and bytes next to nothing: its time per tap)."""
    sharding = NamedSharding(mesh, _flat(mesh))
    x = jax.device_put(jnp.ones((mesh.size * batch, side, side, 1), jnp.float32), sharding)
    k = jnp.ones((3, 3, 1, 1), jnp.float32)
    dims = ("NHWC", "HWIO", "NHWC")
    conv = jax.jit(lambda a: jax.lax.conv_general_dilated(a, k, (1, 1), "SAME",
                                                          dimension_numbers=dims))  # fmt: skip
    return partial(conv, x)


CONVS = ((1, 28), (16, 28))
"""The convolutions (images per device, side) whose times give a CPU's time per tap."""


def fit_conv_tap(seconds: Sequence[float], flops_per_s: float, gemm_Bps: float) -> float:
    """A convolution's time per output position and kernel tap beyond what its FLOPs and bytes
    take (:attr:`~shardwise._model.profile.Profile.conv_tap_s`), from the times of
    :data:`CONVS` (one feature in and out: per image, 6724 taps that fall on the image over
    784 positions, two FLOPs a tap and 8 bytes a position); 0 where the larger one is no
    slower per tap than those take.

    >>> round(fit_conv_tap([0.5e-3, 5.3e-3], 3.5e10, 0.385e9) * 1e9)
    45
    """
    (b0, s0), (b1, s1) = CONVS
    taps = [b * (3 * s - 2) ** 2 for b, s in CONVS]
    slope = (seconds[1] - seconds[0]) / (taps[1] - taps[0])
    bytes_per_tap = 8 * (b1 * s1 * s1 - b0 * s0 * s0) / (taps[1] - taps[0])
    return max(slope - 2 / flops_per_s - bytes_per_tap / gemm_Bps, 0.0)


TURN_SECONDS = 0.02
"""Each turn of a measurement calls it for at least this long and counts the mean."""

MIN_SHARE = 0.01
"""The least share of some matmul's time each term of the fit must explain to be kept."""


def fit_matmul(
    shapes: Sequence[tuple[int, int, int]], seconds: Sequence[float], width: int, platform: str
) -> tuple[float, float]:
    """FLOP/s and bytes/s of :func:`~shardwise._model.cost.predict`'s matmul model from
    matmuls of ``shapes`` (a square one first, a thin one second, any others after): on CPUs
    ``t = FLOPs / F + bytes / B`` (packing, then multiplying), fitted to all of them by
    non-negative least squares on the relative error; elsewhere each bounds its own shape
    (F from the square one, B from the thin one). Where the fit is not positive, where a term
    explains under :data:`MIN_SHARE` of every shape's time, or where fewer than two times are
    positive, the elsewhere rule (on CPUs each of those figures then also pays for the other's
    time: an overestimate). Two shapes fix the line; the operands of a model's matmuls are
    mostly between the two, where a fit to the two ends alone predicted 1.2-1.9× the time.

    >>> f, b = fit_matmul([(512, 512, 512), (32, 1024, 4096)], [0.01, 0.04], 4, "cpu")
    >>> round(f / 1e9, 1), round(b / 1e9, 3)
    (79.1, 0.476)
    """
    flops = np.array([2.0 * m * k * n for m, k, n in shapes])
    moved = np.array([float(width * (m * k + k * n + m * n)) for m, k, n in shapes])
    plain = float(flops[0] / seconds[0]), float(moved[1] / seconds[1])
    if platform != "cpu":
        return plain
    t = np.asarray(seconds, dtype=float)
    ok = np.isfinite(t) & (t > 0)
    if ok.sum() < 2:
        return plain
    shares = np.stack([flops[ok] / t[ok], moved[ok] / t[ok]], axis=1)
    inverse, _ = nnls(shares, np.ones(int(ok.sum())))
    # a term that explains almost none of any matmul's time is not measured, only fitted
    if np.any((shares * inverse).max(axis=0) < MIN_SHARE):
        return plain
    inv_f, inv_b = inverse
    return float(1 / inv_f), float(1 / inv_b)


def collective_runner(mesh: Mesh, axis: str, kind: str, nbytes: int) -> Callable[[], object]:
    """An all-reduce or all-gather of ``nbytes`` per device along ``axis``, every group at once."""
    p = mesh.shape[axis]
    per = max(nbytes // 4, 1)
    if kind == "all-gather":
        per = max(per // p, 1)
    x = jax.device_put(jnp.ones((mesh.size * per,), jnp.float32), NamedSharding(mesh, _flat(mesh)))
    if kind == "all-reduce":
        body = partial(jax.lax.psum, axis_name=axis)
    else:
        body = partial(jax.lax.all_gather, axis_name=axis, tiled=True)
    others = tuple(a for a in mesh.axis_names if a != axis)
    out = P((*others, axis)) if kind == "all-reduce" else P(others or None)
    f = jax.jit(
        jax.shard_map(body, mesh=mesh, in_specs=_flat(mesh), out_specs=out, check_vma=False)
    )
    return partial(f, x)


def fit_link(
    p: int, kind: str, platform: str, small: int, large: int, t_small: float, t_large: float
) -> Link:
    """Latency and bandwidth of a collective over ``p`` devices from its time for a small and
    a large message (bytes per device): as a ring, or on CPUs as one step (as
    ``ring_seconds`` predicts them).

    >>> link = fit_link(4, "all-reduce", "cpu", 1024, 2**20, 2e-4, 1.2e-3)
    >>> round(link.latency_s * 1e6), round(link.bandwidth_Bps / 2**20)
    (200, 1000)
    """
    steps = 2 * (p - 1) if kind == "all-reduce" else p - 1
    factor = steps / p
    if platform == "cpu":
        steps, factor = 1, 1.0  # one step in shared memory (ring_seconds on CPUs)
    latency = max(t_small / max(steps, 1), 1e-7)
    bandwidth = factor * large / max(t_large - steps * latency, t_large * 0.1)
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
    _check_size(mesh, per_device_bytes)

    def step(what: str) -> None:
        if on_step is not None:
            on_step(what)

    small, large = 1024, per_device_bytes // 8
    # elsewhere the matmul fit reads only the square and the thin one
    shapes = [
        (matmul_size, matmul_size, matmul_size),
        *(MATMULS if platform == "cpu" else MATMULS[:1]),
    ]
    dtypes = ("float32", "bfloat16")
    axes = [axis for axis, size in spec.axes if size >= 2]
    step("compiling the measurements")
    runners = _runners(mesh, platform, per_device_bytes, shapes, dtypes, axes, (small, large))
    step(f"{len(runners)} measurements, taking turns")
    # taking turns, a passing load on the machine slows every measurement a little rather
    # than one of them a lot (one all-reduce, timed alone, once came out 6x slow)
    t = alternate(runners, repeat, at_least=TURN_SECONDS)
    _check_times(t)
    bandwidth = max(per_device_bytes / t["memory read"], 2 * per_device_bytes / t["memory copy"])
    flops: dict[str, float] = {}
    packing: dict[str, float] = {}
    for dtype in dtypes:
        times = [t[f"{dtype} {shape}"] for shape in shapes]
        width = jnp.dtype(dtype).itemsize
        flops[dtype], packing[dtype] = fit_matmul(shapes, times, width, platform)
    gemm = min(packing["float32"], bandwidth)
    tap = None
    if platform == "cpu":
        convs = [t[f"conv {batch}x{side}"] for batch, side in CONVS]
        tap = fit_conv_tap(convs, flops["float32"], gemm)
    links: dict[str, Link] = {}
    gathers: dict[str, Link] = {}
    measured: dict[str, float] = {}
    for axis in axes:
        for kind in ("all-reduce", "all-gather"):
            pair = t[f"{kind} {axis} {small}"], t[f"{kind} {axis} {large}"]
            link = fit_link(mesh.shape[axis], kind, platform, small, large, *pair)
            measured[f"{kind}:{axis}:latency_s"] = link.latency_s
            measured[f"{kind}:{axis}:bandwidth_Bps"] = link.bandwidth_Bps
            (links if kind == "all-reduce" else gathers)[axis] = link
    default = _median_link(links) or Link(latency_s=1e-5, bandwidth_Bps=bandwidth)
    stamp = time.strftime("%Y-%m-%d")
    try:
        return Profile(
            name=local_name(platform, mesh.size),
            platform=platform,
            flops_per_s=flops,
            memory_Bps=bandwidth,
            memory_bytes=device_capacity(device),
            link=default,
            axis_links=links,
            gather=_median_link(gathers),
            gather_links=gathers,
            matmul_Bps=gemm,
            conv_tap_s=tap,
            mesh=spec.describe(),
            sources={
                "all": f"shardwise calibrate on {mesh.size} {platform} devices "
                f"({getattr(device, 'device_kind', platform)}), mesh {spec.describe()}, {stamp}; "
                f"per-device figures while every device works at once",
                **{k: f"{v:.4g}" for k, v in measured.items()},
            },
        )
    except InvalidProfile as e:
        raise _unusable(f"made a profile that cannot be used: {e.fact}") from None


def _runners(
    mesh: Mesh,
    platform: str,
    per_device_bytes: int,
    shapes: Sequence[tuple[int, int, int]],
    dtypes: Sequence[str],
    axes: Sequence[str],
    sizes: Sequence[int],
) -> dict[str, Callable[[], object]]:
    """Every measurement :func:`calibrate` takes on ``mesh`` (of ``platform``'s devices), by
    name: memory, the matmuls ``shapes`` in each of ``dtypes``, on CPUs the convolutions
    :data:`CONVS`, and each collective along each of ``axes`` at each of ``sizes`` (bytes per
    device)."""
    runners = memory_runners(mesh, per_device_bytes)
    for dtype in dtypes:
        for shape in shapes:
            runners[f"{dtype} {shape}"] = matmul_runner(mesh, *shape, dtype)
    if platform == "cpu":
        for batch, side in CONVS:
            runners[f"conv {batch}x{side}"] = conv_runner(mesh, batch, side)
    for axis in axes:
        for kind in ("all-reduce", "all-gather"):
            for nbytes in sizes:
                runners[f"{kind} {axis} {nbytes}"] = collective_runner(mesh, axis, kind, nbytes)
    return runners


def _check_times(seconds: dict[str, float]) -> None:
    """Refuse a measurement timed at no time, or at none that is finite: no figure fits it."""
    for name, t in seconds.items():
        if not (math.isfinite(t) and t > 0):
            raise _unusable(f"timed {name} at {t!r} s, which is no time to fit figures to")


def _check_size(mesh: Mesh, per_device_bytes: int) -> None:
    """Refuse a size whose buffers do not fit: the bandwidth tests hold two of
    ``per_device_bytes`` on each device, all of them in the machine's memory for CPU devices
    (16 GiB on 2 devices had failed in XLA as a bug in shardwise; 1.5 GiB on 8 devices of a
    24 GiB machine was killed)."""
    device = mesh.devices.flat[0]
    if device.platform == "cpu":
        have = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        need, where = 2 * per_device_bytes * mesh.size, "this machine's memory"
    else:
        have = device_capacity(device) or 0
        need, where = 2 * per_device_bytes, "a device's memory"
    if have and need > have // 2:
        raise ArgumentError(
            f"a size of {format_bytes(per_device_bytes)} per device needs about "
            f"{format_bytes(need)} for the bandwidth tests, over half {where} "
            f"({format_bytes(have)}); give a smaller size (--size).",
        )


def _unusable(what: str) -> ShardwiseError:
    return ShardwiseError(
        f"calibration {what}; no profile was written. Run shardwise calibrate again (a larger "
        "--size or --repeat measures longer)."
    )


def _median_link(links: dict[str, Link]) -> Link | None:
    """The median latency and bandwidth of ``links`` (``None`` for none)."""
    if not links:
        return None
    return Link(
        latency_s=float(np.median([lk.latency_s for lk in links.values()])),
        bandwidth_Bps=float(np.median([lk.bandwidth_Bps for lk in links.values()])),
    )
