"""Every documented snippet runs as written, on its own, and the documentation's links lead
somewhere.

The pages are README.md and docs/**/*.md (the site `make docs` builds); docs/examples/ holds
executed notebooks that `make docs` generates, and is not read here. Each ```python block runs
alone in a fresh Python in an empty folder; each ```bash block runs as one script there, and
each command of a ```console block (a line starting with `$ `) runs there too, with `shardwise`
and `python` meaning this checkout's. A console command whose shown output starts with
`error:` must fail with exit code 2 and print that error. A block that cannot run here (it
needs a GPU, a cluster, the network or a long benchmark) carries `<!-- skip: why -->` on the
line before it, and is reported as skipped with that reason.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = ROOT / "README.md"
PAGES = sorted(p for p in DOCS.rglob("*.md") if (DOCS / "examples") not in p.parents)

FENCE = re.compile(
    r"^(?P<indent>[ \t]*)(?P<fence>```|~~~)(?P<info>[^\n`]*)\n"
    r"(?P<body>.*?)^(?P=indent)(?P=fence)[ \t]*$",
    flags=re.S | re.M,
)
SKIP = re.compile(r"<!--[ \t]*skip:[ \t]*(?P<why>[^\n]+?)[ \t]*-->[ \t]*\n[ \t]*\Z")
"""``<!-- skip: why -->`` on the line just before a block (matched at the end of the text
before it)."""
ANY_BLOCK = re.compile(r"^([ \t]*)(```|~~~).*?^\1\2", flags=re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
SNIPPET = re.compile(r'^--8<--\s+"([^"]+)"', flags=re.M)
EXTERNAL = re.compile(r"^([a-z][a-z0-9+.-]*:|//)", flags=re.I)
LANGUAGES = {"python": "python", "py": "python", "bash": "bash", "sh": "bash", "shell": "bash"}
LANGUAGES["console"] = "console"
TIMEOUT = 600
"""Seconds one block may take before it counts as failed."""


def page_id(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page."""

    page: Path
    line: int
    info: str
    body: str
    skip: str | None

    @property
    def kind(self) -> str | None:
        """``"python"``, ``"bash"``, ``"console"``, or ``None`` for a block that is not run."""
        return LANGUAGES.get(self.info.split()[0].lower() if self.info.split() else "")

    def __str__(self) -> str:
        return f"{page_id(self.page)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    text = page.read_text(encoding="utf-8")
    found = []
    for m in FENCE.finditer(text):
        skip = SKIP.search(text[: m.start()])
        why = skip.group("why") if skip else None
        body = textwrap.dedent(m.group("body"))
        line = text.count("\n", 0, m.start()) + 1
        found.append(Block(page, line, m.group("info").strip(), body, why))
    return found


BLOCKS = [b for page in [README, *PAGES] for b in blocks(page) if b.kind is not None]


def console_commands(body: str) -> list[tuple[str, str]]:
    """Each ``$ `` command of a console block (continued over lines ending in ``\\``) and the
    output shown under it."""
    out: list[tuple[str, str]] = []
    lines = body.splitlines()
    k = 0
    while k < len(lines):
        if not lines[k].startswith("$ "):
            if out:
                out[-1] = (out[-1][0], out[-1][1] + lines[k] + "\n")
            k += 1
            continue
        command = lines[k][2:]
        while command.endswith("\\") and k + 1 < len(lines):
            k += 1
            command = command[:-1] + lines[k]
        out.append((command, ""))
        k += 1
    return out


