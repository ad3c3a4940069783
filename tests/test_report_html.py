"""The self-contained HTML reports, read as text (no browser): nothing external, every array
drawn on the whole mesh with the right blocks, every name escaped, the memory peak labelled."""

from __future__ import annotations

import html
import re
from html.parser import HTMLParser
from typing import Any

import jax
import numpy as np
import pytest

import shardwise
from shardwise._program.models import model
from shardwise.render.explanation import explanation_report
from shardwise.render.report import device_blocks, program_html

MESH = "data=2,model=4"
DEVICES = 8


class Arrays(HTMLParser):
    """Each ``figure.array`` of a page as its device rects: (data-device, fill, title)."""

    def __init__(self) -> None:
        super().__init__()
        self.arrays: list[list[dict[str, str]]] = []
        self.inside = False
        self.title: dict[str, str] | None = None
        self.buttons: list[dict[str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "figure" and "array" in a.get("class", "").split():
            self.arrays.append([])
            self.inside = True
        elif tag == "rect" and a.get("class") == "device":
            assert self.inside, "a device outside any array"
            self.arrays[-1].append({**a, "title": ""})
        elif tag == "title" and self.inside and self.arrays[-1]:
            self.title = self.arrays[-1][-1]
        elif tag == "button" and "coll" in a.get("class", "").split():
            self.buttons.append(a)

    def handle_endtag(self, tag: str) -> None:
        if tag == "figure":
            self.inside = False
        elif tag == "title":
            self.title = None

    def handle_data(self, data: str) -> None:
        if self.title is not None:
            self.title["title"] += data


def parse(page: str) -> Arrays:
    parser = Arrays()
    parser.feed(page)
    return parser


@pytest.fixture(scope="module")
def planned() -> Any:
    fn, args = model("mlp", batch=64, hidden=32, ffn=64, train=True)
    return shardwise.plan(fn, *args, mesh=MESH, profile="cpu-2core", train=True, top=1)


@pytest.fixture(scope="module")
def data(planned: Any) -> dict[str, Any]:
    return {"plan": planned.to_json(), "report": planned.report().to_json()}


@pytest.fixture(scope="module")
def busy(planned: Any) -> dict[str, Any]:
    """The report of the plan with the most collectives (so there is something to click)."""
    reports = [planned.report(p["name"]).to_json() for p in planned.to_json()["plans"]]
    report = max(reports, key=lambda r: sum(len(row["collectives"]) for row in r["rows"]))
    return {"plan": planned.to_json(), "report": report}


def test_the_page_references_nothing_outside_itself(data: dict[str, Any]) -> None:
    page = program_html(data)
    assert page.startswith("<!DOCTYPE html>")
    for needle in ("http://", "https://", "src=", "<link", "url(", "@import", "//cdn"):
        assert needle not in page.lower(), needle
    assert "<style>" in page and "<script>" in page and 'class="info"' in page


def _css_selectors(html_text: str) -> list[str]:
    """Every selector of every rule in the ``<style>`` elements of ``html_text``."""
    selectors = []
    for sheet in re.findall(r"<style>(.*?)</style>", html_text, flags=re.S):
        sheet = re.sub(r"/\*.*?\*/", "", sheet, flags=re.S)
        assert "@" not in sheet, "an @-rule would need its own scoping"
        for rule in sheet.split("}"):
            if rule.strip():
                head, _, _ = rule.partition("{")
                selectors += [s.strip() for s in head.split(",")]
    return selectors


def _notebook_views(planned: Any) -> dict[str, str]:
    explained = shardwise.explain_einsum(
        "nd,nd->n", [(16, 8)] * 2, mesh="x=2,y=4", in_specs=["x,y", "x,y"], out_specs="x"
    )
    return {"program": planned._repr_html_(), "explanation": explained._repr_html_()}


def test_the_notebook_view_is_one_element_whose_css_is_scoped_to_it(planned: Any) -> None:
    for kind, fragment in _notebook_views(planned).items():
        low = fragment.lower()
        for tag in ("!doctype", "html", "head", "body"):
            assert not re.search(rf"<{tag}[\s>]", low), (kind, tag)
        assert fragment.startswith('<div class="shardwise-report">'), kind
        assert fragment.endswith("</div>"), kind
        top = Depth()
        top.feed(fragment)
        assert top.roots == 1, kind
        selectors = _css_selectors(fragment)
        assert len(selectors) > 30, kind
        for selector in selectors:
            assert re.match(r"\.shardwise-report(?![-\w])", selector), (kind, selector)
        assert "document.getElementById" not in fragment, kind


def test_the_saved_page_is_a_whole_page_with_the_same_scoped_report(data: dict[str, Any]) -> None:
    page = program_html(data)
    assert page.startswith("<!DOCTYPE html>") and page.endswith("</body></html>")
    body = page[page.index("<body>") + len("<body>") : -len("</body></html>")]
    assert body.startswith('<div class="shardwise-report">')
    outside = [s for s in _css_selectors(page) if not s.startswith(".shardwise-report")]
    assert outside == ["body"]


class Depth(HTMLParser):
    """Counts the elements at the top level of a fragment."""

    VOID = frozenset({"meta", "br", "img", "input", "link", "hr", "rect", "line", "path"})

    def __init__(self) -> None:
        super().__init__()
        self.depth = 0
        self.roots = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self.VOID:
            return
        if self.depth == 0:
            self.roots += 1
        self.depth += 1

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self.depth == 0:
            self.roots += 1

    def handle_endtag(self, tag: str) -> None:
        if tag not in self.VOID:
            self.depth -= 1


def test_every_array_is_drawn_on_every_device(data: dict[str, Any]) -> None:
    rows = data["report"]["rows"]
    arrays = parse(program_html(data)).arrays
    assert len(arrays) == sum(len(r["inputs"]) + 1 for r in rows)
    for rects in arrays:
        assert [r["data-device"] for r in rects] == [str(k) for k in range(DEVICES)]


def test_each_device_shows_its_block_and_shared_blocks_share_a_colour(
    busy: dict[str, Any],
) -> None:
    mesh = [tuple(m) for m in busy["report"]["mesh"]]
    views = [v for row in busy["report"]["rows"] for v in (*row["inputs"], row["output"])]
    arrays = parse(program_html(busy)).arrays
    for view, rects in zip(views, arrays, strict=True):
        blocks = device_blocks(view["used"], view["shape"], mesh)
        for k, (rect, block) in enumerate(zip(rects, blocks, strict=True)):
            ranges = ", ".join(f"{a}:{b}" for a, b in block)
            held = f"{view['name']}[{ranges}]" if block else f"{view['name']} (scalar)"
            expected = f"device {k}: {held}"
            assert rect["title"].startswith(expected)
        fills = {b: r["fill"] for b, r in zip(blocks, rects, strict=True)}
        assert len(set(fills.values())) == len(set(blocks))
        assert all(fills[b] == r["fill"] for b, r in zip(blocks, rects, strict=True))


def test_blocks_follow_the_spec_over_the_mesh_axes_in_order() -> None:
    mesh = [("data", 2), ("model", 4)]
    split = device_blocks([None, ["data", "model"]], [16, 1024], mesh)
    assert split[3] == ((0, 16), (384, 512)) and split[4] == ((0, 16), (512, 640))
    assert device_blocks([["model", "data"]], [8], mesh)[1] == ((2, 3),)
    assert set(device_blocks([None, None], [4, 4], mesh)) == {((0, 4), (0, 4))}
    assert device_blocks([], [], mesh) == [()] * 8


def test_every_name_and_backward_op_and_collective_is_shown(busy: dict[str, Any]) -> None:
    page = program_html(busy)
    parsed = parse(page)
    whys = [b["data-why"] for b in parsed.buttons]
    for row in busy["report"]["rows"]:
        for view in (*row["inputs"], row["output"]):
            assert html.escape(view["name"]) in page
        if row["mirrors"]:
            assert f"backward of {html.escape(row['mirrors'])}" in page
        for c in row["collectives"]:
            assert c["why"] in whys
    assert len(parsed.buttons) == sum(len(r["collectives"]) for r in busy["report"]["rows"]) > 0


def test_the_plans_are_compared_with_the_shown_one_marked(data: dict[str, Any]) -> None:
    page = program_html(data)
    for p in data["plan"]["plans"]:
        twin = p.get("same_program_as")
        note = f"<br><small>the same program as {html.escape(twin)}</small>" if twin else ""
        assert f">{html.escape(p['name'])}{note}</td>" in page
    assert '<tr class="shown"><td' in page and 'class="bars"' in page


def test_text_is_escaped(data: dict[str, Any]) -> None:
    report = {**data["report"], "program": "<script>alert(1)</script>"}
    rows = [dict(r) for r in report["rows"]]
    rows[0] = {**rows[0], "output": {**rows[0]["output"], "name": "<b>&evil"}}
    page = program_html({"plan": data["plan"], "report": {**report, "rows": rows}})
    assert "<script>alert" not in page and "<b>&evil" not in page
    assert "&lt;b&gt;&amp;evil" in page


def test_the_memory_peak_is_labelled_with_what_is_alive(data: dict[str, Any]) -> None:
    memory = data["report"]["memory"]
    page = program_html(data)
    assert f"peak {memory['peak'] / 2**20:.3g} MiB at point {memory['at']}" in page
    assert re.search(r'<polyline points="([0-9.]+,[0-9.]+ ?)+"', page)
    for item in memory["alive"]:
        assert html.escape(item["name"]) in page


def test_a_verified_plan_shows_measured_time_and_memory(planned: Any) -> None:
    verified = planned.verify(repeat=1)
    plan = verified.to_json()
    page = program_html({"plan": plan, "report": verified.report().to_json()})
    assert all(p.get("verified") for p in plan["plans"])
    table = page[page.index("The plans compared") : page.index("Op by op")]
    cells = re.findall(
        r'<tr(?: class="shown")?><td[^>]*>[^<]*(?:<br><small>[^<]*</small>)?</td>(.*?)</tr>', table
    )
    assert len(cells) == len(plan["plans"])
    for row in cells:
        values = re.findall(r'<td class="n">([^<]*)</td>', row)
        assert "—" not in values[:5] and values[-1] in {"yes", "NO"}


def test_a_two_layer_transformer_report_is_small() -> None:
    fn, args = model(
        "transformer", batch=4, seq=8, hidden=32, ffn=64, heads=4, layers=2, train=True
    )
    p = shardwise.plan(fn, *args, mesh=MESH, profile="cpu-2core", train=True, top=1)
    page = program_html({"plan": p.to_json(), "report": p.report().to_json()})
    assert len(page.encode()) < 2_000_000
    assert all(len(rects) == DEVICES for rects in parse(page).arrays)


def test_an_explanation_names_its_parameters_and_collectives() -> None:
    expl = shardwise.explain(
        lambda tokens, weights: tokens @ weights,
        jax.ShapeDtypeStruct((64, 32), np.float32),
        jax.ShapeDtypeStruct((32, 128), np.float32),
        mesh=MESH,
        in_specs=("data,", ",model"),
    ).to_json()
    named = [{**op, "name": n} for op, n in zip(expl["operands"], ("tokens", "w"), strict=True)]
    page = explanation_report({**expl, "operands": named})
    assert "<b>tokens</b>" in page and "<b>w</b>" in page and "operand 0" not in page
    arrays = parse(page).arrays
    assert len(arrays) == 3 and all(len(rects) == DEVICES for rects in arrays)
    assert arrays[1][3]["title"] == "device 3: w[0:32, 96:128]"
    unnamed = [{k: v for k, v in op.items() if k != "name"} for op in expl["operands"]]
    assert "<b>operand 1</b>" in explanation_report({**expl, "operands": unnamed})
    for needle in ("http://", "https://", "src="):
        assert needle not in page


def test_an_explanation_shows_collective_causes_and_memory() -> None:
    operands = [jax.ShapeDtypeStruct(shape, np.float32) for shape in ((64, 32), (32, 16))]
    expl = shardwise.explain(
        "ab,bc->ac", *operands, mesh=MESH, in_specs=["data,model", "model,"]
    ).to_json()
    page = explanation_report(expl)
    buttons = parse(page).buttons
    causes = [c["cause"]["text"] for c in expl["collectives"]]
    assert [b["data-why"] for b in buttons] == [c.replace("`", "") for c in causes]
    assert buttons and "total bytes" in page


def test_the_explanation_page_shows_index_ranges_the_picture_and_causes_without_backticks():
    """The page says in text what each device holds (the terminal's mesh view), draws the
    data-flow picture, and shows the causes' `names` as code, not as stray backticks."""
    page = shardwise.explain_einsum(
        "nd,nd->n", [(16, 8)] * 2, mesh=MESH, in_specs=["data,model"] * 2, out_specs="data"
    ).to_html()
    assert "`" not in page
    assert "all-reduce over <code>model</code>: contracted index <code>d</code>" in page
    ranges = re.findall(r'<table class="ranges"><tbody>(.*?)</tbody>', page)
    assert len(ranges) == 4  # two operands, the local result and the output
    assert '<tr><td>n 0:8, d 0:2</td><td class="muted">device 0</td></tr>' in ranges[0]
    assert '<td>n 8:16</td><td class="muted">devices 4, 5, 6, 7</td>' in ranges[3]
    assert re.search(r'<h2>Data flow</h2><div class="picture"><svg', page)


def test_without_matplotlib_the_explanation_page_says_how_to_get_the_picture(monkeypatch):
    monkeypatch.setattr("shardwise._extras.available", lambda module: module != "matplotlib")
    page = shardwise.explain_einsum("nd,nd->n", [(16, 8)] * 2, mesh=MESH).to_html()
    assert "pip install 'shardwise[pictures]'" in page and "<svg xmlns" not in page


def test_each_plan_lists_its_layouts_and_opens_its_view_op_by_op(planned: Any) -> None:
    page = planned.to_html()
    plans = planned.to_json()["plans"]
    shown = planned.report().to_json()["plan"]
    for k, p in enumerate(plans):
        target = f"plan-{k}-ops"
        opens = f"document.getElementById('{target}').open=true"
        assert f'<a href="#{target}" onclick="{opens}">{html.escape(p["name"])}</a>' in page
        opened = " open" if p["name"] == shown else ""
        assert f'<details id="{target}"{opened}><summary><b>{html.escape(p["name"])}</b>' in page
        layouts = [f"{n}: {s.describe()}" for n, s in zip(
            planned.graph.names, planned.get(p["name"]).in_specs, strict=True)]  # fmt: skip
        assert "<br>".join(html.escape(line) for line in layouts) in page
    assert page.count("<details") == len(plans) and page.count(" open>") == 1
