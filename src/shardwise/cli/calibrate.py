"""``shardwise calibrate``: measure the devices at hand and store a profile for the planner."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from shardwise.cli._common import (
    Devices,
    Formats,
    Json,
    check_out,
    console,
    friendly_errors,
    print_json,
    setup_devices,
    table_format,
)


@friendly_errors
def calibrate(
    mesh: Annotated[str, typer.Option("--mesh", help="Mesh whose axes to measure.")] = "auto",
    out: Annotated[
        Path | None, typer.Option("--out", help="Write the profile here instead of the cache.")
    ] = None,
    size: Annotated[
        str, typer.Option("--size", help="Bytes per device for the bandwidth tests.")
    ] = "64MiB",
    repeat: Annotated[
        int,
        typer.Option(
            "--repeat",
            min=1,
            help="Timed runs of each measurement (memory bandwidth, matmuls per dtype, each "
            "collective on each axis at a small and a large size), all taking turns; the "
            "median is kept.",
        ),
    ] = 5,
    json: Json = False,
    format: Formats = None,
    devices: Devices = None,
) -> None:
    """Measure memory bandwidth, matmul FLOP/s and collectives along each mesh axis."""
    from shardwise._model.units import format_bytes, parse_bytes
    from shardwise.render.formats import show

    fmt = table_format(format, json)
    if out is not None:
        check_out(out)
    per_device = parse_bytes(size, "--size")
    setup_devices(devices)
    from shardwise._model.mesh import mesh as make_mesh
    from shardwise._model.profile_files import save_profile
    from shardwise._planner.calibrate import calibrate as measure

    jmesh = make_mesh(mesh)
    progress = console(stderr=True)
    with progress.status("calibrating") as status:
        profile = measure(
            jmesh,
            per_device_bytes=per_device,
            repeat=repeat,
            on_step=lambda what: status.update(f"measuring {what}"),
        )
    path = save_profile(profile, out)
    if json:
        print_json(profile.to_json())
    else:
        table = Table(
            title=f"profile {profile.name} (per device, all devices busy)", title_justify="left"
        )
        table.add_column("figure")
        table.add_column("value")
        table.add_row("memory bandwidth", f"{profile.memory_Bps / 1e9:.2f} GB/s")
        for dtype, f in profile.flops_per_s.items():
            table.add_row(f"matmul {dtype}", f"{f / 1e9:.1f} GFLOP/s")
        if profile.conv_tap_s is not None:
            table.add_row("convolution, per position and tap", f"{profile.conv_tap_s * 1e9:.1f} ns")
        for kind, links in (
            ("all-reduce", profile.axis_links),
            ("all-gather", profile.gather_links),
        ):
            for axis, link in links.items():
                table.add_row(
                    f"{kind} along {axis}",
                    f"α {link.latency_s * 1e6:.1f} µs, β {link.bandwidth_Bps / 1e9:.2f} GB/s",
                )
        if profile.memory_bytes:
            table.add_row("memory", format_bytes(profile.memory_bytes))
        show(console(), table, fmt)
    progress.print(f"profile written to {path}")
