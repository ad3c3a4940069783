"""Self-contained HTML reports (inline CSS, SVG, script; no network) of a planned program
(:func:`program_html`; one explanation's is :mod:`shardwise.render.explanation`'s, drawn with
the same parts). Each array is drawn
as a grid of ``rect.device``, one per mesh device, coloured by the block the device holds;
hovering a device highlights it in every array and lists what it holds in ``.info``."""

from __future__ import annotations

import html
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from shardwise._model.units import format_bytes, format_seconds, format_shape
from shardwise.render.report_css import MEASURED, PALETTE, PREDICTED
from shardwise.render.report_memory import held_rows, memory_svg
from shardwise.render.report_page import report_html

Mesh = Sequence[tuple[str, int]]
"""Mesh axes and sizes, in order (devices are numbered row-major over them)."""
CELL = 22
"""Side of a device square, pixels (smaller for wide meshes)."""
MAX_ROW = 8
"""Devices per row for a 1-D mesh."""
NONE = '<span class="none">none</span>'


def _e(value: object) -> str:
    return html.escape(str(value))


_TICKS = re.compile(r"`([^`]+)`")


def _md(text: object) -> str:
    """Text whose ``code`` spans (in backticks, as the causes write index and axis names) are
    shown as ``<code>``, escaped.

    >>> _md("over `y`: index `d` is <split>")
    'over <code>y</code>: index <code>d</code> is &lt;split&gt;'
    """
    return _TICKS.sub(r"<code>\1</code>", _e(text))


def _plain(text: object) -> str:
    """Text without its backticks, for what the page shows as plain text (``data-why``)."""
    return _TICKS.sub(r"\1", str(text))


def _table(heads: Sequence[str], rows: str, cls: str = "") -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in heads)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>'


def _cells(values: Sequence[object]) -> str:
    return (
        f"<tr><td>{_e(values[0])}</td>"
        + "".join(f'<td class="n">{_e(v)}</td>' for v in values[1:])
        + "</tr>"
    )


def _axes(entry: object) -> tuple[str, ...]:
    """The mesh axes of one spec entry: ``None``, an axis name, or a list of them."""
    if entry is None or isinstance(entry, str):
        return () if entry is None else (entry,)
    return tuple(str(a) for a in entry)  # type: ignore[attr-defined]


def spec_text(spec: Sequence[object]) -> str:
    """``[None, ["data", "model"]]`` → ``'-, data+model'``; ``'whole'`` when nothing is split.

    >>> spec_text([None, ["data", "model"]]), spec_text([None])
    ('-, data+model', 'whole')
    """
    parts = ["+".join(_axes(e)) or "-" for e in spec]
    return ", ".join(parts) if any(_axes(e) for e in spec) else "whole"


