"""The documentation's Python examples run as written, and its links lead somewhere.

The pages are docs/**/*.md (the site `make docs` builds) and README.md; docs/examples/ holds
executed notebooks that `make docs` generates, and is not read here.
"""

from __future__ import annotations

import importlib.util
import re
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = ROOT / "README.md"
PAGES = sorted(p for p in DOCS.rglob("*.md") if (DOCS / "examples") not in p.parents)

PYTHON_BLOCK = re.compile(r"^([ \t]*)```python\n(.*?)^\1```", flags=re.S | re.M)
ANY_BLOCK = re.compile(r"^([ \t]*)(```|~~~).*?^\1\2", flags=re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
SNIPPET = re.compile(r'^--8<--\s+"([^"]+)"', flags=re.M)
EXTERNAL = re.compile(r"^([a-z][a-z0-9+.-]*:|//)", flags=re.I)


def page_id(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def hooks() -> ModuleType:
    """docs/hooks.py, which serves pictures from outside docs/ under images/."""
    spec = importlib.util.spec_from_file_location("shardwise_docs_hooks", DOCS / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def python_blocks(text: str) -> list[str]:
    return [textwrap.dedent(body) for _, body in PYTHON_BLOCK.findall(text)]


def links(text: str) -> list[str]:
    """Every link and image target outside code."""
    prose = INLINE_CODE.sub("", ANY_BLOCK.sub("", text))
    return LINK.findall(prose)


def test_pages_found():
    names = {page_id(p) for p in PAGES}
    assert {"docs/index.md", "docs/api.md", "docs/benchmarks.md", "docs/examples.md"} <= names


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_python_blocks_run(page, capsys):
    """A page's ```python blocks run in order, sharing one namespace (8 simulated devices)."""
    namespace: dict[str, object] = {"__name__": "__docs__"}
    for block in python_blocks(page.read_text(encoding="utf-8")):
        exec(compile(block, str(page), "exec"), namespace)
    if page == DOCS / "index.md":  # the tutorial in ten lines shows where its result lives
        assert "NamedSharding" in capsys.readouterr().out


@pytest.mark.parametrize("page", [README, *PAGES], ids=page_id)
def test_relative_links_exist(page):
    """Every relative link and image names a file that exists (anchors are not checked here;
    `mkdocs build --strict` checks them for the site). Pictures under docs/images/ are served
    from benchmarks/ by docs/hooks.py."""
    served = {DOCS / uri: path for uri, path in hooks().pictures().items()}
    missing = []
    for target in links(page.read_text(encoding="utf-8")):
        if EXTERNAL.match(target) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0].split("?", 1)[0]
        resolved = (page.parent / path).resolve()
        if not (resolved.exists() or served.get(resolved, Path("/nonexistent")).exists()):
            missing.append(target)
    assert not missing, f"{page_id(page)} links to files that do not exist: {missing}"


def test_snippets_exist():
    for page in PAGES:
        for name in SNIPPET.findall(page.read_text(encoding="utf-8")):
            assert (ROOT / name).is_file(), f"{page_id(page)} includes {name}, which is missing"


def test_readme_is_short_and_starts_with_python():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; keep it at 200 or fewer"
    first = next(i for i, line in enumerate(lines, 1) if line.strip() == "```python")
    assert first <= 60, f"README.md's first ```python block starts on line {first}, after 60"


def test_api_reference_lists_the_public_api():
    """docs/api.md documents every name that src/shardwise/__init__.pyi makes public."""
    stub = (ROOT / "src" / "shardwise" / "__init__.pyi").read_text(encoding="utf-8")
    public = set(re.findall(r"^from \S+ import \w+ as (\w+)$", stub, flags=re.M))
    documented = set(
        re.findall(r"^::: shardwise\.(\w+)\s*$", (DOCS / "api.md").read_text(), flags=re.M)
    )
    assert public, "no public names found in __init__.pyi"
    assert public <= documented, f"not in docs/api.md: {sorted(public - documented)}"
