"""HTML for Jupyter: the data-flow picture inline, with the text summary beneath."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shardwise._xla.explain import Explanation


def explanation_html(expl: Explanation) -> str:
    """The SVG figure (when matplotlib is installed) and the plain-text summary."""
    from shardwise.render.terminal import to_text

    text = f"<pre>{html.escape(to_text(expl, quiet=True))}</pre>"
    try:
        from shardwise.render.figure import to_svg

        picture = to_svg(expl)
    except ImportError:
        return text
    start = picture.find("<svg")
    return f"<div>{picture[start:]}</div>{text}"
