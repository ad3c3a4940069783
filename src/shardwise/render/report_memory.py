"""The HTML report's picture of the memory held per device over a program: a polyline of
bytes at each program point, its peak marked."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from shardwise.render.report_css import PREDICTED


def mib(n: float) -> str:
    return f"{n / 2**20:.3g} MiB"


def memory_svg(points: Sequence[float], peak: float, at: int) -> str:
    """Bytes per device over the program points as a polyline, the peak marked in MiB."""
    width, height, left, top, bottom = 640, 190, 70, 20, 28
    top_value = max([peak, *points, 1]) * 1.1
    span, plot = max(len(points) - 1, 1), height - top - bottom

    def xy(k: int, v: float) -> tuple[float, float]:
        return left + (width - left - 10) * k / span, top + plot * (1 - v / top_value)

    line = " ".join(f"{x:.1f},{y:.1f}" for x, y in (xy(k, v) for k, v in enumerate(points)))
    parts = [f'<line x1="{left}" y1="{top}" x2="{left}" y2="{height - bottom}" stroke="#999"/>']
    for v in (0.0, peak / 2, peak):
        _, y = xy(0, v)
        parts.append(
            f'<text x="{left - 6}" y="{y + 4:.1f}" font-size="10" text-anchor="end" '
            f'fill="#555">{mib(v)}</text><line x1="{left}" y1="{y:.1f}" x2="{width - 10}" '
            f'y2="{y:.1f}" stroke="#eceef2"/>'
        )
    px, py = xy(at, peak)
    anchor = "end" if px > width * 0.7 else "start"
    parts += [
        f'<polyline points="{line}" fill="none" stroke="{PREDICTED}" stroke-width="2"/>',
        f'<circle cx="{px:.1f}" cy="{py:.1f}" r="4.5" fill="#d0021b"/>',
        f'<text class="peak" x="{px + (-8 if anchor == "end" else 8):.1f}" y="{py - 6:.1f}" '
        f'font-size="11" font-weight="600" text-anchor="{anchor}">peak {mib(peak)} '
        f"at point {at}</text>",
        f'<text x="{(left + width) / 2}" y="{height - 6}" font-size="10" text-anchor="middle" '
        f'fill="#555">program point (0 … {len(points) - 1})</text>',
    ]
    return f'<svg class="memory" width="{width}" height="{height}">{"".join(parts)}</svg>'


def held_rows(memory: Mapping[str, Any]) -> list[tuple[str, int]]:
    """What is held at the peak (a memory curve's JSON): the arrays, then the bytes of the
    copies, partial sums and buffers that make up the rest of the peak."""
    rows = [(str(a["name"]), int(a["bytes"])) for a in memory.get("alive", [])]
    if memory.get("others"):
        rows.append(("copies for moves, partial sums, buffers", int(memory["others"])))
    return rows
