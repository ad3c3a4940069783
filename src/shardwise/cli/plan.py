"""``shardwise plan``: every sharding strategy for an einsum, its predicted cost, ranked."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from shardwise._model.units import format_bytes, parse_bytes
from shardwise.cli._common import Devices, Json, friendly_errors, print_json, setup_devices
from shardwise.cli.explain import parse_shapes


def _ms(s: float) -> str:
    return f"{s * 1e3:.3g} ms" if s >= 1e-4 else f"{s * 1e6:.3g} µs"


@friendly_errors
def plan(
    equation: Annotated[str, typer.Argument(help="Einsum equation, e.g. 'nd,nd->n'.")],
    shapes: Annotated[
        str, typer.Option("--shapes", help="Operand shapes, e.g. 4000x10000,4000x10000.")
    ],
    mesh: Annotated[
        str, typer.Option("--mesh", help="Mesh, e.g. x=2,y=4 (need not exist here).")
    ] = "auto",
    dtype: Annotated[str, typer.Option("--dtype", help="Operand dtype.")] = "float32",
    budget: Annotated[
        str | None,
        typer.Option(
            "--budget", help="Memory per device, e.g. 16GiB; larger strategies are refused."
        ),
    ] = None,
    profile: Annotated[
        str | None,
        typer.Option(
            "--profile",
            help="tpu-v4, tpu-v5e, h100, h200, cpu-2core, a "
            "calibrated name, or a JSON file; default: the devices at hand.",
        ),
    ] = None,
    top: Annotated[int, typer.Option("--top", min=1, help="Strategies to show (and verify).")] = 10,
    verify: Annotated[
        bool, typer.Option("--verify", help="Compile and run the top strategies here; compare.")
    ] = False,
    repeat: Annotated[int, typer.Option("--repeat", min=1, help="Timed runs per strategy.")] = 5,
    json: Json = False,
    devices: Devices = None,
) -> None:
    """Enumerate every way to shard an einsum on a mesh, predict each one's cost, rank them."""
    import jax.numpy as jnp

    import shardwise

    shape_list = parse_shapes(shapes)
    limit = None if budget is None else parse_bytes(budget, "--budget")
    if verify or mesh == "auto" or profile is None:
        setup_devices(devices)
    console = Console(stderr=json)
    with console.status("planning") as status:
        report = shardwise.plan_einsum(
            equation,
            shape_list,
            mesh=mesh,
            dtype=dtype,
            budget=limit,
            profile=profile,
            verify=verify,
            top=top,
            repeat=repeat,
            on_step=lambda k, n: status.update(f"compiling and timing strategy {k + 1}/{n}"),
        )
    op, spec, prof = report.op, report.mesh, report.profile
    if json:
        print_json(report.to_json())
        return
    table = Table(
        title=f"{op.equation} {' · '.join(map(str, shape_list))} {jnp.dtype(dtype).name} on mesh "
        f"{spec.describe()}, profile {prof.name}: {report.considered} considered, "
        f"{report.valid} valid, {len(report.refused)} refused",
        title_justify="left",
    )
    cols = [
        "#",
        "layout",
        "in specs",
        "out",
        "predicted",
        "bound",
        "memory/device",
        "collectives (predicted)",
    ]
    if verify:
        cols += ["measured", "HLO match"]
    for col in cols:
        table.add_column(col)
    for k, cand in enumerate(report.strategies[:top]):
        s, p = cand.strategy, cand.predicted
        row = [
            str(k + 1),
            s.layout.describe(),
            " ".join(x.describe() for x in s.in_specs(op)),
            s.out_spec.describe(),
            _ms(p.seconds),
            p.bound,
            format_bytes(p.memory_bytes),
            "\n".join(f"{c.kind} {','.join(c.mesh_axes)} ({c.bytes:,} B)" for c in p.collectives)
            or "none",
        ]
        if verify:
            v = cand.verified
            row += (
                [_ms(v.seconds), "[green]yes[/]" if v.collectives_match else "[red]NO[/]"]
                if v
                else ["", ""]
            )
        table.add_row(*row)
    console.print(table)
    if len(report.strategies) > top:
        console.print(f"… and {len(report.strategies) - top} more (--top to see them)")
    for r in report.refused[:5]:
        console.print(f"[yellow]refused[/] {r.strategy.describe(op)}: {r.reason}")
    if report.stopped_early:
        console.print(f"[yellow]incomplete:[/] {report.stopped_early}")
    console.print(f"[bold]chosen:[/] {report.why()}")
    if verify:
        rho = report.spearman
        console.print(
            "rank correlation (Spearman) of predicted and measured time: "
            + (f"{rho:.2f}" if rho is not None else "n/a (fewer than 3 strategies)")
        )
