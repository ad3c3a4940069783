"""The data-flow picture, in the spirit of the tutorial's Figure D.9.

Left to right: the full inputs with their block boundaries; the device mesh,
each device holding its shard of every operand and its local result (hatched
where it is a partial sum); each collective as a numbered, labelled arrow; and
the output's layout. A legend lists each collective's bytes and cause.

Drawn with matplotlib (the ``pictures`` extra), which writes both SVG and PNG
with its own fonts, so nothing beyond ``pip`` is needed. Every shard rectangle
carries an SVG id ``shard-<array>-dev<id>`` so tools (and tests) can find it.
"""

from __future__ import annotations

import io
import math
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shardwise._errors import ShardwiseError
from shardwise._extras import require
from shardwise._model.spec import blocks
from shardwise._model.units import format_shape

if TYPE_CHECKING:
    from shardwise._model.plan import ArrayInfo
    from shardwise._xla.explain import Explanation

WIDTH = 16.0
"""Figure width, inches (all coordinates below are inches)."""
DPI = 150
"""PNG resolution, dots per inch."""
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2")
"""Operand colours, in operand order (the terminal view uses the same order)."""
OUTPUT_COLOUR = "#d62728"
LOCAL_COLOUR = "#7f7f7f"
MAX_ROW = 8
"""Devices per row for a 1-D mesh."""
CIRCLED = "①②③④⑤⑥⑦⑧⑨⑩⑪⑫⑬⑭⑮⑯⑰⑱⑲⑳"


def _import_matplotlib() -> Any:
    return require("matplotlib.figure", "drawing pictures").Figure


def _grid(expl: Explanation) -> tuple[int, int]:
    """Rows and columns of the device grid."""
    sizes = [s for _, s in expl.mesh.axes]
    if len(sizes) == 1:
        cols = min(sizes[0], MAX_ROW)
        return math.ceil(sizes[0] / cols), cols
    return sizes[0], expl.mesh.size // sizes[0]


def _fit(shape: tuple[int, ...], w: float, h: float) -> tuple[float, float]:
    """Width and height of a box for a 2-D view of ``shape`` that fits in w × h (aspect clamped)."""
    rows = shape[-2] if len(shape) >= 2 else 1
    cols = shape[-1] if len(shape) >= 1 else 1
    ratio = min(max(cols / max(rows, 1), 1 / 3), 3.0)
    if len(shape) == 1:
        ratio = 4.0
    bw, bh = (w, w / ratio) if w / ratio <= h else (h * ratio, h)
    return bw, bh


def _layers(info: ArrayInfo) -> int:
    return min(3, math.prod(info.shape[:-2])) if len(info.shape) > 2 else 1


def _array(
    ax: Any,
    expl: Explanation,
    info: ArrayInfo,
    x: float,
    y: float,
    w: float,
    h: float,
    colour: str,
    gid: str,
    hatch: str | None = None,
) -> tuple[float, float, float, float]:
    """Draw an array (rank ≥ 3 as a stack) with its block boundaries; returns its box."""
    from matplotlib.patches import Rectangle

    bw, bh = _fit(info.shape, w * 0.85, h * 0.85)
    layers = _layers(info)
    off = 0.08
    x0, y0 = x + (w - bw) / 2, y + (h - bh) / 2
    for k in reversed(range(layers)):
        rect = Rectangle(
            (x0 + k * off, y0 + k * off),
            bw,
            bh,
            facecolor=colour,
            alpha=0.18 + 0.1 * (k == 0),
            edgecolor=colour,
            linewidth=1.2,
            hatch=hatch,
        )
        rect.set_gid(f"{gid}-layer{k}" if k else gid)
        ax.add_patch(rect)
    rank = len(info.shape)
    if rank >= 1:
        per_device = blocks(info.spec, info.shape, expl.mesh)
        cols = sorted({r[rank - 1] for r in per_device})
        for a, _ in cols[1:]:
            fx = x0 + bw * a / info.shape[-1]
            ax.plot([fx, fx], [y0, y0 + bh], color=colour, linewidth=0.8, linestyle="--")
        if rank >= 2:
            rows = sorted({r[rank - 2] for r in per_device})
            for a, _ in rows[1:]:
                fy = y0 + bh - bh * a / info.shape[-2]
                ax.plot([x0, x0 + bw], [fy, fy], color=colour, linewidth=0.8, linestyle="--")
    return x0, y0, bw, bh


