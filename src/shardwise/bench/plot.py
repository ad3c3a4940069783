"""The benchmark's picture: each peer's time as a ratio to shardwise's, and W1's time
against N on log-log axes with the memory-bandwidth roofline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shardwise.render.figure import _import_matplotlib

COLOURS = {"numpy": "#4c72b0", "torch": "#dd8452", "dask": "#55a868", "jax": "#8172b3"}


def plot_bench(doc: dict[str, Any], path: str | Path) -> Path:
    """Draw ``doc`` (from :func:`run_bench`) to a PNG or SVG file."""
    Figure = _import_matplotlib()
    curve = doc.get("w1_curve")
    fig = Figure(figsize=(13 if curve else 7.5, 5), dpi=130)
    ax = fig.add_subplot(1, 2 if curve else 1, 1)
    workloads = doc["workloads"]
    peers = [p for p in COLOURS if any(p in w["ratios"] for w in workloads)]
    width = 0.8 / max(len(peers), 1)
    for k, peer in enumerate(peers):
        xs = [i + (k - (len(peers) - 1) / 2) * width for i in range(len(workloads))]
        ys = [w["ratios"].get(peer, 0) for w in workloads]
        bars = ax.bar(xs, ys, width=width * 0.95, color=COLOURS[peer], label=peer)
        ax.bar_label(bars, labels=[f"{y:.1f}×" if y else "" for y in ys], fontsize=7, padding=1)
    ax.axhline(1.0, color="black", linewidth=1)
    ax.set_xticks(
        range(len(workloads)),
        [
            f"{w['name']}\n{w['roofline_fraction']:.0%} of roofline"
            + ("\n(its probe was slowed)" if w["roofline_fraction"] > 1 else "")
            for w in workloads
        ],  # (over 100%: the run's bandwidth probe was slowed, as the
        # table's caption says: that roofline is a floor there, not a ceiling)
    )
    ax.set_ylabel("peer time ÷ shardwise time (higher: shardwise faster)")
    ax.set_title("shardwise against its peers (medians, one run)", fontsize=11)
    ax.legend(fontsize=8)
    if curve:
        bx = fig.add_subplot(1, 2, 2)
        ns = [p["n"] for p in curve]
        bx.loglog(
            ns, [p["shardwise_seconds"] for p in curve], "o-", label="shardwise", color="#c44e52"
        )
        bx.loglog(
            ns,
            [p["numpy_seconds"] for p in curve],
            "s--",
            label="numpy einsum",
            color=COLOURS["numpy"],
        )
        bw = doc["machine"]["memory_gbps"] * 1e9
        bx.loglog(
            ns,
            [p["bytes"] / bw for p in curve],
            ":",
            color="black",
            label=f"roofline ({doc['machine']['memory_gbps']:.0f} GB/s)",
        )
        bx.set_xlabel("N (vectors of 3 float32)")
        bx.set_ylabel("seconds")
        bx.set_title("W1: time against work", fontsize=11)
        bx.legend(fontsize=8)
        bx.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path
