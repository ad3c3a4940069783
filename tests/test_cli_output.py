"""What the commands print where standard output is not a terminal (a pipe, a file, a
notebook; typer's CliRunner is one): whole tables in the format asked for, and errors on one
line that name the flag to change."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from shardwise.cli import app

runner = CliRunner()
PLAN = ["plan", "nd,nd->n", "--shapes", "4000x10000,4000x10000", "--mesh", "x=2,y=4",
        "--profile", "h100"]  # fmt: skip
HEADERS = ("layout", "in specs", "predicted", "memory/device", "collectives (predicted)")
BOX = re.compile("[\u2500-\u257f]")
"""Box-drawing characters (rich's table borders)."""
SWEEP = ["plan", "--model", "mlp", "--mesh", "data=2,model=4", "--profile", "tpu-v5p",
         "--sweep-batch", "256,4096"]  # fmt: skip


def _ok(args: list[str]) -> str:
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return result.stdout


def _header_line(text: str, first: str) -> str:
    return next(line for line in text.splitlines() if first in line)


@pytest.mark.parametrize("fmt", [[], ["--format", "plain"], ["--format", "table"]])
def test_piped_tables_are_whole(fmt: list[str]) -> None:
    text = _ok([*PLAN, *fmt])
    assert not re.search(r"\S…", text)  # rich's mark of a cell cut short
    header = _header_line(text, "layout")
    for head in HEADERS:
        assert head in header, (head, header)
    assert max(len(line) for line in text.splitlines()) > 80  # nothing cut at 80 columns
    title = "nd,nd->n (4000, 10000) · (4000, 10000) float32 on mesh x=2,y=4, profile h100:"
    assert any(line.startswith(title) and "refused" in line for line in text.splitlines())


def test_piped_output_is_plain_by_default_one_row_per_line() -> None:
    text = _ok(PLAN)
    assert not BOX.search(text)
    rows = [line for line in text.splitlines() if re.match(r"\d+\s", line)]
    assert [r.split()[0] for r in rows] == [str(k) for k in range(1, len(rows) + 1)]
    assert all("ms" in r or "µs" in r for r in rows)  # the predicted time is on the row


def test_format_plain_has_no_box_characters() -> None:
    for args in (PLAN, SWEEP):
        text = _ok([*args, "--format", "plain"])
        assert not BOX.search(text)
    header = _header_line(_ok([*SWEEP, "--format", "plain"]), "tokens/device")
    assert header.rstrip().endswith("best tensor-parallel")  # the sweep's right edge


def test_format_table_keeps_the_boxes_at_full_width() -> None:
    text = _ok([*PLAN, "--format", "table"])
    assert re.search(r"┃ #\s+┃ layout\s+┃", text) and "collectives (predicted)" in text
    header = _header_line(_ok([*SWEEP, "--format", "table"]), "tokens/device")
    assert "best tensor-parallel" in header


def test_format_markdown_gives_pipe_tables() -> None:
    text = _ok([*PLAN, "--format", "markdown"])
    lines = text.splitlines()
    head = lines.index(next(line for line in lines if line.startswith("| # | layout |")))
    assert head > 0 and lines[head].endswith("| collectives (predicted) |")
    assert re.fullmatch(r"\| (---:? \| )+", lines[head + 1] + " ")
    assert lines[head + 2].startswith("| 1 | ")
    assert not BOX.search(text)


def test_explain_and_demo_take_every_format() -> None:
    explain = ["explain", "mk,kn->mn", "--shapes", "64x64,64x64", "--mesh", "x=2,y=4",
               "--in", "x,y", "--in", "y"]  # fmt: skip
    md = _ok([*explain, "--format", "markdown"])
    assert "| array | shape | dtype | spec | placements | shard per device |" in md
    assert "| all-reduce | y |" in md
    demo = ["demo", "--size", "small", "--repeat", "1", "--no-dask"]
    text = _ok([*demo, "--format", "table"])
    # a caption line whole, not wrapped inside the table's width
    assert "S1: batch-sharded v1, replicated v2 — nd,nd->n on (8000, 3) · (8000, 3)\n" in text
    plain = _ok([*demo, "--format", "plain"])
    assert re.search(r"^S4\s+x=2,y=4; auto\s+P\(x,y\) P\(x,y\) → P\(x\)", plain, re.M)


def test_a_bad_format_lists_the_formats() -> None:
    result = runner.invoke(app, [*PLAN, "--format", "html"])
    assert result.exit_code == 2
    assert "--format 'html' is not one of table, markdown, plain" in result.stderr


def _one_error_line(result: object) -> str:
    stderr = result.stderr  # type: ignore[attr-defined]
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: ") and not BOX.search(lines[0])
    return str(lines[0])


def test_an_error_is_one_line_with_the_flag_to_give() -> None:
    result = runner.invoke(app, ["explain", "nd,nd->n", "--shapes", "4x4,4x4", "--mesh", "x=4,y=4"])
    assert result.exit_code == 2
    line = _one_error_line(result)
    assert len(line) > 80 and "needs 16 devices" in line
    assert "--devices 16" in line and "use_cpu_devices" not in line


def test_a_usage_error_is_one_line_without_a_panel() -> None:
    result = runner.invoke(app, ["plan", "--fop", "x"])
    assert result.exit_code == 2
    line = _one_error_line(result)
    assert "No such option: --fop" in line and "plan --help" in line


@pytest.mark.parametrize(
    "args",
    [
        ["explain", "->", "--shapes", "4"],
        ["explain", "--shapes", "4", "->"],
        ["explain", "--shapes", "4", "--", "->"],
    ],
)
def test_an_equation_that_begins_with_a_dash_is_read_as_the_equation(args: list[str]) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    line = _one_error_line(result)
    assert "No such option" not in line
    assert line.startswith("error: equation '->'")
