"""A report's body wrapped for where it is shown: one element for a page that is someone
else's (a notebook's cell, a docs page), or a whole page of its own (a file)."""

from __future__ import annotations

import html
from collections.abc import Sequence

from shardwise.render.report_css import CSS, PAGE_CSS, ROOT
from shardwise.render.report_js import JS

HINT = "Hover over or click a device to see what it holds; click a collective to see why."


def report_html(title: str, mesh: Sequence[tuple[str, int]], body: str, page: bool) -> str:
    """The report as one element, ``div.shardwise-report``, whose stylesheet styles nothing
    outside it and whose script touches nothing outside it; or, with ``page``, a whole page
    around that element, titled ``title``.

    >>> one = report_html("t", [("x", 2)], "<p>hi</p>", page=False)
    >>> one.startswith('<div class="shardwise-report"><style>'), "<body>" in one
    (True, False)
    >>> report_html("t", [("x", 2)], "<p>hi</p>", page=True).startswith("<!DOCTYPE html>")
    True
    """
    mesh_attr = html.escape(",".join(f"{a}:{n}" for a, n in mesh))
    style = "" if page else f"<style>{CSS}</style>"
    report = (
        f'<div class="{ROOT}">{style}<div class="page"><main>{body}</main><aside>'
        f'<div class="info" data-mesh="{mesh_attr}"><h3>Details</h3>{html.escape(HINT)}</div>'
        f"</aside></div><script>{JS}</script></div>"
    )
    if not page:
        return report
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(title)}</title><style>{PAGE_CSS}\n{CSS}</style></head><body>"
        f"{report}</body></html>"
    )
