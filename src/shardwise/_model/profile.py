"""Device profiles: the figures the cost model needs, measured or published, each with its source.

A profile gives, per device: peak FLOP/s by dtype, memory bandwidth, memory
capacity, and for collectives along a mesh axis an alpha-beta model (latency in
seconds, link bandwidth in bytes per second). Built-in profiles come from vendor
figures; ``shardwise calibrate`` measures the devices at hand and stores a
profile in the user's cache directory.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from shardwise._caches import cached
from shardwise._errors import ArgumentError, ShardwiseError
from shardwise._files import write_atomic

GB = 1e9
TERA = 1e12


@dataclass(frozen=True, slots=True)
class Link:
    """Alpha-beta model of a collective along one mesh axis.

    Attributes:
        latency_s: alpha, seconds per step of a ring collective (on CPUs, of the one step).
        bandwidth_Bps: beta's inverse, bytes per second one device sends along the axis.
    """

    latency_s: float
    bandwidth_Bps: float


@dataclass(frozen=True, slots=True)
class Profile:
    """What one device of a platform can do.

    Attributes:
        name: e.g. ``"h100"`` or ``"local-cpu-8"``.
        platform: ``"cpu"``, ``"gpu"`` or ``"tpu"``; the cost model predicts what XLA emits there.
        flops_per_s: peak FLOP/s by dtype name (``"float32"``, ``"bfloat16"``, ...).
        memory_Bps: memory bandwidth, bytes per second.
        memory_bytes: memory capacity, bytes (``None`` when unbounded or unknown).
        link: default collective model along any mesh axis.
        axis_links: measured per-axis models, by mesh axis name (calibrated profiles).
        sources: where each figure comes from.
        matmul_Bps: the rate a matmul reads and writes its operands when it is bound by
            memory (few rows against a large weight); ``None``: ``memory_Bps``. On CPUs it is
            far below the streaming rate (the operands are packed first), and the packing
            time adds to the multiplying time (:attr:`flops_per_s`: the rate once packed).
        gather: default model of all-gathers and all-to-alls along any mesh axis; ``None``:
            the all-reduce model. On CPUs they have a rate of their own (about 1.1 ms per MB
            made, against 1.7 ms per MB all-reduced, on 8 simulated devices).
        gather_links: measured all-gather models by mesh axis (calibrated profiles).
    """

    name: str
    platform: str
    flops_per_s: Mapping[str, float]
    memory_Bps: float
    memory_bytes: float | None
    link: Link
    axis_links: Mapping[str, Link] = field(default_factory=dict)
    sources: Mapping[str, str] = field(default_factory=dict)
    matmul_Bps: float | None = None
    gather: Link | None = None
    gather_links: Mapping[str, Link] = field(default_factory=dict)

    def __hash__(self) -> int:
        # a few fields suffice (equal profiles hash equal); the cost model's caches hash the
        # profile on every lookup, and hashing the mappings too made it a planner hot spot
        return hash((self.name, self.platform, self.memory_Bps, self.matmul_Bps))

    @property
    def gemm_Bps(self) -> float:
        """Bytes per second a memory-bound matmul moves (:attr:`matmul_Bps`, else
        :attr:`memory_Bps`)."""
        return self.matmul_Bps or self.memory_Bps

    def flops(self, dtype: str) -> float:
        """Peak FLOP/s for ``dtype`` (float32 if the dtype is not listed)."""
        return self.flops_per_s.get(dtype, self.flops_per_s.get("float32", 1e9))

    def link_for(self, axis: str, kind: str = "all-reduce") -> Link:
        """The model of a ``kind`` collective along ``axis``."""
        if kind in ("all-gather", "all-to-all"):
            found = self.gather_links.get(axis, self.gather)
            if found is not None:
                return found
        return self.axis_links.get(axis, self.link)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["flops_per_s"] = dict(self.flops_per_s)
        data["axis_links"] = {k: asdict(v) for k, v in self.axis_links.items()}
        data["gather_links"] = {k: asdict(v) for k, v in self.gather_links.items()}
        data["sources"] = dict(self.sources)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Profile:
        try:
            return cls(
                name=str(data["name"]),
                platform=str(data["platform"]),
                flops_per_s={str(k): float(v) for k, v in data["flops_per_s"].items()},
                memory_Bps=float(data["memory_Bps"]),
                memory_bytes=None
                if data.get("memory_bytes") is None
                else float(data["memory_bytes"]),
                link=Link(**data["link"]),
                axis_links={k: Link(**v) for k, v in data.get("axis_links", {}).items()},
                sources=dict(data.get("sources", {})),
                matmul_Bps=None if data.get("matmul_Bps") is None else float(data["matmul_Bps"]),
                gather=None if data.get("gather") is None else Link(**data["gather"]),
                gather_links={k: Link(**v) for k, v in data.get("gather_links", {}).items()},
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ShardwiseError(f"profile is malformed ({type(e).__name__}: {e}).") from None


_NVLINK4 = (
    "NVIDIA H100/H200 SXM datasheets: NVLink 4, 900 GB/s bidirectional per GPU, so 450 GB/s "
    "each way; latency 10 µs is an assumed typical small-message NCCL all-reduce step"
)

_HOPPER = Profile(
    name="h100",
    platform="gpu",
    flops_per_s={"bfloat16": 989 * TERA, "float16": 989 * TERA, "float32": 495 * TERA},
    memory_Bps=3350 * GB,
    memory_bytes=80 * GB,
    link=Link(latency_s=10e-6, bandwidth_Bps=450 * GB),
    sources={
        "flops_per_s": "NVIDIA H100 SXM datasheet: 989 TFLOPS dense bf16; float32 as TF32 "
        "tensor cores (JAX's default f32 matmul precision on GPU), 495 TFLOPS dense",
        "memory": "NVIDIA H100 SXM datasheet: 80 GB HBM3, 3.35 TB/s",
        "link": _NVLINK4,
    },
)
"""NVIDIA H100 SXM; the H200 differs in its memory only."""


BUILTIN: dict[str, Profile] = {
    "tpu-v4": Profile(
        name="tpu-v4",
        platform="tpu",
        flops_per_s={"bfloat16": 275 * TERA, "float32": 275 * TERA},
        memory_Bps=1200 * GB,
        memory_bytes=32 * 2**30,
        link=Link(latency_s=5e-6, bandwidth_Bps=90 * GB),
        sources={
            "flops_per_s": "Cloud TPU v4 docs: peak compute per chip 275 TFLOPs (bf16); f32 "
            "matmuls run as bf16 passes at JAX's default precision",
            "memory": "Cloud TPU v4 docs: HBM2 32 GiB, 1200 GBps",
            "link": "derived from Cloud TPU v4 docs: all-reduce bandwidth 1.1 PB/s per 4096-chip "
            "pod ≈ 269 GB/s per chip over 3 torus dimensions ≈ 90 GB/s per axis; latency 5 µs "
            "assumed",
        },
    ),
    "tpu-v5p": Profile(
        name="tpu-v5p",
        platform="tpu",
        flops_per_s={"bfloat16": 459 * TERA, "float32": 459 * TERA},
        memory_Bps=2765 * GB,
        memory_bytes=95 * 2**30,
        link=Link(latency_s=5e-6, bandwidth_Bps=90 * GB),
        sources={
            "flops_per_s": "Cloud TPU v5p docs: peak compute per chip 459 TFLOPs (bf16); f32 "
            "matmuls run as bf16 passes at JAX's default precision",
            "memory": "Cloud TPU v5p docs: HBM2e 95 GiB, 2765 GBps",
            "link": "Cloud TPU v5p docs: ICI 4800 Gbps per chip over 6 links ≈ 90 GB/s per link "
            "one way (the scaling book's W_ici); latency 5 µs assumed",
        },
    ),
    "tpu-v5e": Profile(
        name="tpu-v5e",
        platform="tpu",
        flops_per_s={"bfloat16": 197 * TERA, "float32": 197 * TERA},
        memory_Bps=819 * GB,
        memory_bytes=16 * GB,
        link=Link(latency_s=5e-6, bandwidth_Bps=100 * GB),
        sources={
            "flops_per_s": "Cloud TPU v5e docs: peak compute per chip 197 TFLOPs (bf16)",
            "memory": "Cloud TPU v5e docs: HBM2 16 GB, 819 GBps",
            "link": "Cloud TPU v5e docs: ICI 400 GBps bidirectional per chip over 4 ports in a 2D "
            "torus → 2 ports per axis × 50 GB/s each way = 100 GB/s per axis; latency 5 µs "
            "assumed",
        },
    ),
    "h100": _HOPPER,
    "h200": dataclasses.replace(
        _HOPPER,
        name="h200",
        memory_Bps=4800 * GB,
        memory_bytes=141 * GB,
        sources={
            "flops_per_s": "NVIDIA H200 SXM datasheet: 989 TFLOPS dense bf16 (a bf16 matmul in JAX "
            "0.10.2 reaches ≈790 TFLOP/s on one H200); float32 as TF32, 495 TFLOPS",
            "memory": "NVIDIA H200 SXM datasheet: 141 GB HBM3e, 4.8 TB/s (a device-to-device "
            "copy in JAX 0.10.2 reaches ≈4.3 TB/s)",
            "link": _NVLINK4,
        },
    ),
    "cpu-2core": Profile(
        name="cpu-2core",
        platform="cpu",
        flops_per_s={"float32": 3.5e10, "bfloat16": 3.2e10, "float64": 1.75e10},
        memory_Bps=2.0 * GB,
        memory_bytes=None,
        link=Link(latency_s=100e-6, bandwidth_Bps=0.6 * GB),
        axis_links={},
        sources={
            "all": "shardwise calibrate on a 2-core x86 machine with 24 GiB, 8 simulated CPU "
            "devices, mesh data=2,model=4, 2026-11-30, medians of four runs (per-device "
            "figures while all 8 work at once); float64 assumed half of float32. Used when no "
            "calibrated profile is in the cache",
            "flops_per_s": "with matmul_Bps, fitted as t = FLOPs / F + bytes / B to ten "
            "float32 matmuls from 32x1024x4096 to 2048x256x256 on every device at once",
            "link": "all-reduces of 0.25, 1 and 4 MB per device over 2, 4 and 8 devices: 1.7 ms "
            "per MB whatever the group's size",
            "gather": "all-gathers of the same sizes: about 1.1 ms per MB they make",
        },
        matmul_Bps=0.385 * GB,
        gather=Link(latency_s=100e-6, bandwidth_Bps=0.9 * GB),
    ),
}


def cache_root() -> Path:
    """shardwise's cache: ``$XDG_CACHE_HOME/shardwise`` or ``~/.cache/shardwise``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "shardwise"


