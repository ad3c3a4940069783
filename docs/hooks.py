"""MkDocs hooks for the documentation site (mkdocs.yml, ``hooks:``).

Pictures: the figures live beside the benchmarks that draw them (``benchmarks/*.png``), and
MkDocs serves only files under ``docs/``; each is added to the site at build time as
``images/<name>``, so nothing is copied into the source tree.

Notebooks: ``make docs`` writes executed copies of the example notebooks to
``docs/examples/`` (``examples/execute.py --out docs/examples``) and mkdocs-jupyter renders
them. Those found there are added to the navigation under Examples and listed on the Examples
page in place of the ``<!-- notebooks -->`` marker; with none there, the page says how to
make them, and the site still builds.

API reference: Sphinx roles in docstrings (``:class:`~shardwise.MiscompileError```) are shown
as code, linked where they name a public name.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
PICTURES = ROOT / "benchmarks"
IMAGES = "images"
NOTEBOOKS = "examples"
MARKER = "<!-- notebooks -->"
EXAMPLES_PAGE = "examples.md"
API_PAGE = "api.md"
STUB = ROOT / "src" / "shardwise" / "__init__.pyi"
# a Sphinx role left in a docstring, as mkdocstrings renders it: :class:<code>~shardwise.X</code>
ROLE = re.compile(r":(?:class|func|meth|attr|mod|data|exc|obj):<code>(~?)([\w.]+)</code>")


def pictures() -> dict[str, Path]:
    """Each picture the site serves from outside ``docs/``: its path in the site → its file."""
    return {f"{IMAGES}/{path.name}": path for path in sorted(PICTURES.glob("*.png"))}


def notebooks() -> list[Path]:
    """The executed notebooks under ``docs/examples/``: the tutorial first, then by name."""
    found = (DOCS / NOTEBOOKS).glob("*.ipynb")
    return sorted(found, key=lambda path: (path.stem != "tutorial", path.name))


def notebook_title(path: Path) -> str:
    """A notebook's first Markdown heading, or its name."""
    try:
        cells = json.loads(path.read_text(encoding="utf-8")).get("cells", [])
    except (OSError, ValueError):
        cells = []
    for cell in cells:
        if cell.get("cell_type") != "markdown":
            continue
        source = cell.get("source", "")
        text = "".join(source) if isinstance(source, list) else str(source)
        for line in text.splitlines():
            if line.startswith("#"):
                return line.lstrip("#").strip()
    return path.stem.replace("_", " ").replace("-", " ")


def on_config(config: Any) -> Any:
    """Add the executed notebooks to the Examples section of the navigation."""
    found = notebooks()
    if not found or not config.nav:
        return config
    entries = [{notebook_title(path): f"{NOTEBOOKS}/{path.name}"} for path in found]
    for item in config.nav:
        section = item.get("Examples") if isinstance(item, dict) else None
        if isinstance(section, list):
            section.extend(entry for entry in entries if entry not in section)
    return config


def on_files(files: Any, config: Any) -> Any:
    """Serve the pictures from ``benchmarks/`` as ``images/<name>``."""
    from mkdocs.structure.files import File

    for uri, path in pictures().items():
        if files.get_file_from_path(uri) is None:
            files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """List the notebooks on the Examples page."""
    if page.file.src_uri != EXAMPLES_PAGE or MARKER not in markdown:
        return markdown
    found = notebooks()
    if found:
        listing = "\n".join(
            f"- [{notebook_title(path)}]({NOTEBOOKS}/{path.name})" for path in found
        )
    else:
        listing = (
            "*No executed notebooks in this build of the site: `make docs` executes them into "
            "`docs/examples/` first.*"
        )
    return markdown.replace(MARKER, listing)


def public_names() -> set[str]:
    """The names ``import shardwise`` offers, as ``__init__.pyi`` lists them."""
    return set(re.findall(r"^from \S+ import \w+ as (\w+)$", STUB.read_text(), flags=re.M))


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    """On the API reference, show the Sphinx roles some docstrings use (``:class:`~x.Y```) as
    code, linked where they name a public name."""
    if page.file.src_uri != API_PAGE:
        return html
    public = public_names()

    def role(match: re.Match[str]) -> str:
        short, target = match.groups()
        name = target.rsplit(".", 1)[-1]
        shown = name if short else target
        if name in public and target in (name, f"shardwise.{name}"):
            return f'<a href="#shardwise.{name}"><code>{shown}</code></a>'
        return f"<code>{shown}</code>"

    return ROLE.sub(role, html)
