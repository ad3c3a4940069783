"""The self-contained HTML report of one explanation (``Explanation.to_html()``, ``shardwise
explain --html``): each array drawn on the mesh with the index ranges of its blocks, the
data-flow picture, the collectives with their causes, memory and compute per device."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shardwise._model.units import format_bytes
from shardwise.render.report import (
    Mesh,
    _cells,
    _e,
    _header,
    _md,
    _table,
    array_figure,
    collective_button,
    device_blocks,
)
from shardwise.render.report_page import report_html

MEMORY = ("argument", "output", "temp", "alias", "total", "capacity")
"""The memory figures of an explanation, as its JSON names them (``argument_bytes``, …)."""


def _explain_arrays(data: Mapping[str, Any], mesh: Mesh) -> str:
    labels = data.get("device_ids") or None
    terms = _terms(str(data.get("equation") or ""))
    arrays: list[tuple[dict[str, Any], str, str | None]] = []  # (array, index letters, note)
    for k, op in enumerate(data.get("operands", [])):
        letters = terms[k] if k < len(terms) - 1 else ""
        arrays.append(({**op, "name": op.get("name") or f"operand {k}"}, letters, None))
    if data.get("local"):
        local = {**data["local"], "name": "local result"}
        note = f"partial sums over {'+'.join(local.get('partial', []))}"
        arrays.append((local, terms[-1] if terms else "", note))
    outputs = data.get("outputs") or ([data["output"]] if data.get("output") else [])
    for k, out in enumerate(outputs):
        name = out.get("name") or ("output" if len(outputs) == 1 else f"output {k}")
        arrays.append(({**out, "name": name}, terms[-1] if terms else "", None))
    figs = "".join(
        f'<div class="held">{array_figure(arr, mesh, "spec", labels=labels, note=note)}'
        f"{_ranges(arr, letters, mesh, labels)}</div>"
        for arr, letters, note in arrays
    )
    return f'<section><h2>Arrays on the mesh</h2><div class="arrays">{figs}</div></section>'


def _terms(equation: str) -> list[str]:
    """The index letters of each operand, then of the output: ``"nd,nd->n"`` → ``["nd", "nd",
    "n"]``; ``[]`` for a function (no equation)."""
    if "->" not in equation:
        return []
    inputs, output = equation.replace(" ", "").split("->")
    return [*inputs.split(","), output]


def _ranges(arr: Mapping[str, Any], letters: str, mesh: Mesh, labels: Any) -> str:
    """The index ranges of each distinct block of ``arr``, and the devices that hold it."""
    shape = list(arr["shape"])
    if not shape:
        return ""
    names = list(letters) if len(letters) == len(shape) else [f"dim {k}" for k in range(len(shape))]
    holders: dict[tuple[tuple[int, int], ...], list[str]] = {}
    for pos, block in enumerate(device_blocks(arr.get("spec") or [], shape, mesh)):
        holders.setdefault(block, []).append(str(labels[pos] if labels else pos))
    rows = "".join(
        f"<tr><td>{_e(', '.join(f'{n} {a}:{b}' for n, (a, b) in zip(names, block, strict=True)))}"
        f'</td><td class="muted">{"device" if len(who) == 1 else "devices"} {_e(", ".join(who))}'
        "</td></tr>"
        for block, who in holders.items()
    )
    return f'<table class="ranges"><tbody>{rows}</tbody></table>'


def _explain_collectives(data: Mapping[str, Any]) -> str:
    items = []
    for c in data.get("collectives", []):
        why = str((c.get("cause") or {}).get("text", ""))
        where = str(c.get("source") or c.get("hlo_op") or "")
        items.append(
            f"<div>{collective_button(c, why, where)}"
            f'<div class="cause">{_md(why)} <span class="muted">{_e(where)}</span></div></div>'
        )
    body = "".join(items) or '<p class="none">none: every device computes its block alone</p>'
    return f"<section><h2>Collectives (from the compiled HLO) and why</h2>{body}</section>"


def _explain_memory(data: Mapping[str, Any]) -> str:
    memory, compute = data.get("memory") or {}, data.get("compute") or {}
    values = {f"{k} bytes": memory.get(f"{k}_bytes") for k in MEMORY}
    rows = [[k, format_bytes(v)] for k, v in values.items() if v is not None]
    if memory.get("fraction") is not None:
        rows.append(["of capacity", f"{100 * memory['fraction']:.1f}%"])
    if compute.get("flops") is not None:
        rows.append(["flops", f"{compute['flops']:,.0f}"])
    cells = _table(["per device", ""], "".join(_cells(r) for r in rows))
    problems = "".join(f"<li>{_md(p)}</li>" for p in data.get("problems", []))
    problems = f"<h2>Problems</h2><ul>{problems}</ul>" if problems else ""
    return f"<section><h2>Memory and compute per device</h2>{cells}{problems}</section>"


def _picture(svg: str | None) -> str:
    """The data-flow picture (matplotlib's SVG, inlined), or how to get it."""
    if svg is None:
        return (
            '<section><h2>Data flow</h2><p class="muted">The picture of the data flow needs '
            "matplotlib: pip install 'shardwise[pictures]'.</p></section>"
        )
    start = svg.find("<svg")
    return f'<section><h2>Data flow</h2><div class="picture">{svg[max(start, 0) :]}</div></section>'


def explanation_report(
    data: Mapping[str, Any], picture: str | None = None, page: bool = True
) -> str:
    """The report of one explanation (``Explanation.to_json()``) as one self-contained page,
    or (``page=False``) as one element to embed in a page (a notebook's output); ``picture``:
    the data-flow picture as SVG text (:meth:`Explanation.svg`), if drawn."""
    mesh = [(str(a), int(n)) for a, n in dict(data["mesh"]).items()]
    title = str(data.get("equation") or "function")
    facts = [("mode", str(data.get("mode", ""))), ("axes", str(data.get("axis_type", "")))]
    body = _header(title, "explained", facts, mesh) + _explain_arrays(data, mesh)
    body += _picture(picture) + _explain_collectives(data) + _explain_memory(data)
    return report_html(f"shardwise explain: {title}", mesh, body, page)
