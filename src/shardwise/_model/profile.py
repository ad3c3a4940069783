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
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from shardwise._errors import ArgumentError
from shardwise._model.dtype_names import NAMES, is_dtype_name
from shardwise._model.figures import figure_fault, json_type

GB = 1e9
TERA = 1e12

PLATFORMS = ("cpu", "gpu", "tpu")
"""The platforms a profile can describe (JAX's names for them)."""


class InvalidProfile(ArgumentError):
    """A profile's figures are not usable; ``fact`` says which one and why, without naming
    where the profile came from (the caller that knows adds that)."""

    def __init__(self, name: object, fact: str) -> None:
        super().__init__(
            f"profile {name!r} is not usable: {fact}. Give every figure as a finite number "
            "above 0 (latencies and conv_tap_s may be 0), or measure the devices with shardwise "
            "calibrate."
        )
        self.fact = fact


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
        conv_tap_s: a convolution's time per output position (a batch element at one output
            pixel) and kernel tap it reads there, on top of its FLOPs and bytes; ``None``:
            none. XLA's CPU backend takes about that long whatever the features (one output
            feature or thirty-two), so a convolution whose output features are split saves
            no time, and a kernel's gradient split on the batch none either.
        mesh: the mesh a calibrated profile's ``axis_links`` and ``gather_links`` were
            measured on (``"data=2,model=4"``); ``None``: not recorded.
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
    conv_tap_s: float | None = None
    mesh: str | None = None

    @property
    def overlaps_collectives(self) -> bool:
        """Whether XLA runs collectives beside compute here (asynchronously, on GPUs and
        TPUs); on CPUs it runs them one after the other with the compute."""
        return self.platform in ("gpu", "tpu")

    def __post_init__(self) -> None:
        fact = _invalid(self)
        if fact is not None:
            raise InvalidProfile(self.name, fact)

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
    def from_json(cls, data: object) -> Profile:
        """The profile ``data`` (as :meth:`to_json` writes it) describes.

        Raises:
            InvalidProfile: for anything else: another type, an unknown or missing key, a
                figure that is not a finite number above 0 (a string, a bool, NaN, ...).
        """
        name = data.get("name") if isinstance(data, dict) else None
        if not isinstance(data, dict):
            raise InvalidProfile(name, f"it is a JSON {json_type(data)}, not an object")
        unknown = sorted(set(data) - set(_FIELDS))
        if unknown:
            raise InvalidProfile(
                name, f"it has the unknown key {unknown[0]!r} (the keys are {', '.join(_FIELDS)})"
            )
        missing = [k for k in _REQUIRED if k not in data]
        if missing:
            raise InvalidProfile(name, f"it has no {missing[0]!r}")
        for key in ("flops_per_s", "axis_links", "sources", "gather_links"):
            if not isinstance(data.get(key, {}), dict):
                raise InvalidProfile(name, f"{key} is a JSON {json_type(data[key])}, not an object")
        gather = data.get("gather")
        return cls(
            name=data["name"],
            platform=data["platform"],
            flops_per_s=dict(data["flops_per_s"]),
            memory_Bps=data["memory_Bps"],
            memory_bytes=data.get("memory_bytes"),
            link=_link(name, "link", data["link"]),
            axis_links={k: _link(name, f"axis_links[{k!r}]", v) for k, v in
                        data.get("axis_links", {}).items()},
            sources=dict(data.get("sources", {})),
            matmul_Bps=data.get("matmul_Bps"),
            gather=None if gather is None else _link(name, "gather", gather),
            gather_links={k: _link(name, f"gather_links[{k!r}]", v) for k, v in
                          data.get("gather_links", {}).items()},
            conv_tap_s=data.get("conv_tap_s"),
            mesh=data.get("mesh"),
        )  # fmt: skip


_FIELDS = tuple(f.name for f in dataclasses.fields(Profile))
_REQUIRED = ("name", "platform", "flops_per_s", "memory_Bps", "link")
_LINK_FIELDS = tuple(f.name for f in dataclasses.fields(Link))


def _link(name: object, where: str, value: object) -> Link:
    """The link a profile's JSON gives at ``where`` (its figures checked with the profile's)."""
    if not isinstance(value, dict) or set(value) != set(_LINK_FIELDS):
        raise InvalidProfile(
            name,
            f"{where} is {json.dumps(value)[:80]}; give an object of two figures, latency_s and "
            "bandwidth_Bps",
        )
    return Link(**value)