def cache_dir() -> Path:
    """Where calibrated profiles live: ``profiles`` in :func:`cache_root`."""
    return cache_root() / "profiles"


def local_name(platform: str, count: int) -> str:
    """Name of the calibrated profile for ``count`` devices of ``platform``."""
    return f"local-{platform}-{count}"


def save_profile(profile: Profile, path: Path | None = None) -> Path:
    """Write ``profile`` as JSON (by default into :func:`cache_dir`)."""
    path = path or cache_dir() / f"{profile.name}.json"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(profile.to_json(), indent=2))
    except OSError as e:
        raise ShardwiseError(f"cannot write profile {str(path)!r}: {e.strerror or e}.") from None
    return path


def load_profile(name: str) -> Profile:
    """A built-in profile, a calibrated one from the cache, or a JSON file.

    Raises:
        ArgumentError: when nothing by that name exists (lists what does).
    """
    if name in BUILTIN:
        return BUILTIN[name]
    candidates = [Path(name), cache_dir() / f"{name}.json"]
    for path in candidates:
        if path.is_file():
            try:
                return Profile.from_json(json.loads(path.read_text()))
            except json.JSONDecodeError as e:
                raise ShardwiseError(f"profile {str(path)!r} is not valid JSON: {e}.") from None
    cached = sorted(p.stem for p in cache_dir().glob("*.json")) if cache_dir().is_dir() else []
    raise ArgumentError(
        f"no profile named {name!r}; valid names are {', '.join([*BUILTIN, *cached])}, or give "
        "the path of a profile JSON file (shardwise calibrate writes one)."
    )


