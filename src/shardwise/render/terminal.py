"""Terminal views of explanations (rich is imported lazily: ``import shardwise`` stays fast).

- a summary: each array's shape, spec, placements (``S(0)``, ``R``, ``P(y)``) and shard;
- every collective with its cause and where it came from; memory and compute per device;
- the **mesh view**: each array drawn on the device mesh, each device with the index ranges
  it holds;
- the **block view**: each array cut into its blocks, each block labelled with the devices
  that hold it; arrays of rank 3 and more as a grid of 2-D slices.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

from shardwise._model.spec import blocks
from shardwise._model.units import format_bytes, format_shape

if TYPE_CHECKING:
    from shardwise._model.plan import ArrayInfo
    from shardwise._xla.explain import Explanation

COLOURS = ("cyan", "magenta", "yellow", "blue", "red", "green")
"""One colour per operand, the output last; the same order as the figures."""
MAX_ROW = 8
"""Devices per row in the mesh view of a 1-D mesh."""


def arrays_of(expl: Explanation) -> list[tuple[str, ArrayInfo, tuple[str, ...], str, str]]:
    """(name, info, partial axes, index letters, colour) for each array, in data-flow order."""
    letters: list[str] = []
    out_letters = ""
    if expl.equation:
        lhs, _, out_letters = expl.equation.partition("->")
        letters = lhs.split(",")
    rows: list[tuple[str, ArrayInfo, tuple[str, ...], str, str]] = []
    for k, info in enumerate(expl.operands):
        term = letters[k] if k < len(letters) else ""
        label = info.name or f"operand {k}"
        rows.append((label, info, (), term, COLOURS[k % (len(COLOURS) - 1)]))
    if expl.local is not None:
        rows.append(("local result", expl.local, expl.partial_axes, out_letters, "white"))
    for k, info in enumerate(expl.outputs):
        name = info.name or ("output" if len(expl.outputs) == 1 else f"output {k}")
        rows.append((name, info, (), out_letters, COLOURS[-1]))
    return rows


def summary(expl: Explanation) -> Any:
    """Arrays, collectives with causes, memory and compute."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    title = expl.equation or "function"
    arrays = Table(
        title=f"{title} on mesh {expl.mesh.describe()} ({expl.mode} mode, "
        f"{expl.mesh.axis_type} axes)",
        title_justify="left",
    )
    for col in ("array", "shape", "dtype", "spec", "placements", "shard per device"):
        arrays.add_column(col)
    for name, info, partial, _, colour in arrays_of(expl):
        arrays.add_row(
            f"[{colour}]{name}[/]",
            format_shape(info.shape),
            info.dtype,
            info.spec.describe(),
            expl.placements(info, partial),
            format_shape(info.shard_shape),
        )
    comms = Table(title="collectives (from the compiled HLO) and why", title_justify="left")
    for col in ("kind", "mesh axes", "bytes per device", "cause"):
        comms.add_column(col, overflow="fold")
    for k, c in enumerate(expl.collectives):
        cause = expl.causes[k].text if k < len(expl.causes) else ""
        comms.add_row(c.kind, ",".join(c.mesh_axes) or "-", f"{c.bytes:,}", cause)
    if not expl.collectives:
        comms.add_row("none", "-", "0", "every device computes its block alone")
    parts: list[Any] = [arrays, comms]
    if expl.auto:
        parts.insert(0, Text(f"auto layout (the planner's best): {expl.auto}", style="bold"))
    for problem in expl.problems:
        parts.insert(0, Text(f"WRONG RESULT: {problem}", style="bold red"))
    lines = []
    if expl.memory is not None:
        m = expl.memory
        cap = (
            f" of {format_bytes(m.capacity_bytes)} ({m.fraction:.1%})"
            if m.capacity_bytes and m.fraction is not None
            else " (the platform reports no capacity)"
        )
        lines.append(
            f"memory per device: {format_bytes(m.total_bytes)}{cap} = arguments "
            f"{format_bytes(m.argument_bytes)} + output {format_bytes(m.output_bytes)} + "
            f"temporaries {format_bytes(m.temp_bytes)}"
            + (f" − aliased {format_bytes(m.alias_bytes)}" if m.alias_bytes else "")
        )
    if expl.compute is not None:
        work = expl.compute
        ratio = f", {work.intensity:.2f} FLOP/byte" if work.intensity is not None else ""
        lines.append(
            f"compute per device: {work.flops:,.0f} FLOPs, {format_bytes(work.bytes_accessed)} "
            f"accessed{ratio}"
            + (
                " (counted from the einsum: the local step is shardwise's native kernel, "
                "which XLA does not count)"
                if work.counted_by == "einsum"
                else ""
            )
        )
    if lines:
        parts.append(Text("\n".join(lines)))
    return Group(*parts)


def _ranges(ranges: tuple[tuple[int, int], ...], shape: tuple[int, ...], letters: str) -> str:
    parts = []
    for d, ((a, b), n) in enumerate(zip(ranges, shape, strict=True)):
        name = letters[d] if d < len(letters) else f"d{d}"
        parts.append(f"{name} all" if (a, b) == (0, n) else f"{name} {a}:{b}")
    return "\n".join(parts) if parts else "scalar"


