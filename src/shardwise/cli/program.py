"""``shardwise plan --model …`` / ``--function …``: plan a whole program and print the plans."""

from __future__ import annotations

import importlib
import importlib.util
import json
import re
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from shardwise._errors import ArgumentError
from shardwise._model.units import format_bytes, format_seconds

_ARRAY = re.compile(r"^\s*([a-z]+)(\d+)\[([\d,\s]*)\]\s*$")
_KINDS = {"f": "float", "bf": "bfloat", "i": "int", "u": "uint"}


def parse_array(text: str, where: str) -> Any:
    """``"f32[256,1024]"`` → ``jax.ShapeDtypeStruct((256, 1024), float32)``."""
    import jax
    import numpy as np

    m = _ARRAY.match(text)
    if not m or m.group(1) not in _KINDS:
        raise ArgumentError(
            f"cannot read {where} {text!r}: write a dtype and a shape, e.g. f32[256,1024] "
            "(dtypes f16, bf16, f32, f64, i32, …)."
        )
    try:
        dtype = np.dtype(_KINDS[m.group(1)] + m.group(2)) if m.group(1) != "bf" else "bfloat16"
    except TypeError:
        raise ArgumentError(f"cannot read {where} {text!r}: no dtype {m.group(0)!r}.") from None
    dims = tuple(int(d) for d in m.group(3).replace(" ", "").split(",") if d)
    return jax.ShapeDtypeStruct(dims, dtype)


def _tree(raw: Any, where: str) -> Any:
    if isinstance(raw, str):
        return parse_array(raw, where)
    if isinstance(raw, dict):
        return {k: _tree(v, f"{where}.{k}") for k, v in raw.items()}
    if isinstance(raw, list):
        return [_tree(v, f"{where}[{k}]") for k, v in enumerate(raw)]
    raise ArgumentError(f"cannot read {where}: {raw!r} is not a shape like f32[256,1024].")


def parse_args(items: list[str]) -> list[Any]:
    """``--args`` values (``x=f32[8,4]``, ``params.w1=f32[4,2]``, or a JSON file of them) as
    the function's positional arguments, in order of first appearance."""
    named: dict[str, Any] = {}
    for item in items:
        if item.endswith(".json"):
            try:
                raw = json.loads(Path(item).read_text())
            except (OSError, json.JSONDecodeError) as e:
                raise ArgumentError(f"cannot read the shapes file {item!r}: {e}.") from None
            if not isinstance(raw, dict):
                raise ArgumentError(f"{item!r} must hold an object of name → shape.")
            named.update({k: _tree(v, k) for k, v in raw.items()})
            continue
        name, eq, shape = item.partition("=")
        if not eq or not name:
            raise ArgumentError(
                f"cannot read --args {item!r}: write NAME=SHAPE, e.g. --args x=f32[256,1024] "
                "--args params.w1=f32[1024,4096], or give a JSON file."
            )
        *path, leaf = name.split(".")
        node = named
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = parse_array(shape, f"--args {name}")
    return list(named.values())


def load_function(ref: str) -> Any:
    """``pkg.module:fn`` or ``path/file.py:fn`` as the function it names."""
    target, colon, attr = ref.rpartition(":")
    if not colon or not target or not attr:
        raise ArgumentError(
            f"--function {ref!r} does not name a function; write module:function, e.g. "
            "--function mypkg.models:loss or --function train.py:loss."
        )
    try:
        if target.endswith(".py"):
            spec = importlib.util.spec_from_file_location(Path(target).stem, target)
            if spec is None or spec.loader is None:
                raise ImportError(target)
            module = importlib.util.module_from_spec(spec)
            sys.path.insert(0, str(Path(target).resolve().parent))
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(target)
    except (ImportError, OSError) as e:
        raise ArgumentError(f"cannot import {target!r} for --function: {e}.") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ArgumentError(f"{target!r} has no function {attr!r}.")
    return fn


