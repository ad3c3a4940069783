"""The batch-size sweep as a picture: the best tensor-parallel and data-parallel baselines'
predicted time over the search's plan, against tokens per device, with the scaling book's
switch point (``C / W_ici``) marked. Drawn with matplotlib (the ``pictures`` extra)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from shardwise._extras import require
from shardwise._model.units import format_bytes, format_seconds

if TYPE_CHECKING:
    from rich.table import Table

    from shardwise._program.device_sweep import DeviceSweep
    from shardwise._program.sweep import Sweep


def save_sweep(data: Sweep, path: str | Path, title: str | None = None) -> Path:
    """Write the sweep's plot to ``path`` (PNG or SVG, by its suffix)."""
    figure = require("matplotlib.figure", "drawing the sweep").Figure(figsize=(7, 5.4))
    ax, below = figure.subplots(2, 1, sharex=True, height_ratios=(2, 1))
    x = [r.tokens_per_device for r in data.rows]
    for attr, marker, label in (
        ("tensor_parallel", "o-", "best of Megatron, data×tensor"),
        ("data_parallel", "s-", "best of data-parallel, FSDP"),
    ):
        points = [(t, getattr(r, attr)) for t, r in zip(x, data.rows, strict=True)]
        points = [(t, v) for t, v in points if v is not None]
        if points:
            ax.plot(*zip(*points, strict=True), marker, label=label)
    ax.axvline(
        data.threshold,
        color="grey",
        ls="--",
        label=f"C / W_ici ≈ {data.threshold:.0f} (scaling book)",
    )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_ylabel("predicted time / search's plan")
    below.plot(x, [r.mfu for r in data.rows], "d-", color="black", label="search's plan")
    below.set_ylim(0, 1)
    below.set_ylabel("predicted MFU")
    below.set_xlabel(f"tokens per device ({data.mesh.size} devices)")
    ax.set_title(
        title or f"{data.program} {_step(data)}, {data.profile} {data.mesh.describe()} (planned)",
        fontsize=9,
    )
    return _saved(figure, ax, path)


def _saved(figure: Any, ax: Any, path: str | Path) -> Path:
    """``figure`` with ``ax``'s legend, laid out and written to ``path``."""
    ax.legend(fontsize=8)
    figure.tight_layout()
    out = Path(path)
    figure.savefig(out, dpi=110)
    return out


def sweep_view(data: Sweep) -> Table:
    """The sweep as a table: per batch size, the search's plan and each family's best."""
    from rich.table import Table

    table = Table(
        title=f"{data.program} {_step(data)} on mesh {data.mesh.describe()}, "
        f"profile {data.profile}: "
        f"scaling book's switch at C / W_ici ≈ {data.threshold:.0f} tokens per device; "
        f"data-parallel plans lead from {_tokens(data.switch)}",
        title_justify="left",
    )
    for column in ("batch", "tokens/device", "search", "MFU", "its inputs",
                   "best data-parallel", "best tensor-parallel"):  # fmt: skip
        # the headers of numbers wrap at spaces; "tokens/device" has none, so keep it whole
        table.add_column(
            column,
            justify="left" if column == "its inputs" else "right",
            min_width=len(column) if "/" in column else None,
        )
    for r in data.rows:
        table.add_row(
            str(r.batch),
            _tokens(r.tokens_per_device),
            format_seconds(r.seconds),
            "-" if r.mfu is None else f"{r.mfu:.1%}",
            " · ".join(r.in_specs),
            _ratio(r.data_parallel, r.family == "data"),
            _ratio(r.tensor_parallel, r.family == "tensor"),
        )
    return table


def _step(data: Sweep) -> str:
    return "training step" if data.train else "forward pass"


def _tokens(n: float | None) -> str:
    return "never" if n is None else (f"{n:,.0f}" if n >= 1 else f"{n:.2g}")


def _ratio(value: float | None, best: bool) -> str:
    if value is None:
        return "n/a"
    text = f"{value:.2f}×"
    return f"[bold]{text}[/bold]" if best else text


def save_device_sweep(data: DeviceSweep, path: str | Path) -> Path:
    """Write the device sweep's plot to ``path`` (PNG or SVG): predicted MFU against the
    device count, each point labelled with its chosen mesh (and remat policy)."""
    figure = require("matplotlib.figure", "drawing the sweep").Figure(figsize=(7, 3.8))
    ax = figure.subplots()
    planned = [p for p in data.points if p.mfu is not None]
    for fits, marker, label in ((True, "o", "fits"), (False, "x", "over the device's memory")):
        shown = [p for p in planned if bool(p.fits) == fits]
        if shown:
            ax.plot([p.devices for p in shown], [p.mfu for p in shown], marker, label=label)
    ax.plot([p.devices for p in planned], [p.mfu for p in planned], "-", color="grey", lw=0.8)
    for p in planned:
        text = (p.mesh or "") + (f"\nremat={p.remat}" if p.remat else "")
        ax.annotate(text, (p.devices, p.mfu), textcoords="offset points", xytext=(0, 6),
                    ha="center", fontsize=6)  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_ylim(0, min(1.0, max((p.mfu or 0 for p in planned), default=1) * 1.3))
    ax.set_xlabel(f"devices ({data.profile})")
    ax.set_ylabel("predicted MFU")
    ax.set_title(f"{data.program}, batch {data.batch}: the mesh chosen at each device count "
                 "(planned)", fontsize=9)  # fmt: skip
    return _saved(figure, ax, path)


def device_sweep_view(data: DeviceSweep) -> Table:
    """The device sweep as a table: per device count, the chosen mesh, its
    remat policy, predicted step time, MFU and memory per device."""
    from rich.table import Table

    table = Table(
        title=f"{data.program}, batch {data.batch}, on {data.profile}: the mesh chosen over "
        f"{', '.join(data.roles)} at each device count",
        title_justify="left",
    )
    for column in ("devices", "mesh", "remat", "predicted step", "MFU", "memory/device", "fits"):
        table.add_column(column, justify="left" if column in ("mesh", "remat") else "right")
    for p in data.points:
        if p.skipped is not None:
            table.add_row(str(p.devices), f"not planned: {p.skipped}", "", "", "", "", "")
            continue
        assert p.seconds is not None and p.mfu is not None and p.memory_bytes is not None
        idle = p.devices - p.used if p.used is not None else 0
        mesh = (p.mesh or "-") + (f" ({idle:,} idle)" if idle else "")
        table.add_row(
            str(p.devices), mesh, p.remat or "-", format_seconds(p.seconds),
            f"{p.mfu:.1%}", format_bytes(p.memory_bytes), "yes" if p.fits else "[red]no[/]",
        )  # fmt: skip
    return table