def _array_column(
    ax: Any,
    expl: Explanation,
    arrays: list[Any],
    colours: list[str],
    top: float,
    body: float,
    x: float,
    width: float,
    gid: str,
) -> None:
    """Whole arrays stacked in one column, each labelled with its layout (and drawn in its
    colour, ``colours`` in the same order)."""
    slot = body / max(len(arrays), 1)
    for k, ((name, info, _, letters, _), colour) in enumerate(zip(arrays, colours, strict=True)):
        y = top - (k + 1) * slot
        _, by, _, _ = _array(ax, expl, info, x, y + 0.5, width, slot - 0.7, colour, f"{gid}-{k}")
        ax.text(
            x + width / 2,
            by - 0.1,
            f"{_short(name, 37 - len(letters) - len(format_shape(info.shape)))} {letters}  "
            f"{format_shape(info.shape)}\n{info.spec.describe()}"
            f"  {expl.placements(info)}",
            fontsize=8,
            ha="center",
            va="top",
        )


def figure_size(expl: Explanation) -> tuple[float, float]:
    """Width and height in inches (the PNG is this times :data:`DPI`)."""
    rows, _ = _grid(expl)
    body = max(rows * 1.9, len(expl.operands) * 2.0, 2.6)
    legend = 0.32 * (max(len(expl.collectives), 1) * 2 + 1)
    return WIDTH, round(1.3 + body + legend, 2)


def _colours(named: list[Any], outputs: int) -> list[str]:
    """Each named array's colour, by position (an argument may bear an output's name):
    operands from :data:`PALETTE`, the ``outputs`` last arrays, the local result."""
    return [
        OUTPUT_COLOUR
        if k >= len(named) - outputs
        else LOCAL_COLOUR
        if name == "local result"
        else PALETTE[k % len(PALETTE)]
        for k, (name, *_rest) in enumerate(named)
    ]


def _short(name: str, room: int) -> str:
    """``name`` within ``room`` characters: its end kept, where a pytree path names the leaf
    (``…['kernel']``), so that long names do not run over the next device's."""
    return name if len(name) <= max(room, 4) else "…" + name[len(name) - max(room, 4) + 1 :]


def _canvas(expl: Explanation, figure: Any) -> tuple[Any, Any, float, float, float]:
    """The figure and its axes, with the title and the column headings drawn.

    Returns the figure, the axes, the top of the panels, their height and the legend's height.
    """
    width, height = figure_size(expl)
    fig = figure(figsize=(width, height), dpi=DPI)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, width)
    ax.set_ylim(0, height)
    ax.axis("off")
    legend_h = 0.32 * (max(len(expl.collectives), 1) * 2 + 1)
    top = height - 1.0
    body = top - legend_h - 0.2
    title = f"{expl.equation or 'function'}  on mesh {expl.mesh.describe()}  ({expl.mode} mode)"
    ax.text(0.3, height - 0.45, title, fontsize=15, weight="bold", va="center")
    for label, cx in (("inputs", 1.9), ("on each device", 7.75), ("output", 14.3)):
        ax.text(cx, top + 0.05, label, fontsize=11, ha="center", color="#444444", style="italic")
    names = expl.mesh.names
    grid_note = (
        f"rows: {names[0]} · columns: {'×'.join(names[1:])}"
        if len(names) > 1
        else f"axis {names[0]}" + (f", {MAX_ROW} per row" if expl.mesh.size > MAX_ROW else "")
    )
    ax.text(7.75, top + 0.38, grid_note, fontsize=8.5, ha="center", color="#666666")
    return fig, ax, top, body, legend_h