def default_profile(platform: str, count: int) -> Profile:
    """The calibrated profile for these devices if there is one, else a built-in guess.

    The file is read again whenever it changes (its size, time or inode), so a profile
    recalibrated while a program runs is used from then on.
    """
    found = _read_profile(*stamp) if (stamp := profile_stamp(platform, count)) else None
    if found is not None:
        return found
    return {"cpu": BUILTIN["cpu-2core"], "tpu": BUILTIN["tpu-v5e"]}.get(platform, BUILTIN["h100"])


def profile_stamp(platform: str, count: int) -> tuple[str, tuple[int, int, int]] | None:
    """Which calibrated profile file :func:`default_profile` reads for these devices, as it is
    now (path; modification time, size, inode), or ``None`` where there is none: a cheap key
    for caches whose values depend on the profile."""
    path = _profile_path(os.environ.get("XDG_CACHE_HOME"), os.environ.get("HOME"), platform, count)
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return path, (stat.st_mtime_ns, stat.st_size, stat.st_ino)


@cached(maxsize=16)
def _profile_path(xdg: str | None, home: str | None, platform: str, count: int) -> str:
    """The calibrated profile's path for these settings of ``XDG_CACHE_HOME`` and ``HOME``."""
    return str(cache_dir() / f"{local_name(platform, count)}.json")


@cached(maxsize=16)
def _read_profile(path: str, stamp: tuple[int, int, int]) -> Profile | None:
    """The profile in the file at ``path`` as it was at ``stamp``; ``None`` if unreadable, or
    if it is a CPU profile calibrated before the CPU model took collectives as one step and
    matmuls as packing plus multiplying (no ``gather`` key): its figures were fitted to the
    older model, and the built-in one is closer until ``shardwise calibrate`` runs again."""
    try:
        data = json.loads(Path(path).read_text())
        if data.get("platform") == "cpu" and "gather" not in data:
            return None
        return Profile.from_json(data)
    except (
        OSError,
        ShardwiseError,
        json.JSONDecodeError,
        KeyError,
        TypeError,
        ValueError,
        AttributeError,
    ):
        return None