def mesh_view(
    expl: Explanation,
    name: str,
    info: ArrayInfo,
    partial: tuple[str, ...],
    letters: str,
    colour: str,
) -> Any:
    """One array drawn on the device mesh: each device with the index ranges it holds."""
    from rich.table import Table

    per_device = blocks(info.spec, info.shape, expl.mesh)
    sizes = [s for _, s in expl.mesh.axes]
    cols = sizes[-1] if len(sizes) > 1 else min(sizes[0], MAX_ROW)
    if len(sizes) > 2:
        cols = expl.mesh.size // sizes[0]
    ids = expl.device_ids or tuple(range(expl.mesh.size))
    names = expl.mesh.names
    layout_note = (
        f"rows {names[0]}, columns {'×'.join(names[1:])}" if len(names) > 1 else f"axis {names[0]}"
    )
    grid = Table(
        title=f"[{colour}]{name}[/] {format_shape(info.shape)} {expl.placements(info, partial)}"
        + f"\n[dim]on the mesh: {layout_note}[/]",
        title_justify="left",
        show_header=False,
        show_lines=True,
        border_style=colour,
    )
    for _ in range(cols):
        grid.add_column(justify="left")
    for start in range(0, expl.mesh.size, cols):
        row = []
        for pos in range(start, min(start + cols, expl.mesh.size)):
            row.append(
                f"[bold]dev {ids[pos]}[/]\n{_ranges(per_device[pos], info.shape, letters)}"
                + ("\n[italic]partial[/]" if partial else "")
            )
        grid.add_row(*row)
    return grid


def block_view(expl: Explanation, info: ArrayInfo, letters: str, colour: str) -> Any:
    """The array cut into blocks, each labelled with the devices holding it; rank ≥ 3 arrays
    as a row of 2-D slices over their last two dimensions."""
    from rich.table import Table

    per_device = blocks(info.spec, info.shape, expl.mesh)
    ids = expl.device_ids or tuple(range(expl.mesh.size))
    owners: dict[tuple[tuple[int, int], ...], list[int]] = {}
    for pos, ranges in enumerate(per_device):
        owners.setdefault(ranges, []).append(ids[pos])
    rank = len(info.shape)
    lead = max(rank - 2, 0)

    def distinct(dim: int) -> list[tuple[int, int]]:
        return sorted({r[dim] for r in owners})

    def label(devs: list[int]) -> str:
        return "all" if len(devs) == expl.mesh.size else ",".join(map(str, devs))

    def name(d: int) -> str:
        return letters[d] if d < len(letters) else f"d{d}"

    lead_keys: list[tuple[tuple[int, int], ...]] = [()]
    for d in range(lead):
        lead_keys = [(*k, r) for k in lead_keys for r in distinct(d)]
    row_dim = rank - 2 if rank >= 2 else None
    col_dim = rank - 1 if rank >= 1 else None
    rows = distinct(row_dim) if row_dim is not None else [(0, 1)]
    cols = distinct(col_dim) if col_dim is not None else [(0, 1)]
    slices = Table.grid(padding=(0, 1))
    for _ in lead_keys:
        slices.add_column()
    panels = []
    for key in lead_keys:
        table = Table(
            title=", ".join(f"{name(d)} {a}:{b}" for d, (a, b) in enumerate(key)) or None,
            show_header=False,
            show_lines=True,
            border_style=colour,
        )
        for _ in cols:
            table.add_column(justify="center")
        for r in rows:
            cells = []
            for c in cols:
                want = (
                    key
                    + ((r,) if row_dim is not None else ())
                    + ((c,) if col_dim is not None else ())
                )
                cells.append(label(owners.get(want, [])))
            table.add_row(*cells)
        panels.append(table)
    slices.add_row(*panels)
    dims = "×".join(name(d) for d in range(lead, rank)) or "scalar"
    outer = Table.grid()
    outer.add_column()
    outer.add_row(f"[dim]blocks of {dims}{' per slice' if lead else ''} → devices[/]")
    outer.add_row(slices)
    return outer


def explanation_view(expl: Explanation, quiet: bool = False) -> Any:
    """The whole terminal view: summary, then (unless ``quiet``) mesh and block views."""
    from rich.console import Group
    from rich.text import Text

    parts: list[Any] = [summary(expl)]
    if not quiet:
        parts.append(
            Text(
                "\nwhat each device holds (mesh view) and who holds each block (block view):",
                style="bold",
            )
        )
        from rich.table import Table

        for name, info, partial, letters, colour in arrays_of(expl):
            pair = Table.grid(padding=(0, 3))
            pair.add_column()
            pair.add_column()
            pair.add_row(
                mesh_view(expl, name, info, partial, letters, colour),
                block_view(expl, info, letters, colour),
            )
            parts.append(pair)
    return Group(*parts)


def to_text(expl: Explanation, quiet: bool = False, width: int = 110) -> str:
    """Plain text of :func:`explanation_view`."""
    return plain_text(explanation_view(expl, quiet), width)


def plain_text(view: Any, width: int = 120) -> str:
    """Plain text of any rich renderable, without colour."""
    from rich.console import Console

    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(view)
    return console.export_text()