def _device(
    ax: Any,
    box: tuple[float, float, float, float],
    device: int,
    in_device: list[Any],
    colours: list[str],
    small: float,
) -> None:
    """One device's box at ``box`` (x, y, width, height) with its shard of each array."""
    from matplotlib.patches import FancyBboxPatch, Rectangle

    x, y, cw, ch = box
    ax.add_patch(
        FancyBboxPatch(
            (x + 0.05, y + 0.05),
            cw - 0.1,
            ch - 0.1,
            boxstyle="round,pad=0,rounding_size=0.08",
            facecolor="#f7f7f7",
            edgecolor="#999999",
            linewidth=0.8,
        )
    )
    ax.text(
        x + 0.14, y + ch - 0.2, f"dev {device}", fontsize=small + 0.5, weight="bold", va="center"
    )
    n_slots = max(len(in_device), 1)
    vertical = cw < 0.8 * ch  # tall, narrow boxes stack the shards top to bottom
    for j, ((name, info, partial, _, _), colour) in enumerate(zip(in_device, colours, strict=True)):
        shard_shape = info.shard_shape
        if vertical:
            slot_w, slot_h = cw - 0.2, (ch - 0.45) / n_slots
            sx, sy = x + 0.1, y + ch - 0.4 - (j + 1) * slot_h
        else:
            slot_w, slot_h = (cw - 0.2) / n_slots, ch - 0.45
            sx, sy = x + 0.1 + j * slot_w, y + 0.05
        room = max(slot_h - (0.75 if partial else 0.6), 0.1)
        bw, bh = _fit(shard_shape, slot_w * 0.75, room * 0.85)
        rx, ry = sx + (slot_w - bw) / 2, sy + (0.45 if partial else 0.3) + (room - bh) / 2
        rect = Rectangle(
            (rx, ry),
            bw,
            bh,
            facecolor=colour,
            alpha=0.35,
            edgecolor=colour,
            linewidth=1.0,
            hatch="////" if partial else None,
        )
        tag = "local" if name == "local result" else name.replace("operand ", "op")
        rect.set_gid(f"shard-{tag}-dev{device}")
        ax.add_patch(rect)
        dims = "×".join(map(str, shard_shape)) or "scalar"
        note = f"\nP({','.join(partial)})" if partial else ""
        size = min(small - 1, 0.85 * slot_w * 72 / (0.68 * max(len(dims), 4)))
        ax.text(
            sx + slot_w / 2,
            ry + bh + 0.1,
            _short(tag, int(slot_w * 72 / (0.62 * size))),
            fontsize=size,
            ha="center",
            va="bottom",
            color=colour,
            weight="bold",
        )
        ax.text(sx + slot_w / 2, ry - 0.06, dims + note, fontsize=size, ha="center", va="top")


def _device_grid(
    ax: Any,
    expl: Explanation,
    named: list[Any],
    colours: list[str],
    top: float,
    body: float,
) -> None:
    """The device mesh in the middle panel, each device with its shards."""
    rows, cols = _grid(expl)
    gx0, gx1 = 4.2, 11.3
    cw, ch = (gx1 - gx0) / cols, body / rows
    ids = expl.device_ids or tuple(range(expl.mesh.size))
    in_device = named[: len(named) - len(expl.outputs)]
    small = 8 if cols <= 4 else 6.5
    for pos in range(expl.mesh.size):
        r, c = divmod(pos, cols)
        box = (gx0 + c * cw, top - (r + 1) * ch, cw, ch)
        _device(ax, box, ids[pos], in_device, colours[: len(in_device)], small)