def hooks() -> ModuleType:
    """docs/hooks.py, which serves pictures from outside docs/ under images/."""
    spec = importlib.util.spec_from_file_location("shardwise_docs_hooks", DOCS / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def links(text: str) -> list[str]:
    """Every link and image target outside code."""
    prose = INLINE_CODE.sub("", ANY_BLOCK.sub("", text))
    return LINK.findall(prose)


def _environment(folder: Path) -> dict[str, str]:
    """This checkout's shardwise and this Python, first on PATH and the import path, and no
    simulated-device settings from outside (each block says what it needs)."""
    bin_ = folder / ".bin"
    bin_.mkdir()
    for name, run in (("shardwise", "-m shardwise"), ("python", "")):
        script = bin_ / name
        script.write_text(f'#!/bin/sh\nexec "{sys.executable}" {run} "$@"\n')
        script.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "SHARDWISE_CPU_DEVICES")}
    env["XLA_FLAGS"] = "--xla_backend_optimization_level=0"  # (conftest.py's: compiles faster)
    env["PATH"] = f"{bin_}{os.pathsep}{env.get('PATH', '')}"
    path = os.environ.get("PYTHONPATH")
    env["PYTHONPATH"] = str(ROOT / "src") + (os.pathsep + path if path else "")
    env["COLUMNS"] = "100"
    return env


def _run(argv: list[str], folder: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=folder, env=env, capture_output=True, text=True, timeout=TIMEOUT, check=False
    )


def _said(result: subprocess.CompletedProcess[str]) -> str:
    out, err = result.stdout[-3000:], result.stderr[-3000:]
    return f"exit {result.returncode}\n--- stdout\n{out}\n--- stderr\n{err}"


def _words(text: str) -> str:
    return " ".join(text.split())


def test_pages_found():
    names = {page_id(p) for p in PAGES}
    assert {"docs/index.md", "docs/api.md", "docs/benchmarks.md", "docs/examples.md"} <= names
    assert any(b.kind == "console" for b in BLOCKS) and any(b.kind == "bash" for b in BLOCKS)


def test_commands_are_not_hidden_in_untyped_blocks():
    """A block that shows a command says which language it is (```console for a command and
    its output, ```bash for commands), so that it is run here; a block for reading only says
    ```text."""
    untyped = [
        str(b)
        for page in [README, *PAGES]
        for b in blocks(page)
        if not b.info and re.search(r"^(\$ |shardwise |python )", b.body, flags=re.M)
    ]
    assert not untyped, f"blocks with commands but no language: {untyped}"


@pytest.mark.slow
@pytest.mark.parametrize("block", BLOCKS, ids=str)
def test_block_runs_alone(block: Block, tmp_path: Path) -> None:
    """The block runs on its own, in a fresh process in an empty folder."""
    if block.skip is not None:
        pytest.skip(f"{block}: {block.skip}")
    env = _environment(tmp_path)
    if block.kind == "python":
        script = tmp_path / "block.py"
        script.write_text(block.body)
        result = _run([sys.executable, str(script)], tmp_path, env)
        assert result.returncode == 0, f"{block} failed:\n{_said(result)}"
        if block.page in (README, DOCS / "index.md") and "print(s4.sharding)" in block.body:
            assert "NamedSharding" in result.stdout  # the tutorial shows where its result lives
    elif block.kind == "bash":
        result = _run(["bash", "-e", "-o", "pipefail", "-c", block.body], tmp_path, env)
        assert result.returncode == 0, f"{block} failed:\n{_said(result)}"
    else:
        commands = console_commands(block.body)
        assert commands, f"{block} is a console block without a `$ ` command"
        for command, shown in commands:
            result = _run(["bash", "-e", "-o", "pipefail", "-c", command], tmp_path, env)
            if shown.lstrip().startswith("error:"):  # the page shows a refusal: the same one
                assert result.returncode == 2, (
                    f"{block}: `{command}` did not fail:\n{_said(result)}"
                )
                first = _words(shown.split("error:", 1)[1])[:60]
                assert first in _words(result.stderr + result.stdout), (
                    f"{block}: `{command}` said something else than the page:\n{_said(result)}"
                )
            else:
                assert result.returncode == 0, f"{block}: `{command}` failed:\n{_said(result)}"


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
