"""What a streamed run did, and how much memory the process used."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardwise._data.budget import StreamPlan


@dataclass(frozen=True, slots=True)
class StreamResult:
    """What a streamed run did."""

    out: Path
    chunks: int
    computed: int
    skipped: int
    seconds: float
    bytes_read: int
    plan: StreamPlan

    @property
    def throughput(self) -> float:
        """Bytes of input read per second in this run."""
        return self.bytes_read / self.seconds if self.seconds else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "out": str(self.out),
            "chunks": self.chunks,
            "computed": self.computed,
            "skipped": self.skipped,
            "seconds": self.seconds,
            "bytes_read": self.bytes_read,
            "throughput_Bps": self.throughput,
            "index": self.plan.index,
            "chunk": self.plan.chunk,
            "accumulate": self.plan.accumulate,
            "predicted_peak_bytes": self.plan.peak_bytes,
        }


def peak_rss() -> int | None:
    """This process's peak resident memory in bytes (Linux ``VmHWM``: the address space made
    by exec, unlike ``ru_maxrss``, which keeps the peak of a forked parent's copy)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
