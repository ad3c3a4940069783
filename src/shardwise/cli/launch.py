"""``shardwise launch``: one program in N local processes that form one JAX runtime."""

from __future__ import annotations

from typing import Annotated

import typer

from shardwise._runtime.launch import MAX_PROCESSES
from shardwise.cli._common import friendly_errors, print_error


@friendly_errors
def launch(
    command: Annotated[
        list[str], typer.Argument(help="The command, after --, e.g. -- shardwise demo.")
    ],
    processes: Annotated[
        int, typer.Option("-n", "--processes", min=1, max=MAX_PROCESSES, help="Processes.")
    ] = 2,
    devices_per_process: Annotated[
        int | None,
        typer.Option("--devices-per-process", min=1, help="Simulated CPU devices in each process."),
    ] = None,
    port: Annotated[
        int | None,
        typer.Option(
            "--port",
            min=1,
            max=65535,
            help="Coordinator port on 127.0.0.1 (default: a free one).",
        ),
    ] = None,
    coordinator_address: Annotated[
        str | None,
        typer.Option(
            "--coordinator-address",
            metavar="HOST:PORT",
            help="Where process 0 hosts the coordinator and listens (only there), and the "
            "others reach it; default 127.0.0.1 and --port. No authentication: anyone who can "
            "reach this address can join the job, so use a trusted network.",
        ),
    ] = None,
    all_output: Annotated[
        bool, typer.Option("--all-output", help="Show every process's output, not only 0's.")
    ] = False,
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout",
            min=1,
            help="Seconds the others get after one ends (then they are stopped), from 1 to "
            "86,400; also the heartbeat timeout.",
        ),
    ] = 30.0,
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose",
            help="Show all standard error, also what is held back once a process has failed "
            "or finished (native crash reports of the processes stopped because of it).",
        ),
    ] = False,
) -> None:
    """Start N processes on this machine that join one JAX runtime, and end them together.

    The coordinator listens on 127.0.0.1 unless --coordinator-address says otherwise: JAX's
    distributed runtime has no authentication, and anyone who can reach its port can join.
    Ctrl-C, SIGTERM and SIGHUP stop every process; so does the launcher's death (on Linux,
    for any command; elsewhere, for Python programs).
    """
    from shardwise._runtime.launch import launch as run_launch

    outcome = run_launch(
        command,
        processes,
        devices_per_process=devices_per_process,
        port=port,
        all_output=all_output,
        timeout=timeout,
        coordinator_address=coordinator_address,
        verbose=verbose,
    )
    if outcome.returncode:
        print_error(outcome.message)
        raise typer.Exit(outcome.returncode)