def _arrows(ax: Any, expl: Explanation, top: float, body: float) -> None:
    """Arrows from the inputs to the devices, and one per collective (numbered and labelled)
    from the devices to the output."""
    from matplotlib.patches import FancyArrowPatch

    mid = top - body / 2
    ax.add_patch(
        FancyArrowPatch(
            (3.6, mid), (4.15, mid), arrowstyle="-|>", mutation_scale=14, color="#555555"
        )
    )
    comms = expl.collectives
    if not comms:
        ax.add_patch(
            FancyArrowPatch(
                (11.35, mid), (12.85, mid), arrowstyle="-|>", mutation_scale=14, color="#555555"
            )
        )
        ax.text(12.1, mid + 0.18, "no collective", fontsize=7.5, ha="center")
    for k, coll in enumerate(comms):
        yk = mid + (len(comms) - 1) * 0.3 - k * 0.6
        arrow = FancyArrowPatch(
            (11.35, yk),
            (12.85, yk),
            arrowstyle="-|>",
            mutation_scale=14,
            color=OUTPUT_COLOUR,
            linewidth=1.6,
        )
        arrow.set_gid(f"collective-{k}")
        ax.add_patch(arrow)
        ax.text(
            12.1, yk + 0.16, f"{CIRCLED[k % len(CIRCLED)]} {coll.kind}", fontsize=7.5, ha="center"
        )
        ax.text(
            12.1,
            yk - 0.16,
            f"over {','.join(coll.mesh_axes) or '-'} · {coll.bytes:,} B",
            fontsize=7,
            ha="center",
            color="#444444",
        )


def _legend(ax: Any, expl: Explanation, width: float, legend_h: float) -> None:
    """The legend under a rule: each collective's bytes and cause."""
    ly = legend_h + 0.05
    ax.plot([0.3, width - 0.3], [ly, ly], color="#cccccc", linewidth=0.8)
    lines = []
    for k, coll in enumerate(expl.collectives):
        cause = expl.causes[k].text.replace("`", "") if k < len(expl.causes) else coll.kind
        lines.append(
            f"{CIRCLED[k % len(CIRCLED)]} {coll.kind} over {','.join(coll.mesh_axes)}, "
            f"{coll.bytes:,} bytes per device — {cause}"
        )
    if not lines:
        lines.append("No collectives: every device computes its block of the output alone.")
    text = "\n".join(textwrap.fill(line, 170) for line in lines)
    ax.text(0.3, ly - 0.15, text, fontsize=8.5, va="top")


def draw(expl: Explanation) -> Any:
    """The matplotlib ``Figure`` of the data flow."""
    figure = _import_matplotlib()  # first: a missing matplotlib is a MissingExtraError

    from shardwise.render.terminal import arrays_of

    fig, ax, top, body, legend_h = _canvas(expl, figure)
    named = arrays_of(expl)
    colours = _colours(named, len(expl.outputs))
    ins, outs = len(expl.operands), len(named) - len(expl.outputs)
    _array_column(ax, expl, named[:ins], colours[:ins], top, body, x=0.3, width=3.2, gid="full")
    _device_grid(ax, expl, named, colours, top, body)
    _array_column(ax, expl, named[outs:], colours[outs:], top, body, x=12.9, width=2.8, gid="out")
    _arrows(ax, expl, top, body)
    _legend(ax, expl, figure_size(expl)[0], legend_h)
    return fig


def to_svg(expl: Explanation) -> str:
    """The picture as SVG text."""
    buf = io.StringIO()
    draw(expl).savefig(buf, format="svg", metadata={"Date": None})
    return buf.getvalue()


def save(expl: Explanation, path: str | Path) -> Path:
    """Write the picture; the format follows the suffix (``.svg`` or ``.png``)."""
    path = Path(path)
    fmt = path.suffix.lower().lstrip(".")
    if fmt not in ("svg", "png"):
        raise ShardwiseError(f"cannot draw {str(path)!r}: the file must end in .svg or .png.")
    if not path.parent.is_dir():  # (as --html says it: a mistyped folder is not made)
        raise ShardwiseError(
            f"cannot write {str(path)!r}: its folder {str(path.parent)!r} does not exist; give "
            "a path in a folder that exists and that you can write to."
        )
    fig = draw(expl)
    try:
        if fmt == "svg":
            fig.savefig(path, format="svg", metadata={"Date": None})
        else:
            fig.savefig(path, format="png", dpi=DPI)
    except OSError as e:
        raise ShardwiseError(f"cannot write {str(path)!r}: {e.strerror or e}.") from None
    return path