def _invalid(p: Profile) -> str | None:
    """Why ``p`` is not a usable profile, or ``None`` when it is: every figure a finite number
    (not a bool or a string) above 0, latencies 0 or more; a known platform; names as text."""
    if not isinstance(p.name, str) or not p.name:
        return f"name is {p.name!r}; give the profile a name"
    if p.platform not in PLATFORMS:
        return f"platform is {p.platform!r}; it must be one of {', '.join(PLATFORMS)}"
    if not isinstance(p.flops_per_s, Mapping) or not p.flops_per_s:
        return "flops_per_s is empty; give the peak FLOP/s of float32 at least"
    odd = [k for k in p.flops_per_s if not is_dtype_name(k)]
    if odd:  # (a short form, "f32", had been read as no rate: 1 GFLOP/s, 45 times too slow)
        said = f" (write {NAMES[odd[0]]!r})" if odd[0] in NAMES else ""
        return (
            f"flops_per_s names {odd[0]!r}, which is not a dtype's NumPy name{said}; name "
            f"each as NumPy does ({', '.join(dict.fromkeys(NAMES.values()))}, float8_e4m3fn…)"
        )
    if "float32" not in p.flops_per_s:
        return (
            "flops_per_s has no float32; give the peak FLOP/s of float32 at least (it is "
            "the rate of every dtype the profile does not name)"
        )
    figures: list[tuple[object, str, bool]] = [
        (v, f"flops_per_s[{k!r}]", False) for k, v in p.flops_per_s.items()
    ]
    figures.append((p.memory_Bps, "memory_Bps", False))
    figures += [(v, k, False) for k, v in (("memory_bytes", p.memory_bytes),
                ("matmul_Bps", p.matmul_Bps)) if v is not None]  # fmt: skip
    if p.conv_tap_s is not None:
        figures.append((p.conv_tap_s, "conv_tap_s", True))
    links: list[tuple[str, object]] = [("link", p.link)]
    if p.gather is not None:
        links.append(("gather", p.gather))
    for group in ("axis_links", "gather_links"):
        mapping = getattr(p, group)
        if not isinstance(mapping, Mapping):
            return f"{group} is {type(mapping).__name__}, not a mapping of mesh axis to link"
        links += [(f"{group}[{k!r}]", v) for k, v in mapping.items()]
    for where, link in links:
        if not isinstance(link, Link):
            return f"{where} is {type(link).__name__}, not a Link"
        figures.append((link.latency_s, f"{where}.latency_s", True))
        figures.append((link.bandwidth_Bps, f"{where}.bandwidth_Bps", False))
    for value, where, zero_ok in figures:
        fact = figure_fault(value, where, zero_ok)
        if fact is not None:
            return fact
    keys = [*p.flops_per_s, *p.axis_links, *p.gather_links]
    if isinstance(p.sources, Mapping):
        keys += list(p.sources)
        if not all(isinstance(v, str) for v in p.sources.values()):
            return "sources has an entry that is not text"
    else:
        return f"sources is {type(p.sources).__name__}, not a mapping of figure to text"
    if not all(isinstance(k, str) for k in [*keys, *([p.mesh] if p.mesh is not None else [])]):
        return "a dtype, mesh axis, source or the mesh is named by something other than text"
    return None


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
        link=Link(latency_s=5e-6, bandwidth_Bps=45 * GB),
        sources={
            "flops_per_s": "Cloud TPU v4 docs: peak compute per chip 275 TFLOPs (bf16); f32 "
            "matmuls run as bf16 passes at JAX's default precision",
            "memory": "Cloud TPU v4 docs: HBM2 32 GiB, 1200 GBps",
            "link": "the scaling book (tpus.md), interconnect table: TPU v4p 4.5e10 B/s one way "
            "per link, 9e10 both ways (its W_ici); latency 5 µs assumed",
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
        link=Link(latency_s=5e-6, bandwidth_Bps=45 * GB),
        sources={
            "flops_per_s": "Cloud TPU v5e docs: peak compute per chip 197 TFLOPs (bf16)",
            "memory": "Cloud TPU v5e docs: HBM2 16 GB, 819 GBps",
            "link": "the scaling book (tpus.md), interconnect table: TPU v5e 4.5e10 B/s one way "
            "per link, 9e10 both ways (its W_ici); latency 5 µs assumed",
        },
    ),
    "tpu-v6e": Profile(
        name="tpu-v6e",
        platform="tpu",
        flops_per_s={"bfloat16": 918 * TERA, "float32": 918 * TERA},
        memory_Bps=1638 * GB,
        memory_bytes=32 * GB,
        link=Link(latency_s=5e-6, bandwidth_Bps=90 * GB),
        sources={
            "flops_per_s": "Cloud TPU v6e (Trillium) docs: peak compute per chip 918 TFLOPs (bf16)",
            "memory": "Cloud TPU v6e docs: HBM 32 GB, 1638 GBps per chip",
            "link": "the scaling book (tpus.md), interconnect table: TPU v6e 9e10 B/s one way "
            "per link, 1.8e11 both ways (its W_ici); latency 5 µs assumed",
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
            "conv_tap_s": "3x3 convolutions of one feature over 784 and 12544 positions "
            "per device, on every device at once, 2026-12-04: 0.46-0.51 us per position, "
            "about 55 ns per tap, beyond their FLOPs and bytes (as much with 16 features in "
            "and 32 out)",
        },
        matmul_Bps=0.385 * GB,
        gather=Link(latency_s=100e-6, bandwidth_Bps=0.9 * GB),
        conv_tap_s=55e-9,
    ),
}
