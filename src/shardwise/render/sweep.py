"""The batch-size sweep as a picture: the best tensor-parallel and data-parallel baselines'
predicted time over the search's plan, against tokens per device, with the scaling book's
switch point (``C / W_ici``) marked. Drawn with matplotlib (the ``pictures`` extra)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from shardwise._extras import require
from shardwise._model.units import format_seconds

if TYPE_CHECKING:
    from rich.table import Table

    from shardwise._program.sweep import Sweep


def save_sweep(data: Sweep, path: str | Path, title: str | None = None) -> Path:
    """Write the sweep's plot to ``path`` (PNG or SVG, by its suffix)."""
    figure = require("matplotlib.figure", "drawing the sweep").Figure(figsize=(7, 3.6))
    ax = figure.subplots()
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
    ax.set_xlabel(f"tokens per device ({data.mesh.size} devices)")
    ax.set_ylabel("predicted time / search's plan")
    ax.set_title(
        title or f"{data.program} {_step(data)}, {data.profile} {data.mesh.describe()} (planned)",
        fontsize=9,
    )
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
    for column in ("batch", "tokens/device", "search", "its inputs", "best data-parallel",
                   "best tensor-parallel"):  # fmt: skip
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
