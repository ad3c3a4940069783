"""The stylesheet of the HTML reports (inlined into each page: the page needs no network).

Every rule applies only inside the report's root element (``div.shardwise-report``), so a
report shown in a notebook or embedded in another page styles nothing of that page.
"""

from __future__ import annotations

PALETTE = (
    "#8dd3c7",
    "#fdb462",
    "#bebada",
    "#fb8072",
    "#80b1d3",
    "#b3de69",
    "#fccde5",
    "#ffed6f",
    "#bc80bd",
    "#ccebc5",
    "#d9d9d9",
    "#ffffb3",
)
"""Block colours: devices that hold the same block of an array share one (Set3, light enough
for dark device numbers)."""
PREDICTED = "#4e79a7"
"""Bars of predicted time."""
MEASURED = "#f28e2b"
"""Bars of measured time."""

ROOT = "shardwise-report"
"""The class of every report's root element; each rule of :data:`CSS` is scoped under it."""

RULES = """
*{box-sizing:border-box}
body{background:#f4f5f7;color:#1d2330;
 font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif}
.page{display:grid;grid-template-columns:minmax(0,1fr) 300px;gap:18px;padding:20px 24px;
 max-width:1480px;margin:0 auto}
header h1{margin:0 0 6px;font-size:22px}
header h1 small{font-weight:400;color:#5b6475;font-size:15px;margin-left:8px}
.facts{display:flex;flex-wrap:wrap;gap:6px 8px;margin:0;padding:0;list-style:none}
.facts li{background:#fff;border:1px solid #dde1e8;border-radius:14px;padding:2px 10px}
.facts b{color:#5b6475;font-weight:500;margin-right:4px}
section{background:#fff;border:1px solid #dde1e8;border-radius:8px;padding:14px 16px;
 margin-top:16px}
section h2{margin:0 0 10px;font-size:16px}
.row{display:flex;flex-wrap:wrap;gap:18px;align-items:flex-start}
table{border-collapse:collapse}
th,td{padding:4px 9px;text-align:left;vertical-align:top;border-bottom:1px solid #eceef2}
th{font-weight:600;color:#5b6475;font-size:12px;text-transform:uppercase;letter-spacing:.03em}
td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr.shown td{background:#eef4ff;font-weight:600}
.ops td{padding:8px 9px}
.op code{font-size:13px;font-weight:600;white-space:nowrap}
.ops td:first-child{min-width:170px}
.ops td:last-child{white-space:nowrap}
.ops td:nth-child(4){min-width:165px}
.muted{color:#6b7383;font-size:12px}
.back{display:inline-block;background:#f3e8ff;color:#5b2a86;border-radius:4px;padding:0 6px;
 font-size:12px;margin-top:3px}
.arrays{display:flex;flex-wrap:wrap;gap:10px 14px}
.ops .arrays{min-width:150px}
.ops td:nth-child(2) .arrays{min-width:320px}
.array{margin:0;display:inline-flex;flex-direction:column;gap:2px;width:150px}
.array figcaption{font-size:12px;overflow-wrap:anywhere;line-height:1.35}
.array figcaption b{font-size:12.5px}
.device{stroke:#fff;stroke-width:1.5;cursor:pointer}
.device.hl{stroke:#d0021b;stroke-width:3}
svg text{pointer-events:none;font-family:inherit}
.coll{display:block;margin:0 0 4px;border:1px solid #e3a15b;background:#fff7ee;
 border-radius:5px;padding:2px 8px;font:12px/1.4 inherit;cursor:pointer;text-align:left;
 max-width:170px}
.coll.hl{background:#ffdcb8;border-color:#d0021b}
.none{color:#9aa1ad;font-size:12px}
.share{width:90px;height:8px;background:#eceef2;border-radius:4px;overflow:hidden;
 margin-bottom:3px}
.share span{display:block;height:100%;background:#4e79a7}
aside{position:relative}
.info{position:sticky;top:16px;background:#fff;border:1px solid #dde1e8;border-radius:8px;
 padding:12px 14px;font-size:13px;max-height:calc(100vh - 32px);overflow:auto}
.info h3{margin:0 0 6px;font-size:14px}
.info ul{margin:4px 0 0;padding-left:18px}
.info li{overflow-wrap:anywhere;margin-bottom:2px}
.cause{font-size:13px;margin:2px 0 8px 2px}
"""
"""The report's rules as written for a page of its own (``*``, ``body`` and all);
:func:`scoped` turns them into :data:`CSS`."""


def scoped(rules: str, root: str = ROOT) -> str:
    """``rules`` (plain ``selectors{declarations}`` rules, no ``@`` blocks) confined to the
    element of class ``root``: ``body`` and ``html`` become that element, ``*`` it and all
    inside it, any other selector only what is inside it.

    >>> scoped("body{margin:0} *{box-sizing:border-box} th,td{padding:4px}", "r")
    '.r{margin:0}\\n.r,.r *{box-sizing:border-box}\\n.r th,.r td{padding:4px}'
    """
    out = []
    for rule in rules.split("}"):
        if not rule.strip():
            continue
        selectors, brace, body = rule.partition("{")
        if not brace or "@" in selectors or "{" in body:
            raise ValueError(f"cannot scope the CSS rule {rule.strip()!r}: write plain rules")
        parts = []
        for selector in (s.strip() for s in selectors.split(",")):
            if selector in ("body", "html", ":root"):
                parts.append(f".{root}")
            elif selector == "*":
                parts.append(f".{root},.{root} *")
            else:
                parts.append(f".{root} {selector}")
        out.append(",".join(parts) + "{" + body.strip() + "}")
    return "\n".join(out)


CSS = scoped(RULES)
"""The stylesheet inlined into every report: :data:`RULES` scoped under :data:`ROOT`."""

PAGE_CSS = "body{margin:0;background:#f4f5f7}"
"""The one rule of a report saved as a page of its own (``to_html()``, ``--html FILE``): the
page around the report, which its own page may style."""
