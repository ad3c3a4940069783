"""The ``shardwise`` command: a thin shell over the Python API, one file per command."""

from __future__ import annotations

import typer

from shardwise._runtime.child import set_up
from shardwise._runtime.hostmem import keep_freed_memory_warm, rerun_with_huge_pages
from shardwise.cli import bench as _bench
from shardwise.cli import calibrate as _calibrate
from shardwise.cli import demo as _demo
from shardwise.cli import explain as _explain
from shardwise.cli import launch as _launch
from shardwise.cli import plan as _plan
from shardwise.cli import run as _run

app = typer.Typer(
    name="shardwise",
    help="Plan, see and trust tensor parallelism in JAX.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("demo")(_demo.demo)
app.command("explain")(_explain.explain)
app.command("plan")(_plan.plan)
app.command("calibrate")(_calibrate.calibrate)
app.command("bench")(_bench.bench)
app.command("run")(_run.run)
app.command("launch", context_settings={"allow_interspersed_args": False})(_launch.launch)


def main() -> None:
    """Entry point of the ``shardwise`` console script: the process is the command's own, so
    here (not on ``import shardwise``) it takes simulated devices from
    ``SHARDWISE_CPU_DEVICES``, joins a distributed runtime if ``shardwise launch`` started
    it, and keeps freed host memory warm for CPU devices."""
    rerun_with_huge_pages()
    set_up()
    keep_freed_memory_warm()
    app()
