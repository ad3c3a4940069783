"""``shardwise plan``: every sharding strategy for an einsum, its predicted cost, ranked."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from shardwise._errors import ArgumentError
from shardwise._model.units import format_bytes, format_seconds, parse_bytes
from shardwise.cli._common import (
    REPEAT,
    Devices,
    Formats,
    Json,
    console,
    friendly_errors,
    given_options,
    print_json,
    renamed,
    setup_devices,
    table_format,
    timed,
)
from shardwise.cli._models import (
    Attention,
    Batch,
    Ffn,
    Heads,
    Hidden,
    KvHeads,
    Layers,
    Master,
    Microbatches,
    Remat,
    Seq,
    Size,
    Vocab,
)
from shardwise.cli._program_options import (
    ChooseMesh,
    Donate,
    Emit,
    Respect,
    Roles,
    Rules,
    TimeLimit,
)
from shardwise.cli.explain import parse_shapes
from shardwise.render.formats import show

PROGRAM_ONLY = (
    "args", "batch", "seq", "hidden", "ffn", "heads", "layers", "size", "kv_heads", "vocab",
    "master", "remat", "attention", "microbatches", "train", "optimizer", "fixed", "quiet",
    "html", "rules", "respect", "choose_mesh", "roles", "time_limit",
)  # fmt: skip
"""The options of ``plan`` that only a program's plan (``--model``, ``--function``) reads, by
parameter name; an einsum's plan refuses them (``--emit``, ``--donate`` and ``--tune``, with
advice of their own)."""


MODEL_SIZES = (
    "batch", "seq", "hidden", "ffn", "heads", "layers", "size", "kv_heads", "vocab", "master",
    "remat", "attention",
)  # fmt: skip
"""The options that size or shape a built-in model: ``--function`` refuses them."""


@friendly_errors
def plan(
    ctx: typer.Context,
    equation: Annotated[
        str | None, typer.Argument(help="Einsum equation, e.g. 'nd,nd->n'.")
    ] = None,
    shapes: Annotated[
        str | None, typer.Option("--shapes", help="Operand shapes, e.g. 4000x10000,4000x10000.")
    ] = None,
    model: Annotated[
        str | None,
        typer.Option("--model", help="Plan a built-in model: mlp, transformer or llama."),
    ] = None,
    function: Annotated[
        str | None,
        typer.Option("--function", help="Plan your function: module:fn or file.py:fn."),
    ] = None,
    args: Annotated[
        list[str] | None,
        typer.Option(
            "--args",
            help="The function's arguments: x=f32[256,1024], "
            "params.w1=f32[1024,4096] (repeat), or a JSON file.",
        ),
    ] = None,
    batch: Batch = 256,
    seq: Seq = 128,
    hidden: Hidden = None,
    ffn: Ffn = None,
    heads: Heads = None,
    layers: Layers = None,
    size: Size = None,
    kv_heads: KvHeads = None,
    vocab: Vocab = None,
    master: Master = False,
    remat: Remat = "none",
    attention: Attention = "dot_product",
    microbatches: Microbatches = 1,
    train: Annotated[
        bool, typer.Option("--train", help="Plan one SGD step of the loss, not the forward pass.")
    ] = False,
    optimizer: Annotated[
        str | None,
        typer.Option(
            "--optimizer",
            help="With --model and --train: plan the whole training step with this "
            "optimizer's state (adamw: two float32 moments a parameter); default plain SGD.",
        ),
    ] = None,
    fixed: Annotated[
        list[str] | None,
        typer.Option(
            "--fixed",
            help="Pin an input: NAME=SPEC, e.g. x=data, params.w1=-,model, or x=- for "
            "replicated (repeat).",
        ),
    ] = None,
    mesh: Annotated[
        str, typer.Option("--mesh", help="Mesh, e.g. x=2,y=4 (need not exist here).")
    ] = "auto",
    dtype: Annotated[
        str | None,
        typer.Option(
            "--dtype",
            help="Operand dtype: float32, bfloat16, … or f32, bf16, … (default float32; "
            "bfloat16 for llama).",
        ),
    ] = None,
    device_memory: Annotated[
        str | None,
        typer.Option(
            "--device-memory",
            help="Memory of each device, e.g. 16GiB; strategies that need more are refused. "
            "A program (--model, --function) is planned within its profile's memory without "
            "it, and told where nothing fits.",
        ),
    ] = None,
    budget: Annotated[
        str | None,
        typer.Option("--budget", hidden=True, help="Deprecated name of --device-memory."),
    ] = None,
    profile: Annotated[
        str | None,
        typer.Option(
            "--profile",
            help="tpu-v4, tpu-v5e, tpu-v5p, tpu-v6e, h100, h200, cpu-2core, a "
            "calibrated name, or a JSON file; default: the devices at hand.",
        ),
    ] = None,
    top: Annotated[int, typer.Option("--top", min=1, help="Strategies to show (and verify).")] = 10,
    verify: Annotated[
        bool, typer.Option("--verify", help="Compile and run the top strategies here; compare.")
    ] = False,
    tune: Annotated[
        bool,
        typer.Option(
            "--tune",
            help="For a program: verify every plan here, then choose the one that ran fastest.",
        ),
    ] = False,
    repeat: Annotated[
        int,
        typer.Option(
            "--repeat",
            min=1,
            help="With --verify or --tune: timed runs of each strategy (or plan), after a "
            "warm-up run; the median is shown.",
        ),
    ] = REPEAT,
    json: Json = False,
    format: Formats = None,
    devices: Devices = None,
    quiet: Annotated[
        bool,
        typer.Option(
            "--quiet", "-q", help="For a program: only the plans and the ops with collectives."
        ),
    ] = False,
    html: Annotated[
        Path | None,
        typer.Option("--html", help="For a program: write a self-contained HTML report here."),
    ] = None,
    sweep_batch: Annotated[
        str | None,
        typer.Option(
            "--sweep-batch",
            help="For --model: plan at each of these batch sizes (256,1024 or 256..65536, "
            "powers of two) and compare tensor- and data-parallel plans.",
        ),
    ] = None,
    sweep_devices: Annotated[
        str | None,
        typer.Option(
            "--sweep-devices",
            help="For --model with --profile: choose the mesh over --roles (and with --remat "
            "auto the remat policy) at each of these device counts (64,256 or 64..8192).",
        ),
    ] = None,
    plot: Annotated[
        Path | None,
        typer.Option(
            "--plot", help="With --sweep-batch or --sweep-devices: draw the sweep (PNG or SVG)."
        ),
    ] = None,
    rules: Rules = None,
    respect: Respect = "none",
    choose_mesh: ChooseMesh = None,
    roles: Roles = "fsdp,tensor",
    donate: Donate = None,
    time_limit: TimeLimit = None,
    emit: Emit = None,
) -> None:
    """Plan an einsum (every strategy, ranked) or a whole program (--model, --function)."""
    import shardwise
    from shardwise._program.emit import EMITS
    from shardwise._xla.dtypes import parse_dtype

    device_memory = renamed("plan", "--device-memory", device_memory, "--budget", budget)
    table_format(format, json)  # a bad --format is said before any planning
    dtype = None if dtype is None else parse_dtype(dtype).name
    swept = sweep_batch is not None or sweep_devices is not None or plot is not None
    if swept and model is None and function is None:
        raise ArgumentError("--sweep-batch, --sweep-devices and --plot plan a built-in model: "
                            "give --model.")  # fmt: skip
    if emit is not None and emit not in EMITS:
        raise ArgumentError(f"--emit {emit!r} is not a form; give one of {', '.join(EMITS)}.")
    sizes = given_options(ctx, MODEL_SIZES) if function is not None else []
    if sizes:  # (they size a built-in model; a function's arrays come from --args)
        raise ArgumentError(
            f"{', '.join(sizes)} {'sizes' if len(sizes) == 1 else 'size'} a built-in model "
            "(--model), not a function: give the function's arrays' shapes with --args."
        )
    if function is not None and dtype is not None:  # (it had been ignored, silently)
        raise ArgumentError(
            f"--dtype {dtype} sets an einsum's or a built-in model's dtype; a function's arrays "
            "take theirs from --args: give each there, e.g. --args x=bf16[8,4]."
        )
    timed(ctx, repeat, verify or tune, program=model is not None or function is not None)
    if model is not None or function is not None:
        from shardwise.cli.plan_program import program

        program(locals())
        return
    if emit is not None or donate is not None:
        flag = "--emit writes" if emit is not None else "--donate donates arguments of"
        raise ArgumentError(f"{flag} a program's plan: give --model or --function.")
    if tune:
        raise ArgumentError(
            "--tune chooses among a program's plans: give --model or --function. For an "
            "einsum, --verify times the top strategies."
        )
    program_only = given_options(ctx, PROGRAM_ONLY)
    if program_only:
        html_hint = (
            " For an einsum's HTML report: shardwise explain EQUATION --shapes … --auto --html "
            "FILE."
            if html is not None
            else ""
        )
        raise ArgumentError(
            f"{', '.join(program_only)} {'goes' if len(program_only) == 1 else 'go'} with a "
            "program's plan (--model or --function), not an einsum's: drop "
            f"{'it' if len(program_only) == 1 else 'them'}, or plan a program.{html_hint}"
        )
    if equation is None or shapes is None:
        raise ArgumentError(
            "give an einsum and its shapes (shardwise plan 'nd,nd->n' --shapes 4000x10000,"
            "4000x10000), or a program to plan (--model mlp, or --function module:fn --args …)."
        )

    shape_list = parse_shapes(shapes)
    dtype = dtype or "float32"
    fmt = table_format(format)
    limit = None if device_memory is None else parse_bytes(device_memory, "--device-memory")
    if verify or mesh == "auto" or profile is None:
        setup_devices(devices)
    out = console(stderr=json)
    with out.status("planning") as status:
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
        title=f"{op.equation} {' · '.join(map(str, shape_list))} {dtype} on mesh "
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
            format_seconds(p.seconds),
            p.bound,
            format_bytes(p.memory_bytes),
            "\n".join(f"{c.kind} {','.join(c.mesh_axes)} ({c.bytes:,} B)" for c in p.collectives)
            or "none",
        ]
        if verify:
            v = cand.verified
            row += (
                [
                    format_seconds(v.seconds),
                    "[green]yes[/]" if v.collectives_match else "[red]NO[/]",
                ]
                if v
                else ["", ""]
            )
        table.add_row(*row)
    show(out, table, fmt)
    if len(report.strategies) > top:
        out.print(f"… and {len(report.strategies) - top} more (--top to see them)")
    for r in report.refused[:5]:
        out.print(f"[yellow]refused[/] {r.strategy.describe(op)}: {r.reason}")
    if report.stopped_early:
        out.print(f"[yellow]incomplete:[/] {report.stopped_early}")
    out.print(f"[bold]chosen:[/] {report.why()}")
    if verify:
        rho = report.spearman
        out.print(
            "rank correlation (Spearman) of predicted and measured time: "
            + (f"{rho:.2f}" if rho is not None else "n/a (fewer than 3 strategies)")
        )