def device_blocks(
    spec: Sequence[object], shape: Sequence[int], mesh: Mesh
) -> list[tuple[tuple[int, int], ...]]:
    """For each device (row-major over ``mesh``), the ``[start, stop)`` it holds per dimension.

    >>> device_blocks(["x", None], [4, 3], [("x", 2), ("y", 2)])[2]
    ((2, 4), (0, 3))
    """
    sizes = dict(mesh)
    entries = list(spec)[: len(shape)] + [None] * (len(shape) - len(spec))
    out = []
    for pos in range(math.prod(sizes.values())):
        coords: dict[str, int] = {}
        rest = pos
        for name, size in reversed(mesh):
            coords[name], rest = rest % size, rest // size
        ranges = []
        for entry, n in zip(entries, shape, strict=True):
            index, ways = 0, 1
            for axis in (a for a in _axes(entry) if a in sizes):
                index, ways = index * sizes[axis] + coords[axis], ways * sizes[axis]
            ranges.append((index * n // ways, (index + 1) * n // ways))
        out.append(tuple(ranges))
    return out


def _block_text(name: str, block: Sequence[tuple[int, int]]) -> str:
    return f"{name}[{', '.join(f'{a}:{b}' for a, b in block)}]" if block else f"{name} (scalar)"


def _grid(mesh: Mesh) -> tuple[int, int]:
    """Rows and columns of the device grid: first axis down, the rest across."""
    total, cols = math.prod(s for _, s in mesh), min(mesh[0][1], MAX_ROW)
    return (math.ceil(total / cols), cols) if len(mesh) == 1 else (mesh[0][1], total // mesh[0][1])


def mesh_svg(arr: Mapping[str, Any], spec: Sequence[object], mesh: Mesh, **kw: Any) -> str:
    """One array drawn on the mesh: a coloured square per device, its block in the title.

    ``kw``: ``labels`` (device names, default the positions), ``held`` (the spec the array
    is kept in, noted in the titles where it differs from ``spec``).
    """
    name, shape = str(arr.get("name", "array")), arr["shape"]
    rows, cols = _grid(mesh)
    cell = CELL if cols <= 16 else max(6, 352 // cols)
    labels, held = kw.get("labels") or list(range(rows * cols)), kw.get("held")
    used = device_blocks(spec, shape, mesh)
    kept = device_blocks(held, shape, mesh) if held is not None and held != spec else None
    colours: dict[tuple[tuple[int, int], ...], str] = {}
    rects = []
    for pos, block in enumerate(used):
        colour = colours.setdefault(block, PALETTE[len(colours) % len(PALETTE)])
        x, y = (pos % cols) * cell, (pos // cols) * cell
        title = f"device {labels[pos]}: {_block_text(name, block)}"
        if kept is not None:
            title += f" (kept as {_block_text(name, kept[pos])})"
        rects.append(
            f'<rect class="device" data-device="{pos}" x="{x + 1}" y="{y + 1}" '
            f'width="{cell - 2}" height="{cell - 2}" rx="3" fill="{colour}">'
            f"<title>{_e(title)}</title></rect>"
        )
        if cell >= 16:
            rects.append(
                f'<text x="{x + cell / 2}" y="{y + cell / 2 + 4}" font-size="10" '
                f'text-anchor="middle" fill="#333">{_e(labels[pos])}</text>'
            )
    return f'<svg width="{cols * cell}" height="{rows * cell}" role="img">{"".join(rects)}</svg>'


def array_figure(arr: Mapping[str, Any], mesh: Mesh, key: str = "used", **kw: Any) -> str:
    """A ``figure.array``: the array on the mesh, captioned with name, shape and layout."""
    spec = arr.get(key, arr.get("spec")) or []
    held = arr.get("held")
    text = arr.get(f"{key}_text") or spec_text(spec)
    note = kw.pop("note", "")
    if held is not None and held != spec:
        note = f"kept as {arr.get('held_text') or spec_text(held)}"
    caption = (
        f"<b>{_e(arr.get('name', 'array')).replace('@', '@<wbr>')}</b><br>"
        f'<span class="muted">{_e(arr.get("dtype", ""))}{_e(format_shape(arr["shape"]))} · '
        f"{_e(text)}{'<br>' + _e(note) if note else ''}</span>"
    )
    svg = mesh_svg(arr, spec, mesh, held=held, **kw)
    return f'<figure class="array">{svg}<figcaption>{caption}</figcaption></figure>'


def collective_button(c: Mapping[str, Any], why: str, where: str = "") -> str:
    """A clickable ``button.coll``: kind, axes, bytes (and repeats); its cause shows in .info."""
    axes, size = "+".join(c.get("mesh_axes") or []) or "-", format_bytes(c.get("bytes", 0))
    repeat = f" ×{c['repeat']}" if int(c.get("repeat", 1)) > 1 else ""
    label, what = f"{axes} · {size}{repeat}", f"{c['kind']} over {axes}, {size}"
    return (
        f'<button type="button" class="coll" data-what="{_e(what)}" data-where="{_e(where)}" '
        f'data-why="{_e(_plain(why))}"><b>{_e(c["kind"])}</b><br>{_e(label)}</button>'
    )


def _header(title: str, kind: str, facts: Sequence[tuple[str, str]], mesh: Mesh) -> str:
    size = f"{' × '.join(f'{a}={n}' for a, n in mesh)} ({math.prod(n for _, n in mesh)} devices)"
    items = "".join(f"<li><b>{_e(k)}</b>{_e(v)}</li>" for k, v in [("mesh", size), *facts])
    head = f"<h1>{_e(title)}<small>{_e(kind)}</small></h1>"
    return f'<header>{head}<ul class="facts">{items}</ul></header>'


def _program_header(plan: Mapping[str, Any], report: Mapping[str, Any], mesh: Mesh) -> str:
    search = str(plan.get("method", "")) + (", optimal" if plan.get("optimal") else "")
    if plan.get("considered"):
        search += f", {plan['considered']} layouts considered"
    if plan.get("solve_seconds") is not None:
        search += f" in {plan['solve_seconds']:.2f} s"
    facts = [
        ("plan shown", str(report.get("plan", plan.get("chosen", "")))),
        ("predicted", format_seconds(float(report.get("seconds", 0.0)))),
        ("profile", str(plan.get("profile", ""))),
        ("searched by", search),
    ]
    if plan.get("tuned"):
        facts.append(("chosen", f"{plan.get('chosen')}, the plan that ran fastest here (tuned)"))
    if plan.get("spearman") is not None:
        facts.append(("rank correlation, predicted vs measured", f"{plan['spearman']:.2f}"))
    if (told := plan.get("ordered") or {}).get("share") is not None:
        share = f"{told['share']:.0%} of {told['pairs']} pairs"
        facts.append(("ordered as predicted, of plans measured > 25% apart", share))
    if (ratio := plan.get("chosen_vs_fastest")) is not None:
        facts.append(("chosen plan ÷ fastest measured", f"{ratio:.2f}×"))
    # (without train, the program as written: a forward pass, or a user's own training step)
    kind = "training step" if report.get("train") else "program"
    return _header(str(report.get("program", "program")), kind, facts, mesh)


def _plan_row(p: Mapping[str, Any], shown: str, base: float, views: Mapping[str, Any]) -> str:
    pred, ver = p["predicted"], p.get("verified") or {}
    cells = [
        format_seconds(pred["seconds"]),
        f"{pred['seconds'] / base:.2f}×" if base else "",
        format_seconds(ver["seconds"]) if "seconds" in ver else "—",
        format_bytes(pred["memory_bytes"]) + (" (over budget)" if p.get("over_budget") else ""),
        format_bytes(ver["memory_bytes"]) if "memory_bytes" in ver else "—",
        str(len(pred.get("collectives", []))),
        {None: "—", True: "yes", False: "NO"}[ver.get("collectives_match")]
        + (" (ops/lines NO)" if ver.get("sources_match") is False else ""),
    ]
    cls = ' class="shown"' if p["name"] == shown else ""
    view = views.get(p["name"])
    twin = p.get("same_program_as")
    same = f"<br><small>the same program as {_e(twin)}</small>" if twin else ""
    if view is None:
        name = f'<tr{cls}><td title="{_e(p.get("in_specs", ""))}">{_e(p["name"])}{same}</td>'
    else:  # the plan's name opens its view op by op; its layouts beside it
        target = _e(_view_id(list(views).index(p["name"])))
        opens = f"document.getElementById('{target}').open=true"
        layouts = "<br>".join(_e(line) for line in view.get("layouts", []))
        name = (
            f'<tr{cls}><td><a href="#{target}" onclick="{opens}">{_e(p["name"])}</a>{same}</td>'
            f'<td class="layouts">{layouts}</td>'
        )
    return name + "".join(f'<td class="n">{_e(c)}</td>' for c in cells) + "</tr>"


def _view_id(k: int) -> str:
    """The id of the k-th plan's view op by op."""
    return f"plan-{k}-ops"


def _bars(plans: Sequence[Mapping[str, Any]]) -> str:
    """Predicted and measured time of each plan as horizontal bars (inline SVG)."""
    values = [(p["predicted"]["seconds"], (p.get("verified") or {}).get("seconds")) for p in plans]
    top = max([v for pair in values for v in pair if v] or [1.0])
    left, width, step = 110, 420, 20
    out = [
        f'<rect x="{left + j * 90}" y="4" width="10" height="10" fill="{colour}"/><text '
        f'x="{left + 14 + j * 90}" y="13" font-size="11">{label}</text>'
        for j, (label, colour) in enumerate((("predicted", PREDICTED), ("measured", MEASURED)))
    ]
    for k, (p, pair) in enumerate(zip(plans, values, strict=True)):
        y = 24 + k * step
        out.append(f'<text x="{left - 6}" y="{y + 13}" font-size="11" text-anchor="end">')
        out.append(f"{_e(p['name'])}</text>")
        for j, (v, colour) in enumerate(zip(pair, (PREDICTED, MEASURED), strict=True)):
            if v:
                w = max(1.0, width * v / top)
                out.append(
                    f'<rect x="{left}" y="{y + 1 + j * 9}" width="{w:.1f}" height="8" '
                    f'fill="{colour}"/><text x="{left + w + 4:.1f}" y="{y + 8 + j * 9}" '
                    f'font-size="9" fill="#555">{_e(format_seconds(v))}</text>'
                )
    height = 28 + len(plans) * step
    return f'<svg class="bars" width="{left + width + 70}" height="{height}">{"".join(out)}</svg>'


def _comparison(plan: Mapping[str, Any], shown: str, views: Mapping[str, Any]) -> str:
    plans = list(plan.get("plans", []))
    base = next((p["predicted"]["seconds"] for p in plans if p["name"] == shown), 0.0)
    heads = ["plan", *(["layouts"] if views else []), "predicted", f"vs {shown}", "measured"]
    heads += ["memory predicted", "memory measured", "collectives", "matches HLO"]
    table = _table(heads, "".join(_plan_row(p, shown, base, views) for p in plans))
    skipped = "".join(
        f'<div class="muted">{_e(s.get("name", ""))} skipped: {_e(s.get("why", ""))}</div>'
        for s in plan.get("skipped", [])
    )
    return (
        f"<section><h2>The plans compared</h2>"
        f'<div class="row"><div>{table}{skipped}</div>{_bars(plans)}</div></section>' + _said(plan)
    )


def _said(plan: Mapping[str, Any]) -> str:
    """What the model says of its layout: its annotations' plan against the search's (and the
    collectives they cause that it avoids); the chosen plan's logical axis rules, each with
    the array and op behind it, and the names no rules reconcile."""
    out = ""
    if compared := plan.get("annotations"):
        rows = "".join(_cells([f"{c['count']}× {c['kind']}", "+".join(c["axes"]), c["bytes"],
                               c["source"]]) for c in compared["avoided"])  # fmt: skip
        out += (
            f"<section><h2>Your annotations against the plan</h2><p>{compared['time_ratio']:.2f}"
            f"× the search's predicted time, {compared['memory_ratio']:.2f}× its memory per "
            f"device.{' What they cause that the search avoids:' if rows else ''}</p>"
            + (_table(["collective", "axes", "bytes", "at"], rows) if rows else "")
            + "</section>"
        )
    if made := plan.get("logical_rules"):
        rows = "".join(_cells([name, "not split" if axes is None else spec_text([axes]), array,
                               op]) for name, axes, array, op in made["rules"])  # fmt: skip
        heads = ["logical name", "mesh axes", "first array so named", "first read by"]
        conflicts = "".join(
            f'<div class="muted">conflict: {_e(c)}</div>' for c in made["conflicts"]
        )
        out += f"<section><h2>Logical axis rules for the chosen plan</h2>{_table(heads, rows)}"
        out += f"{conflicts}</section>"
    return out


def _op_row(row: Mapping[str, Any], mesh: Mesh) -> str:
    where = f"{row['op']} at {row.get('source', '')}"
    colls = "".join(
        collective_button(
            c, str(c.get("why", "")), f"{where}, {format_seconds(c.get('seconds', 0))}"
        )
        for c in row.get("collectives", [])
    )
    op = f'<div class="op"><code>{_e(row["op"])}</code></div>'
    op += f'<div class="muted">{_e(row.get("source", ""))} · point {_e(row.get("at", ""))}</div>'
    if row.get("mirrors"):
        op += f'<div class="back">backward of {_e(row["mirrors"])}</div>'
    if int(row.get("repeat", 1)) > 1:
        op += f'<div class="muted">runs ×{_e(row["repeat"])}</div>'
    reads = "".join(array_figure(a, mesh) for a in row.get("inputs", []))
    makes = array_figure(row["output"], mesh)
    share = float(row.get("share", 0.0))
    bar = (
        f'<div class="share"><span style="width:{100 * min(share, 1.0):.1f}%"></span></div>'
        f'<span class="muted">{100 * share:.1f}% · {format_seconds(row.get("seconds", 0.0))}</span>'
    )
    return (
        f'<tr><td>{op}</td><td><div class="arrays">{reads}</div></td>'
        f'<td><div class="arrays">{makes}</div></td><td>{colls or NONE}</td><td>{bar}</td></tr>'
    )


def _ops(report: Mapping[str, Any], mesh: Mesh, title: str = "Op by op") -> str:
    heads = ("op", "reads (on the mesh)", "makes", "collectives", "share of time")
    rows = "".join(_op_row(r, mesh) for r in report.get("rows", []))
    seconds = float(report.get("seconds", 0.0)) or 1.0
    maps, elementwise = report.get("maps_seconds", 0.0), report.get("elementwise_seconds", 0.0)
    rest = (
        f'<p class="muted">The rest of the time: elementwise ops {100 * elementwise / seconds:.1f}%'
        f", layout maps that move no data between devices {100 * maps / seconds:.1f}%.</p>"
    )
    missing = report.get("not_modelled") or []
    if missing:
        rest += (
            f"<p><b>Not modelled</b> (planned whole on each device, costed by the bytes they read "
            f"and write): {_e(', '.join(missing))}</p>"
        )
    return (
        f'<section><h2>{_e(title)}</h2><p class="muted">Each array is drawn on the mesh: one '
        "square per device, coloured by the block it holds (the same colour, the same block).</p>"
        f"{_table(heads, rows, 'ops')}{rest}</section>"
    )


def _plan_views(views: Mapping[str, Any], shown: str, mesh: Mesh) -> str:
    """Each plan's view op by op and its memory, folded (``<details>``) but for ``shown``."""
    out = []
    for k, (name, view) in enumerate(views.items()):
        report = view["report"]
        seconds = format_seconds(float(report.get("seconds", 0.0)))
        body = _ops(report, mesh, f"{name} op by op") + _memory(report.get("memory") or {})
        out.append(
            f'<details id="{_view_id(k)}"{" open" if name == shown else ""}><summary>'
            f"<b>{_e(name)}</b> op by op ({_e(seconds)} predicted)</summary>{body}</details>"
        )
    return "".join(out)


def _memory(memory: Mapping[str, Any]) -> str:
    alive = "".join(_cells([name, format_bytes(size)]) for name, size in held_rows(memory))
    svg = memory_svg(memory.get("points", [0]), memory.get("peak", 0), memory.get("at", 0))
    table = _table(["alive at the peak", "per device"], alive)
    return f'<section><h2>Memory per device</h2><div class="row">{svg}{table}</div></section>'


def program_html(data: Mapping[str, Any], page: bool = True) -> str:
    """The report of a planned program: ``{"plan": ProgramPlan.to_json(), "report":
    ProgramReport.to_json()}`` as one self-contained HTML page; with ``"plans"`` (each plan's
    name → its ``"layouts"``, lines of text, and its ``"report"``) every plan's layouts are
    listed and its name opens its view op by op. With ``page=False``: one element to embed in
    a page (a notebook's output) rather than a whole page."""
    plan, report = data.get("plan") or {}, data["report"]
    mesh = [(str(a), int(n)) for a, n in report["mesh"]]
    shown = str(report.get("plan", plan.get("chosen", "search")))
    views = data.get("plans") or {}
    comparison = _comparison(plan, shown, views) if plan.get("plans") else ""
    body = _program_header(plan, report, mesh) + comparison
    if views:
        body += _plan_views(views, shown, mesh)
    else:
        body += _ops(report, mesh) + _memory(report.get("memory") or {})
    return report_html(f"shardwise: {report.get('program', 'program')} ({shown})", mesh, body, page)
