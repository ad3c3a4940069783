"""``shardwise launch``: one program in N local processes that form one JAX runtime."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from shardwise.cli._common import friendly_errors


@friendly_errors
def launch(
    command: Annotated[
        list[str], typer.Argument(help="The command, after --, e.g. -- shardwise demo.")
    ],
    processes: Annotated[int, typer.Option("-n", "--processes", min=1, help="Processes.")] = 2,
    devices_per_process: Annotated[
        int | None,
        typer.Option("--devices-per-process", min=1, help="Simulated CPU devices in each process."),
    ] = None,
    port: Annotated[
        int | None,
        typer.Option("--port", min=1, max=65535, help="Coordinator port (default: a free one)."),
    ] = None,
    all_output: Annotated[
        bool, typer.Option("--all-output", help="Show every process's output, not only 0's.")
    ] = False,
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout",
            min=1,
            help="Seconds the others get after one ends; also the heartbeat timeout.",
        ),
    ] = 30.0,
) -> None:
    """Start N processes on this machine that join one JAX runtime, and end them together."""
    from shardwise._runtime.launch import launch as run_launch

    outcome = run_launch(command, processes, devices_per_process, port, all_output, timeout)
    if outcome.returncode:
        Console(stderr=True).print(f"[bold red]error:[/] {outcome.message}", highlight=False)
        raise typer.Exit(outcome.returncode)