def show(report: Any, console: Console) -> None:
    """The plans as a table, cheapest first, with what was chosen and why."""
    verified = any(p.verified for p in report.plans)
    table = Table(
        title=f"{report.program} on mesh {report.mesh.describe()}, profile {report.profile.name}"
        f"{' (training step)' if report.train else ''}: {report.ops} ops, "
        f"{report.considered:,} layouts considered, solved in {report.solve_seconds:.2f} s by "
        f"{report.method}{'' if report.optimal else ' (not proven optimal)'}",
        title_justify="left",
    )
    for col in ["plan", "inputs", "predicted", "memory/device", "collectives"]:
        table.add_column(col)
    if verified:
        for col in ["measured", "memory (XLA)", "HLO match"]:
            table.add_column(col)
    names = report.graph.names
    for p in report.plans:
        kinds: dict[tuple[str, tuple[str, ...]], int] = {}
        for c in p.predicted.collectives:
            kinds[(c.kind, c.mesh_axes)] = kinds.get((c.kind, c.mesh_axes), 0) + 1
        row = [
            f"[bold]{p.name}[/]" if p.name == "search" else p.name,
            escape(
                "\n".join(f"{n}: {s.describe()}" for n, s in zip(names, p.in_specs, strict=True))
            ),
            format_seconds(p.predicted.seconds),
            format_bytes(p.predicted.memory_bytes),
            "\n".join(f"{n}× {k} {','.join(a)}" for (k, a), n in kinds.items()) or "none",
        ]
        if verified and p.verified is not None:
            v = p.verified
            row += [
                format_seconds(v.seconds),
                format_bytes(v.memory_bytes) if v.memory_bytes is not None else "n/a",
                "[green]yes[/]" if v.collectives_match else "[red]no[/]",
            ]
        table.add_row(*row)
    console.print(table)
    for name, why in report.skipped:
        console.print(f"[yellow]skipped[/] {name}: {escape(why)}")
    best = report.chosen.predicted.seconds
    others = [p for p in report.plans if not p.name.startswith("search")]
    if others:
        console.print(
            "[bold]chosen:[/] the search's plan, predicted "
            + ", ".join(f"{p.predicted.seconds / best:.2f}× as long for {p.name}" for p in others)
            if best > 0
            else "[bold]chosen:[/] the search's plan"
        )
    if verified:
        rho = report.spearman
        console.print(
            "rank correlation (Spearman) of predicted and measured time: "
            + (f"{rho:.2f}" if rho is not None else "n/a")
        )


SPARK = "▁▂▃▄▅▆▇█"


def sparkline(points: list[int] | tuple[int, ...], width: int = 60) -> str:
    """A row of block characters that rises and falls with ``points`` (resampled to at most
    ``width`` characters, each the largest value it covers).

    >>> sparkline([0, 1, 2, 4])
    '▁▃▅█'
    """
    if not points:
        return ""
    step = max(1, -(-len(points) // width))
    peaks = [max(points[k : k + step]) for k in range(0, len(points), step)]
    top = max(peaks) or 1
    return "".join(SPARK[min(len(SPARK) - 1, int(p / top * (len(SPARK) - 1) + 0.5))] for p in peaks)


def _arrays(views: Any) -> str:
    lines = []
    for a in views:
        text = a.to_json()
        lines.append(escape(f"{a.name} [{text['used_text']}]"))
        if a.held.canonical() != a.used.canonical():
            lines.append("[dim]" + escape(f"  (held as [{text['held_text']}])") + "[/]")
    return "\n".join(lines)


def show_ops(report: Any, console: Console, quiet: bool = False) -> None:
    """One plan op by op (``quiet``: only the ops that cause collectives), then its memory over
    the program."""
    table = Table(
        title=f"plan {report.plan!r} op by op: what each op reads and makes, on each device, and "
        "the collectives it causes",
        title_justify="left",
        show_lines=True,
    )
    for col in ("op", "reads", "makes", "collectives and why", "time"):
        table.add_column(col)
    for row in report.rows:
        if quiet and not row.collectives:
            continue
        where = f"\n[dim]{escape(row.source)}[/]" if row.source else ""
        back = f"\n[italic]backward of {escape(row.mirrors)}[/]" if row.mirrors else ""
        repeat = f"\n×{row.repeat} (scan)" if row.repeat > 1 else ""
        moves = "\n".join(
            f"[bold]{c.kind}[/] {','.join(c.mesh_axes)} {format_bytes(c.bytes)}"
            f"{f' ×{c.repeat}' if c.repeat > 1 else ''}: {escape(c.why)}"
            for c in row.collectives
        )
        table.add_row(
            escape(row.op) + where + back + repeat,
            _arrays(row.inputs),
            _arrays((row.output,)),
            moves or "[dim]none[/]",
            f"{row.share:.0%}",
        )
    console.print(table)
    rest = 1 - sum(row.share for row in report.rows)
    if rest > 0.005:
        console.print(f"the other {rest:.0%} of the time: elementwise ops and layout maps")
    mem = report.memory
    console.print(
        f"memory per device over the program: {sparkline(mem.points)}  peak "
        f"{format_bytes(mem.peak)} at point {mem.at} of {len(mem.points) - 1}"
    )
    held = ", ".join(f"{escape(n)} {format_bytes(b)}" for n, b in mem.alive[:8])
    more = f" and {len(mem.alive) - 8} more" if len(mem.alive) > 8 else ""
    console.print(f"held at the peak: {held}{more}")
