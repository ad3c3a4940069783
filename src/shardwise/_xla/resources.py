"""Memory and compute per device, read from a compiled executable."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Memory:
    """Bytes one device needs for the program (from ``compiled.memory_analysis()``).

    Attributes:
        argument_bytes: the inputs' shards.
        output_bytes: the outputs' shards.
        temp_bytes: scratch space XLA allocates while running.
        alias_bytes: output bytes that reuse argument buffers (counted once).
        capacity_bytes: the device's memory, where the platform reports it (not on CPU).
    """

    argument_bytes: int
    output_bytes: int
    temp_bytes: int
    alias_bytes: int
    capacity_bytes: int | None

    @property
    def total_bytes(self) -> int:
        """Peak bytes held by the program on one device."""
        return self.argument_bytes + self.output_bytes + self.temp_bytes - self.alias_bytes

    @property
    def fraction(self) -> float | None:
        """Share of the device's memory used, where the capacity is known."""
        return self.total_bytes / self.capacity_bytes if self.capacity_bytes else None

    def to_json(self) -> dict[str, Any]:
        return {
            "argument_bytes": self.argument_bytes,
            "output_bytes": self.output_bytes,
            "temp_bytes": self.temp_bytes,
            "alias_bytes": self.alias_bytes,
            "total_bytes": self.total_bytes,
            "capacity_bytes": self.capacity_bytes,
            "fraction": self.fraction,
        }


@dataclass(frozen=True, slots=True)
class Compute:
    """Work one device does (from ``compiled.cost_analysis()``; communication not included).

    Attributes:
        flops: floating-point operations.
        bytes_accessed: bytes read and written to memory.
        transcendentals: exp, tanh and the like.
        counted_by: ``"xla"`` (its cost analysis), or ``"einsum"`` where the local step is a
            native kernel that XLA cannot count and the einsum's own count is used.
    """

    flops: float
    bytes_accessed: float
    transcendentals: float
    counted_by: str = "xla"

    @property
    def intensity(self) -> float | None:
        """FLOPs per byte accessed: low means memory-bound."""
        return self.flops / self.bytes_accessed if self.bytes_accessed else None

    def to_json(self) -> dict[str, Any]:
        return {
            "flops": self.flops,
            "bytes_accessed": self.bytes_accessed,
            "transcendentals": self.transcendentals,
            "flops_per_byte": self.intensity,
            "counted_by": self.counted_by,
        }


def device_capacity(device: Any) -> int | None:
    """The device's memory in bytes, where the platform reports it (GPUs, TPUs)."""
    try:
        stats = device.memory_stats()
    except Exception:  # some platforms raise instead of returning None
        return None
    limit = stats.get("bytes_limit") if stats else None
    return int(limit) if limit else None


def memory_of(compiled: Any, device: Any) -> Memory | None:
    """Memory per device of a compiled program, or ``None`` where XLA gives no analysis."""
    try:
        stats = compiled.memory_analysis()
    except Exception:
        return None
    if stats is None:
        return None
    return Memory(
        argument_bytes=int(stats.argument_size_in_bytes),
        output_bytes=int(stats.output_size_in_bytes),
        temp_bytes=int(stats.temp_size_in_bytes),
        alias_bytes=int(stats.alias_size_in_bytes),
        capacity_bytes=device_capacity(device),
    )


def compute_of(compiled: Any) -> Compute | None:
    """FLOPs and bytes per device of a compiled program, or ``None`` where XLA gives none."""
    try:
        cost = compiled.cost_analysis()
    except Exception:
        return None
    if isinstance(cost, list | tuple):
        cost = cost[0] if cost else None
    if not cost:
        return None
    return Compute(
        flops=float(cost.get("flops", 0.0)),
        bytes_accessed=float(cost.get("bytes accessed", 0.0)),
        transcendentals=float(cost.get("transcendentals", 0.0)),
    )
