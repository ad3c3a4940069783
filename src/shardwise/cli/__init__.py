"""The ``shardwise`` command: a thin shell over the Python API, one file per command."""

from __future__ import annotations

from typing import Annotated

import typer

from shardwise._runtime.child import run_reported, set_up
from shardwise._runtime.hostmem import keep_freed_memory_warm, rerun_with_huge_pages
from shardwise.cli import bench as _bench
from shardwise.cli import calibrate as _calibrate
from shardwise.cli import demo as _demo
from shardwise.cli import explain as _explain
from shardwise.cli import launch as _launch
from shardwise.cli import plan as _plan
from shardwise.cli import run as _run
from shardwise.cli._common import Command, Group, show_warnings_plainly

app = typer.Typer(
    name="shardwise",
    cls=Group,
    help="Plan, see and trust tensor parallelism in JAX.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(given: bool) -> None:
    if given:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"shardwise {version('shardwise')}")
        except PackageNotFoundError:  # run from a source tree that was never installed
            typer.echo("shardwise (not installed: no version recorded)")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Plan, see and trust tensor parallelism in JAX."""


app.command("demo", cls=Command)(_demo.demo)
app.command("explain", cls=Command)(_explain.explain)
app.command("plan", cls=Command)(_plan.plan)
app.command("calibrate", cls=Command)(_calibrate.calibrate)
app.command("bench", cls=Command)(_bench.bench)
app.command("run", cls=Command)(_run.run)
app.command("launch", cls=Command, context_settings={"allow_interspersed_args": False})(
    _launch.launch
)


def main() -> None:
    """The ``shardwise`` command, run by its console script (:func:`shardwise._main.main`,
    which restarts the process with huge pages before this module is imported) and by
    ``python -m shardwise.cli`` (restarted here, after): the process is the command's own, so
    here (not on ``import shardwise``) it takes simulated devices from
    ``SHARDWISE_CPU_DEVICES``, joins a distributed runtime if ``shardwise launch`` started
    it, and keeps freed host memory warm for CPU devices."""
    rerun_with_huge_pages()  # (a no-op where the process was restarted already)
    show_warnings_plainly()  # (here, not for every app call: a caller's own capture stays)
    set_up()
    keep_freed_memory_warm()
    run_reported(app)
