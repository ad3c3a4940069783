"""``shardwise bench``: shardwise against NumPy, PyTorch, Dask and plain JAX, and the roofline."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from shardwise.cli._common import (
    REPEAT,
    Devices,
    Formats,
    Json,
    check_out,
    check_plot,
    console,
    friendly_errors,
    print_json,
    setup_devices,
    table_format,
)


@friendly_errors
def bench(
    suite: Annotated[
        str,
        typer.Option("--suite", help="seed (W1–W4), full (+ W1 against N), or tiny (test sizes)."),
    ] = "seed",
    peers: Annotated[
        str | None,
        typer.Option(
            "--peers",
            help="Comma-separated peers to run: numpy, torch, dask, jax (default: every one "
            "that is installed).",
        ),
    ] = None,
    repeat: Annotated[
        int,
        typer.Option(
            "--repeat",
            min=1,
            help="Timed runs of each runner (shardwise and each peer) on each workload, taking "
            "turns; the median is shown.",
        ),
    ] = REPEAT,
    json: Json = False,
    format: Formats = None,
    plot: Annotated[
        Path | None, typer.Option("--plot", help="Draw ratios and W1's curve to this file.")
    ] = None,
    out: Annotated[
        Path | None, typer.Option("--out", help="Also write the JSON results to this file.")
    ] = None,
    devices: Devices = None,
) -> None:
    """Time each workload by shardwise and by every installed peer, alternating, medians."""
    from shardwise._errors import ArgumentError, MissingExtraError
    from shardwise._extras import install_hint
    from shardwise.bench import SUITES, run_bench
    from shardwise.bench.workloads import PEER_MODULES, PEERS, installed
    from shardwise.render.formats import show

    fmt = table_format(format, json)
    if suite not in SUITES:
        raise ArgumentError(f"--suite {suite!r} is not one of {', '.join(SUITES)}.")
    chosen = list(PEERS) if peers is None else [p.strip() for p in peers.split(",") if p.strip()]
    unknown = [p for p in chosen if p not in PEERS]
    if unknown:
        raise ArgumentError(f"unknown peer {unknown[0]!r}; valid peers are {', '.join(PEERS)}.")
    missing = [p for p in chosen if not installed(p)]
    hints = ", ".join(f"{p} ({install_hint(PEER_MODULES[p])})" for p in missing)
    if missing and peers is not None:
        one = len(missing) == 1
        raise MissingExtraError(
            f"--peers names {', '.join(missing)}, which {'is' if one else 'are'} not installed "
            f"here; install {hints}, or leave {'it' if one else 'them'} out of --peers."
        )
    progress = console(stderr=True)
    if missing:
        progress.print(f"[yellow]not installed, so not benchmarked:[/] {hints}", highlight=False)
    chosen = [p for p in chosen if p not in missing]
    if plot is not None:  # said before the benchmark, not after it
        check_plot(plot)
    if out is not None:
        check_out(out)
    setup_devices(devices)
    from shardwise._demo import check_devices

    check_devices("bench's workloads")  # (before the machine is measured)
    with progress.status("benchmarking") as status:
        doc = run_bench(
            suite,
            chosen,
            repeat,
            curve=True if plot else None,
            on_step=lambda what: status.update(what),
        )
    if out is not None:  # (first: a picture that fails leaves the results written)
        import json as json_module

        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json_module.dumps(doc, indent=1) + "\n")
    if plot is not None:
        from shardwise.bench.plot import plot_bench

        plot_bench(doc, plot)
    if json:
        print_json(doc)
        return
    show(console(), bench_table(doc, suite, repeat), fmt)
    if plot is not None:
        progress.print(f"plot written to {plot}")


CACHED_BYTES = 64 * 10**6
"""A bandwidth probe smaller than this may be read from a cache, not from memory."""


def bench_table(doc: dict[str, Any], suite: str, repeat: int) -> Table:
    """The benchmark's results as a table: the machine in its title, a workload past its
    roofline said under it."""
    from shardwise.bench.workloads import PEERS

    m = doc["machine"]
    small = m.get("probe_bytes", CACHED_BYTES) < CACHED_BYTES
    memory = "memory" if not small else f"a read of {m['probe_bytes'] / 1e6:.0f} MB (in cache)"
    over = any(w["roofline_fraction_machine"] > 1 for w in doc["workloads"])
    table = Table(
        title=f"shardwise bench ({suite}) on {_machine(doc)}{m['cores']} cores, "
        f"{doc['devices']['count']} {doc['devices']['platform']} devices — {memory} "
        f"{m['memory_gbps']:.1f} GB/s, sgemm {m['sgemm_gflops']:.0f} GFLOP/s"
        f"{'; malloc in huge pages' if m.get('malloc_huge_pages') else ''}; medians of {repeat}"
        f"{_versions(doc)}",
        title_justify="left",
        caption="over 100% of roofline: the workload read faster than the bandwidth probe "
        "did, so that roofline is a floor there, not a ceiling"
        if over
        else None,
        caption_justify="left",
    )
    present = [p for p in PEERS if any(p in w["peers"] for w in doc["workloads"])]
    for col in (
        "",
        "workload",
        "shardwise",
        "of roofline (same window)",
        "of roofline (machine best)",
        *(f"{p} ÷ shardwise" for p in present),
        "layer overhead",
        "correct",
    ):
        table.add_column(col)
    for w in doc["workloads"]:
        ok = all(w["correct"].values())
        table.add_row(
            w["name"],
            w["title"],
            f"{w['shardwise_seconds'] * 1e3:.1f} ms",
            f"{w['roofline_fraction']:.0%}",
            f"{w['roofline_fraction_machine']:.0%}",
            *(f"{w['ratios'][p]:.2f}×" if p in w["ratios"] else "-" for p in present),
            f"{w['layer_overhead']:+.1%}",
            "[green]yes[/]"
            if ok
            else "[red]NO: " + ", ".join(k for k, v in w["correct"].items() if not v) + "[/]",
        )
    return table


def _machine(doc: dict[str, Any]) -> str:
    """The CPU's model and the system, as the title's start (nothing for results saved
    before they were recorded)."""
    h = doc.get("host")
    return f"{h['cpu']} ({h['system']}, Python {h['python']}), " if h else ""


def _versions(doc: dict[str, Any]) -> str:
    """The libraries' versions, as the title's second line."""
    versions = (doc.get("host") or {}).get("versions") or {}
    said = [f"{name} {v if v is not None else 'not installed'}" for name, v in versions.items()]
    return "\n" + ", ".join(said) if said else ""
