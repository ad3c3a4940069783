"""``shardwise explain``: compile a sharded einsum from shapes and report shards and collectives."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from shardwise._errors import ArgumentError, ShapeError
from shardwise.cli._common import (
    Devices,
    Formats,
    Json,
    check_out,
    console,
    friendly_errors,
    print_json,
    renamed,
    setup_devices,
    table_format,
    write_file,
)


def parse_shapes(text: str) -> list[tuple[int, ...]]:
    """``"4000x10000,4000x10000"`` → ``[(4000, 10000), (4000, 10000)]``; ``()`` is a scalar."""
    shapes: list[tuple[int, ...]] = []
    for part in text.split(","):
        part = part.strip()
        if part in ("()", "scalar"):
            shapes.append(())
            continue
        try:
            dims = tuple(int(d) for d in part.lower().split("x"))
        except ValueError:
            raise ShapeError(
                f"cannot read shapes {text!r}: write each operand's shape as sizes joined by 'x', "
                "and separate operands with commas, e.g. --shapes 4000x10000,4000x10000."
            ) from None
        if any(d < 0 for d in dims):  # (an empty dimension, 0, is NumPy's and ours)
            raise ShapeError(f"shape {part!r} in {text!r} has a negative size.")
        shapes.append(dims)
    return shapes


def _check_in_count(equation: str, in_: list[str] | None) -> None:
    """``--in`` once per operand of ``equation``, or not at all."""
    operands = equation.split("->")[0].count(",") + 1
    if in_ and len(in_) != operands:
        given = f"{len(in_)} time{'s' if len(in_) != 1 else ''}"
        raise ArgumentError(
            f"--in was given {given}, but {equation!r} has {operands} "
            f"operand{'s' if operands != 1 else ''}; give --in once per operand, in order "
            f"('' or - for a replicated one), e.g. {' '.join(['--in -'] * operands)}."
        )


@friendly_errors
def explain(
    equation: Annotated[str, typer.Argument(help="Einsum equation, e.g. 'nd,nd->n'.")],
    shapes: Annotated[
        str, typer.Option("--shapes", help="Operand shapes, e.g. 4000x10000,4000x10000.")
    ],
    mesh: Annotated[str, typer.Option("--mesh", help="Mesh, e.g. x=2,y=4 or devices=8.")] = "auto",
    in_: Annotated[
        list[str] | None,
        typer.Option(
            "--in",
            help="One per operand, in order: a spec like x,y or -,devices; '' or - for replicated.",
        ),
    ] = None,
    out_spec: Annotated[
        str | None,
        typer.Option(
            "--out-spec",
            help="The output's spec, e.g. x; '' or - for replicated; default keeps the inputs' "
            "axes.",
        ),
    ] = None,
    out: Annotated[
        str | None,
        typer.Option("--out", hidden=True, help="Deprecated name of --out-spec."),
    ] = None,
    layout: Annotated[
        str | None, typer.Option("--layout", help="Index layout instead of --in, e.g. n=x,d=y.")
    ] = None,
    auto: Annotated[
        bool, typer.Option("--auto", help="Use the planner's best strategy (says which and why).")
    ] = False,
    dtype: Annotated[
        str, typer.Option("--dtype", help="Operand dtype: float32, bfloat16, … or f32, bf16, ….")
    ] = "float32",
    mode: Annotated[
        str, typer.Option("--mode", help="auto (jit) or manual (shard_map+psum).")
    ] = "auto",
    axis_types: Annotated[
        str, typer.Option("--axis-types", help="Mesh axis types: auto or explicit.")
    ] = "auto",
    json: Json = False,
    format: Formats = None,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="Only the summary, no mesh and block views.")
    ] = False,
    svg: Annotated[
        Path | None, typer.Option("--svg", help="Draw the data flow to this SVG file.")
    ] = None,
    png: Annotated[
        Path | None, typer.Option("--png", help="Draw the data flow to this PNG file.")
    ] = None,
    html: Annotated[
        Path | None,
        typer.Option("--html", help="Write a self-contained HTML report to this file."),
    ] = None,
    devices: Devices = None,
) -> None:
    """Compile a sharded einsum (no data needed); show each device's shard and every collective."""
    from shardwise._xla.dtypes import parse_dtype

    out_spec = renamed("explain", "--out-spec", out_spec, "--out", out)
    fmt = table_format(format, json)
    parsed = parse_dtype(dtype)
    _check_in_count(equation, in_)
    chosen = [f for f, v in (("--auto", auto), ("--layout", layout), ("--in", in_)) if v]
    if len(chosen) > 1:
        raise ArgumentError(
            f"{' and '.join(chosen)} each say how the operands are split: give one of --auto "
            "(the planner's best), --layout (by index) or --in (by operand)."
        )
    for flag, path in (("--svg", svg), ("--png", png), ("--html", html)):
        if path is not None:  # (said before the work, never written over a device)
            check_out(path, flag)
    setup_devices(devices)
    from shardwise import explain_einsum
    from shardwise._model.mesh import mesh as make_mesh

    jmesh = make_mesh(mesh, axis_types=axis_types)  # type: ignore[arg-type]
    result = explain_einsum(
        equation,
        parse_shapes(shapes),
        mesh=jmesh,
        dtype=parsed,
        layout="auto" if auto else layout,
        in_specs=in_,
        out_specs="infer" if out_spec is None else out_spec,
        mode=mode,
    )
    if svg is not None or png is not None:
        from shardwise.render.figure import save

        for path in (svg, png):
            if path is not None:
                save(result, path)
    if html is not None:
        write_file(html, result.to_html())
    if json:
        print_json(result.to_json())
    else:
        from shardwise.render.formats import show
        from shardwise.render.terminal import explanation_view

        show(console(), explanation_view(result, quiet=quiet), fmt)
        for path in (svg, png, html):
            if path is not None:
                console(stderr=True).print(f"wrote {path}")
