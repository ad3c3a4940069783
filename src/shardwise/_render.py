"""Terminal rendering of explanations (rich is imported lazily: ``import shardwise`` stays fast)."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shardwise._explain import Explanation


def _shape(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(n) for n in shape) + ")"


def explanation_panel(expl: Explanation) -> Any:
    """A rich renderable: arrays with their specs and shard shapes, then the collectives."""
    from rich.console import Group
    from rich.table import Table

    title = expl.equation or "function"
    arrays = Table(
        title=f"{title} on mesh {expl.mesh.describe()} ({expl.mode} mode)", title_justify="left"
    )
    for col in ("array", "shape", "dtype", "spec", "shard per device"):
        arrays.add_column(col)
    for k, info in enumerate(expl.operands):
        arrays.add_row(
            f"operand {k}",
            _shape(info.shape),
            info.dtype,
            info.spec.describe(),
            _shape(info.shard_shape),
        )
    for k, info in enumerate(expl.outputs):
        name = "output" if len(expl.outputs) == 1 else f"output {k}"
        arrays.add_row(
            name, _shape(info.shape), info.dtype, info.spec.describe(), _shape(info.shard_shape)
        )
    comms = Table(title="collectives (from the compiled HLO)", title_justify="left")
    for col in ("kind", "mesh axes", "bytes per device", "from"):
        comms.add_column(col)
    for c in expl.collectives:
        comms.add_row(c.kind, ",".join(c.mesh_axes) or "-", f"{c.bytes:,}", c.op_name or c.hlo_name)
    if not expl.collectives:
        comms.add_row("none", "-", "0", "every device computes its block alone")
    return Group(arrays, comms)


def to_text(expl: Explanation) -> str:
    """Plain text of :func:`explanation_panel`."""
    from rich.console import Console

    console = Console(width=110, record=True, file=io.StringIO(), color_system=None)
    console.print(explanation_panel(expl))
    return console.export_text()
