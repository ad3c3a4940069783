"""Tables printed three ways: rich boxes (``table``), GitHub pipe tables (``markdown``) or
whitespace-aligned columns, one row per line (``plain``), and never cut to a width.

Every view is built once as rich renderables (tables, grids of tables, lines of markup); this
module walks that tree for the other two formats, so each command draws its tables once. On a
terminal, ``table`` fits the terminal as rich does; anywhere else (a pipe, a file, a notebook)
each line is as long as its content needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from rich.console import Console

Format = Literal["table", "markdown", "plain"]
"""How tables are printed: rich boxes, GitHub pipe tables, or plain aligned columns."""
FORMATS: tuple[Format, ...] = ("table", "markdown", "plain")
GAP = "  "
"""Between two columns of a ``plain`` table."""
JOIN = "; "
"""Between the lines of one cell in ``plain`` (a row stays one line)."""


@dataclass(frozen=True, slots=True)
class Grid:
    """One table's text: its title, column headers (``None`` when it shows none), rows of
    cells (each a list of lines), whether each column is right-aligned, and its caption."""

    title: str
    headers: tuple[str, ...] | None
    rows: tuple[tuple[tuple[str, ...], ...], ...]
    right: tuple[bool, ...]
    caption: str


Block = str | Grid
"""A piece of a view: lines of text, or a table."""


def _text(value: Any) -> str:
    """Plain text of a cell, title or line (rich markup or ``Text``)."""
    from rich.text import Text

    if value is None:
        return ""
    if isinstance(value, Text):
        return value.plain
    return Text.from_markup(str(value)).plain


def blocks(view: Any) -> list[Block]:
    """``view`` as text and tables, in reading order. A table whose cells are themselves
    renderables (a layout grid) gives its cells' blocks, row by row."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    if isinstance(view, Group):
        return [b for part in view.renderables for b in blocks(part)]
    if isinstance(view, str | Text):
        return [_text(view)]
    if isinstance(view, Table):
        cells = [list(column.cells) for column in view.columns]
        if any(not isinstance(c, str | Text) for column in cells for c in column):
            out: list[Block] = [_text(view.title)] if view.title else []
            for r in range(view.row_count):
                out += [b for column in cells for b in blocks(column[r])]
            return out
        headers = tuple(_text(c.header) for c in view.columns) if view.show_header else None
        rows = tuple(
            tuple(tuple(_text(column[r]).split("\n")) for column in cells)
            for r in range(view.row_count)
        )
        right = tuple(c.justify == "right" for c in view.columns)
        return [Grid(_text(view.title), headers, rows, right, _text(view.caption))]
    if hasattr(view, "__rich__"):
        return blocks(view.__rich__())
    raise TypeError(f"cannot print a {type(view).__name__} as text")


def _plain(grid: Grid) -> list[str]:
    from rich.cells import cell_len

    rows = [[JOIN.join(line for line in cell if line) for cell in row] for row in grid.rows]
    if grid.headers is not None:
        rows.insert(0, list(grid.headers))
    widths = [max((cell_len(r[k]) for r in rows), default=0) for k in range(len(grid.right))]

    def pad(text: str, k: int) -> str:
        space = " " * (widths[k] - cell_len(text))
        return space + text if grid.right[k] else text + space

    lines = [grid.title] if grid.title else []
    lines += [GAP.join(pad(c, k) for k, c in enumerate(r)).rstrip() for r in rows]
    return lines + ([grid.caption] if grid.caption else [])


def _markdown(grid: Grid) -> list[str]:
    def cell(lines: tuple[str, ...] | str) -> str:
        text = "<br>".join(lines) if isinstance(lines, tuple) else lines
        return text.replace("|", "\\|") or " "

    headers = grid.headers if grid.headers is not None else ("",) * len(grid.right)
    rule = ["---:" if r else "---" for r in grid.right]
    lines = [f"**{grid.title}**", ""] if grid.title else []
    lines += [
        "| " + " | ".join(cell(h) for h in headers) + " |",
        "| " + " | ".join(rule) + " |",
    ]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in grid.rows]
    return lines + (["", grid.caption.replace("\n", "  \n")] if grid.caption else [])


def to_text(view: Any, fmt: Format) -> str:
    """``view`` as ``markdown`` or ``plain`` text: every table whole, one row per line.

    >>> from rich.table import Table
    >>> t = Table(title="sizes")
    >>> t.add_column("name"); t.add_column("bytes", justify="right")
    >>> t.add_row("x", "1,024"); t.add_row("weights", "8")
    >>> print(to_text(t, "plain"))
    sizes
    name     bytes
    x        1,024
    weights      8
    >>> print(to_text(t, "markdown"))
    **sizes**
    <BLANKLINE>
    | name | bytes |
    | --- | ---: |
    | x | 1,024 |
    | weights | 8 |
    """
    lines: list[str] = []
    for block in blocks(view):
        if isinstance(block, str):
            lines += block.split("\n")
            continue
        if lines and lines[-1]:
            lines.append("")
        lines += _plain(block) if fmt == "plain" else _markdown(block)
        lines.append("")
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines)


def default_format(console: Console) -> Format:
    """``table`` on a terminal; ``plain`` anywhere else (a pipe into ``grep`` or ``less``, a
    file), where a row on one line, free of box characters, is what tools read."""
    return "table" if console.is_terminal else "plain"


def _whole_titles(view: Any) -> None:
    """Make each table of ``view`` at least as wide as its title and caption, whose lines
    rich would otherwise wrap to the table's width."""
    from rich.cells import cell_len
    from rich.console import Group
    from rich.table import Table

    if isinstance(view, Group):
        for part in view.renderables:
            _whole_titles(part)
    elif isinstance(view, Table):
        lines = [*_text(view.title).split("\n"), *_text(view.caption).split("\n")]
        view.min_width = max(view.min_width or 0, *(cell_len(line) for line in lines))
        for column in view.columns:
            for cell in column.cells:
                _whole_titles(cell)


def show(console: Console, view: Any, fmt: Format | None = None) -> None:
    """Print ``view`` in ``fmt`` (by default :func:`default_format`), never cut: off a
    terminal, a ``table`` is as wide as its widest row, title or caption."""
    fmt = fmt or default_format(console)
    if fmt != "table":
        console.print(to_text(view, fmt), markup=False, highlight=False, soft_wrap=True)
        return
    if console.is_terminal:
        console.print(view)
        return
    _whole_titles(view)
    wide = console.options.update_width(1 << 16)
    width = max(console.width, console.measure(view, options=wide).maximum)
    was = console.width
    console.width = width
    try:
        console.print(view, soft_wrap=True)
    finally:
        console.width = was
