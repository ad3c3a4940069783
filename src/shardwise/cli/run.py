"""``shardwise run``: stream an einsum over inputs of any size into a file, resumably."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
)

from shardwise.cli._common import (
    Devices,
    Json,
    console,
    friendly_errors,
    print_error,
    print_json,
    renamed,
    setup_devices,
)

HOST_MEMORY = "2GiB"
"""``run --host-memory``'s default."""


@friendly_errors
def run(
    equation: Annotated[str, typer.Argument(help="Einsum equation, e.g. 'nd,nd->n'.")],
    inputs: Annotated[list[str], typer.Argument(help=".npy files or Zarr directories.")],
    out: Annotated[Path, typer.Option("--out", help="Output: a .npy file, or a Zarr folder.")],
    mesh: Annotated[str, typer.Option("--mesh", help="Mesh each chunk is split over.")] = "auto",
    host_memory: Annotated[
        str | None,
        typer.Option(
            "--host-memory",
            help=f"Host memory for the data, e.g. 1GiB (default: {HOST_MEMORY}); chunks are "
            "sized to fit it, and JAX and the compiled programs take memory on top.",
        ),
    ] = None,
    budget: Annotated[
        str | None,
        typer.Option("--budget", hidden=True, help="Deprecated name of --host-memory."),
    ] = None,
    chunk: Annotated[
        str, typer.Option("--chunk", help="Chunk size along the streamed index, or auto.")
    ] = "auto",
    layout: Annotated[
        str | None,
        typer.Option(
            "--layout",
            help="Each chunk's index layout, e.g. n=x,d=y "
            "(default: the streamed index over every mesh axis).",
        ),
    ] = None,
    auto: Annotated[
        bool, typer.Option("--auto", help="Each chunk on the planner's best layout.")
    ] = False,
    checksum: Annotated[
        bool,
        typer.Option(
            "--checksum",
            help="Fingerprint inputs by SHA-256 too (default: size, mtime, inode and sampled "
            "blocks); a resume compares what the run recorded.",
        ),
    ] = False,
    json: Json = False,
    devices: Devices = None,
) -> None:
    """Stream an einsum through the mesh a chunk at a time; rerun the same command to resume."""
    from shardwise._model.units import format_bytes, parse_bytes

    memory = renamed("run", "--host-memory", host_memory, "--budget", budget)
    limit = parse_bytes(HOST_MEMORY if memory is None else memory, "--host-memory")
    setup_devices(devices)
    from shardwise._data.stream import stream

    out_console = console(stderr=True)
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[unit]}"),
        TextColumn("{task.fields[read]}"),
        TimeRemainingColumn(),
    )
    # The bar shows progress, not results: it appears once the first chunk is done (so an input
    # or plan that is refused leaves only its error) and is gone when the run ends, leaving the
    # one summary line below.
    progress = Progress(*columns, console=out_console, transient=True)
    task: list[TaskID] = []

    def on_chunk(done: int, total: int, nbytes: int) -> None:
        if not task:
            progress.start()
            task.append(progress.add_task(equation, total=total, unit="", read=""))
        progress.update(
            task[0],
            total=total,
            completed=done,
            unit="chunk" if total == 1 else "chunks",
            read=f"{format_bytes(nbytes)} read",
        )

    try:
        result = stream(
            equation,
            *inputs,
            mesh=mesh,
            out=out,
            budget=limit,
            chunk=chunk,
            checksum=checksum,
            layout="auto" if auto else layout,
            on_chunk=on_chunk,
        )
    except KeyboardInterrupt:  # (Ctrl-C: the chunks written are kept, as a kill keeps them)
        progress.stop()
        kept = f"the chunks written to {out} are kept; run the same command to resume"
        print_error(f"interrupted: {kept if task else 'before any chunk was written'}.")
        raise typer.Exit(130) from None
    finally:
        if task:
            progress.stop()
    if json:
        from shardwise._data.stream import peak_rss

        print_json({**result.to_json(), "peak_rss_bytes": peak_rss()})
    elif result.chunks == 0:
        out_console.print(
            f"{out} holds the result: an input is empty, so there is nothing to compute."
        )
    elif result.computed == 0:
        out_console.print(
            f"{out} is already complete ({_count(result.chunks, 'chunk')}); nothing to do."
        )
    else:
        out_console.print(
            f"wrote {out}: {_count(result.computed, 'chunk')} computed"
            + (f", {result.skipped} resumed from an earlier run" if result.skipped else "")
            + f", {format_bytes(result.bytes_read)} read at "
            f"{format_bytes(result.throughput)}/s ({'chunks' if result.plan.chunks > 1 else 'one'}"
            f" of {result.plan.chunk} along {result.plan.index!r})"
        )


def _count(n: int, noun: str) -> str:
    """``1 chunk``, ``2 chunks``."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"
