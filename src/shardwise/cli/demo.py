"""``shardwise demo``: the tutorial's four scenarios, checked against NumPy."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from shardwise._model.units import format_shape
from shardwise.cli._common import (
    EXIT_WRONG,
    REPEAT,
    Devices,
    Formats,
    Json,
    console,
    friendly_errors,
    print_json,
    setup_devices,
    table_format,
)


def _spec(s: Any) -> str:
    """Compact spec text: ``P(x,y)``, ``P(-,devices)``, or ``R`` for replicated."""
    if not s or all(e is None for e in s):
        return "R"
    while s and s[-1] is None:
        s = s[:-1]
    return (
        "P("
        + ",".join(
            "-" if e is None else e if isinstance(e, str) else "(" + ",".join(e) + ")" for e in s
        )
        + ")"
    )


def _used(dev: dict[str, Any]) -> str:
    """How many devices the scenarios ran on: ``8``, or ``8 of the 16``."""
    used = dev.get("used", dev["count"])
    return str(used) if used == dev["count"] else f"{used} of the {dev['count']}"


def demo_table(report: dict[str, Any]) -> Table:
    """The demo's results as a rich table; each scenario's description is in the caption."""
    dev = report["devices"]
    table = Table(
        title=f"shardwise demo — the tutorial's scenarios on {_used(dev)} {dev['platform']} "
        f"devices"
        + (f" in {dev['processes']} processes" if dev.get("processes", 1) > 1 else "")
        + f" ({report['size']} size)",
        title_justify="left",
        caption_justify="left",
    )
    for col in (
        "",
        "mesh",
        "specs (in → out)",
        "shard per device",
        "collectives (from HLO)",
        "time",
        "max error",
        "ok",
    ):
        table.add_column(col)
    legend = []
    for s in report["scenarios"]:
        e = s["explain"]
        if e is None:  # S5: Dask workloads, no single compiled program to explain
            for part in s["parts"]:
                table.add_row(
                    s["name"],
                    "all devices",
                    "one block per device",
                    part["name"],
                    f"Dask alone: {part['dask_seconds'] * 1e3:.0f} ms",
                    f"{part['seconds'] * 1e3:.0f} ms",
                    f"{part['max_abs_error']:.1e}",
                    "[green]yes[/]" if part["ok"] else "[bold red]NO[/]",
                )
            legend.append(f"{s['name']}: {s['title']}; dot(data, data).mean() as ij,jk-> / N²")
            continue
        mesh = ",".join(f"{k}={v}" for k, v in e["mesh"].items())
        specs = (
            " ".join(_spec(o["spec"]) for o in e["operands"]) + " → " + _spec(e["output"]["spec"])
        )
        shards = (
            " ".join(format_shape(o["shard_shape"]) for o in e["operands"])
            + " → "
            + format_shape(e["output"]["shard_shape"])
        )
        comms = (
            "\n".join(
                f"{c['kind']} over {','.join(c['mesh_axes'])} ({c['bytes']:,} B)"
                for c in e["collectives"]
            )
            or "none"
        )
        table.add_row(
            s["name"],
            f"{mesh}\n{e['mode']}",
            specs,
            shards,
            comms,
            f"{s['seconds'] * 1e3:.1f} ms",
            f"{s['max_abs_error']:.1e}",
            "[green]yes[/]" if s["ok"] else "[bold red]NO[/]",
        )
        shapes = " · ".join(format_shape(o["shape"]) for o in e["operands"])
        legend.append(f"{s['name']}: {s['title']} — {e['equation']} on {shapes}")
    table.caption = "\n".join(legend)
    return table


@friendly_errors
def demo(
    size: Annotated[
        str, typer.Option("--size", help="tutorial (the tutorial's sizes) or small (quick).")
    ] = "tutorial",
    repeat: Annotated[
        int,
        typer.Option(
            "--repeat",
            min=1,
            help="Timed runs of each scenario, after a warm-up run; the median is shown.",
        ),
    ] = REPEAT,
    json: Json = False,
    format: Formats = None,
    dask: Annotated[
        bool,
        typer.Option(
            "--dask/--no-dask",
            help="Run S5, the tutorial's Dask workloads "
            "(when Dask is installed and the mesh is in one process).",
        ),
    ] = True,
    pictures: Annotated[
        Path | None,
        typer.Option(
            "--pictures",
            help="Write each scenario's data-flow picture (PNG and SVG) to this folder.",
        ),
    ] = None,
    devices: Devices = None,
) -> None:
    """Run the tutorial's scenarios: sharded dot products (S1–S4), checked against NumPy, and
    its Dask workloads (S5), checked against Dask."""
    from shardwise._demo import SIZES, run_demo
    from shardwise._errors import ArgumentError
    from shardwise.render.formats import show

    fmt = table_format(format, json)
    if size not in SIZES:
        raise ArgumentError(f"--size {size!r} is not one of {', '.join(SIZES)}.")
    setup_devices(devices)
    out = console(stderr=json)
    with out.status("starting") as status:
        report = run_demo(
            size,
            repeat=repeat,
            on_start=lambda s: status.update(f"{s.name}: {s.title}"),
            pictures=pictures,
            with_dask=None if dask else False,
        )
    if json:
        print_json(report)
    else:
        show(out, demo_table(report), fmt)
    for skip in report["skipped"]:
        console(stderr=True).print(
            f"[yellow]skipped {skip['name']}[/] (the tutorial's Dask workloads): "
            + escape(skip["why"]),
            highlight=False,
        )
    if pictures is not None:
        console(stderr=True).print(f"pictures of S1–S4 written to {pictures}/ (PNG and SVG)")
    if not report["ok"]:
        bad = ", ".join(s["name"] for s in report["scenarios"] if not s["ok"])
        console(stderr=True).print(f"[bold red]wrong results in {bad}[/]")
        raise typer.Exit(EXIT_WRONG)
