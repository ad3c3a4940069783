"""What every command shares: simulated devices, how tables and errors are printed (one line
each off a terminal, never a traceback), and equations that begin with ``-``."""

from __future__ import annotations

import functools
import os
import re
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperCommand, TyperGroup, TyperOption

from shardwise._errors import ArgumentError, ShardwiseError, ShardwiseWarning, UserCodeError
from shardwise._files import not_regular, write_atomic
from shardwise._runtime.devices import ENV_CPU_DEVICES
from shardwise.render.formats import FORMATS, Format

DEFAULT_CPU_DEVICES = 8
"""The CLI simulates this many CPU devices unless told otherwise, so every example runs anywhere."""

EXIT_WRONG = 1
"""Exit status when a computation gave a wrong result or failed unexpectedly."""
EXIT_USAGE = 2
"""Exit status for bad input (the message says what to change)."""

REPEAT = 5
"""``--repeat``'s default wherever it counts the timed runs of each thing compared (each
strategy or plan of ``plan --verify``, each runner of ``bench``), of which the median counts."""

Devices = Annotated[
    int | None,
    typer.Option(
        "--devices",
        help=f"Simulated CPU devices where there is no accelerator (default ${ENV_CPU_DEVICES} "
        f"or {DEFAULT_CPU_DEVICES}).",
        min=1,
    ),
]

Json = Annotated[bool, typer.Option("--json", help="Print the result as JSON.")]
"""``--json``, the same in every command: the result as JSON on standard output."""

Formats = Annotated[
    str | None,
    typer.Option(
        "--format",
        help=f"How tables are printed: {', '.join(FORMATS)} (rich boxes, GitHub pipe tables, "
        "or aligned columns with one row per line); default table on a terminal, plain "
        "when piped.",
    ),
]
"""``--format``, the same in every command that prints tables."""

err = Console(stderr=True)
F = TypeVar("F", bound=Callable[..., Any])
V = TypeVar("V")


def _plain_flags(params: list[Any]) -> list[Any]:
    """Show flags (``--json``, ``--help``, ``--dask/--no-dask``) without a value placeholder.

    Typer's rich help prints each option's type (``<bool>``) in a column of its own, from
    ``display_type_rich``, and does so for flags too, although they take no value (its plain
    help leaves flags out). That method returns an option's metavar when one is set, so an
    empty metavar leaves the column blank for a flag and changes nothing else: a flag never
    reads a value, so its metavar appears nowhere but there.
    """
    for param in params:
        if isinstance(param, TyperOption) and param.is_flag and param.metavar is None:
            param.metavar = ""
    return params


def _dash_equations(args: list[str]) -> dict[str, str]:
    """Equations among ``args`` that begin with ``-`` (``"->"``, ``"->i"``), which the parser
    would take for options: each is swapped in place for itself after a space (which no
    option begins with, and which an error message shows as what was given), and the map
    back is returned. An option never holds ``->``, and after ``--`` nothing is read as one,
    so nothing else changes.

    >>> args = ["--shapes", "4", "->", "--", "->"]
    >>> _dash_equations(args), args
    ({' ->': '->'}, ['--shapes', '4', ' ->', '--', '->'])
    """
    back: dict[str, str] = {}
    for k, arg in enumerate(args):
        if arg == "--":
            break
        if arg.startswith("-") and "->" in arg:
            args[k] = " " + arg
            back[args[k]] = arg
    return back


def _put_back(value: Any, back: dict[str, str]) -> Any:
    if isinstance(value, str):
        return back.get(value, value)
    if isinstance(value, list | tuple):
        return type(value)(_put_back(v, back) for v in value)
    return value


class Command(TyperCommand):
    """A ``shardwise`` command: ``--help`` shows flags as flags, and an einsum that begins
    with ``-`` (``shardwise explain "->" …``) is read as the equation, not as an option."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _plain_flags(super().get_params(ctx))

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        args = list(args)
        back = _dash_equations(args)
        rest = super().parse_args(ctx, args)
        if back:
            ctx.params = {k: _put_back(v, back) for k, v in ctx.params.items()}
            rest = _put_back(rest, back)
        return rest


class Group(TyperGroup):
    """The ``shardwise`` group: its own ``--help`` shows flags as flags too, and a usage error
    (an unknown option, a missing value) is one line when standard error is not a terminal."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _plain_flags(super().get_params(ctx))

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        def run(standalone: bool) -> Any:
            return super(Group, self).main(
                args, prog_name, complete_var, standalone, windows_expand_args, **extra
            )

        if not standalone_mode or err.is_terminal:
            return run(standalone_mode)
        try:
            code = run(False)
        except typer.Abort:
            print_error("aborted.")
            sys.exit(1)
        except typer.TyperException as e:  # typer's own click's ClickException and kin
            if type(e).__name__ == "NoArgsIsHelpError":  # help, as typer prints it
                return run(True)
            ctx = getattr(e, "ctx", None)
            hint = f" (see {ctx.command_path} --help)" if ctx is not None else ""
            print_error(getattr(e, "format_message", e.__str__)() + hint)
            sys.exit(getattr(e, "exit_code", EXIT_USAGE))
        sys.exit(code if isinstance(code, int) else 0)


def renamed(command: str, new: str, new_value: V | None, old: str, old_value: V | None) -> V | None:
    """The value of option ``new``, or else of ``old``, its deprecated name in ``command``
    (kept for one release): using ``old`` prints a warning, giving both is an error."""
    if old_value is None:
        return new_value
    if new_value is not None:
        raise ArgumentError(
            f"{command} was given both {new} and {old}, and {old} is the deprecated old name of "
            f"{new}; give {new} only."
        )
    err.print(
        f"[bold yellow]warning:[/] {old} is deprecated for {command}; use {new} "
        "(it will be removed in the next release)",
        highlight=False,
        soft_wrap=True,
    )
    return old_value


def given_options(ctx: typer.Context, names: Sequence[str]) -> list[str]:
    """The options of ``ctx``'s command among ``names`` (their parameters' names) that the
    command line gave, as it writes them (``--train``), in the command's order: an option
    given its default value counts too."""
    return [
        param.opts[0]
        for param in ctx.command.params
        if param.name in names
        and getattr(ctx.get_parameter_source(param.name), "name", None) == "COMMANDLINE"
    ]


def timed(ctx: typer.Context, repeat: int, measured: bool, program: bool) -> None:
    """Refuse ``plan``'s ``--repeat`` given without what it counts the runs of (``--verify``,
    or for a ``program`` ``--tune`` too): nothing would be timed."""
    if measured or not given_options(ctx, ("repeat",)):
        return
    needs = "--verify or --tune" if program else "--verify"
    raise ArgumentError(
        f"--repeat {repeat} counts the timed runs of {needs}, and nothing is timed without "
        f"{'one of them' if program else 'it'}: --repeat needs {needs}; add "
        f"{'one' if program else 'it'}, or drop --repeat."
    )


def console(stderr: bool = False) -> Console:
    """A console for a command's output: off a terminal, lines are never wrapped to a width
    (a pipe into ``grep`` gets each whole)."""
    out = Console(stderr=stderr)
    out.soft_wrap = not out.is_terminal
    return out


def table_format(given: str | None, json: bool = False) -> Format | None:
    """``--format``'s value, checked (``None``: the default for where the output goes), and
    refused beside ``--json`` (which prints no table)."""
    if given is None:
        return None
    if json:
        raise ArgumentError(
            f"--json and --format {given} were both given: --json prints the result as JSON, "
            "and --format says how tables are printed, which JSON has none of; give one."
        )
    for fmt in FORMATS:
        if given == fmt:
            return fmt
    raise ArgumentError(f"--format {given!r} is not one of {', '.join(FORMATS)}.")


def setup_devices(devices: int | None) -> None:
    """Simulate CPU devices before JAX starts: ``--devices``, else the environment, else 8."""
    from shardwise._runtime.devices import use_cpu_devices

    if devices is None:
        raw = os.environ.get(ENV_CPU_DEVICES, "").strip()
        devices = int(raw) if raw.isdigit() else DEFAULT_CPU_DEVICES
    use_cpu_devices(devices)


def friendly_errors(command: F) -> F:
    """Print a :class:`ShardwiseError`'s message and exit 2 (an error in the user's own code
    too, said as theirs); never show a raw traceback."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except UserCodeError as e:  # the user's module or function raised it: theirs to fix
            _stop(f"{e} Set SHARDWISE_DEBUG=1 to see the whole traceback.", EXIT_USAGE)
        except ShardwiseError as e:
            print_error(e.shell)
            raise typer.Exit(EXIT_USAGE) from None
        except (typer.Exit, typer.Abort, KeyboardInterrupt):
            raise
        except Exception as e:  # a bug or a JAX failure: say so plainly
            raised = callback_error(e)
            if raised is not None:  # the user's callback (jax.debug.callback) raised it
                _stop(
                    f"a callback in your function raised {raised} while the program ran "
                    "(jax.debug.callback or jax.pure_callback); fix the callback, or what it "
                    "checks. Set SHARDWISE_DEBUG=1 to see the whole traceback.",
                    EXIT_USAGE,
                )
            _stop(
                f"unexpected {type(e).__name__}: {e}\nThis is a bug in shardwise or a failure "
                "in JAX; please report it with the command you ran. Set SHARDWISE_DEBUG=1 to "
                "see the traceback.",
                EXIT_WRONG,
            )

    return wrapper  # type: ignore[return-value]


def _stop(message: str, code: int) -> NoReturn:
    """Say ``message`` and exit with ``code``; with ``SHARDWISE_DEBUG`` set, raise the
    exception being handled instead, its traceback whole (called from an ``except`` block)."""
    print_error(message)
    if os.environ.get("SHARDWISE_DEBUG"):
        raise  # (the exception its caller handles)
    raise typer.Exit(code) from None


def print_error(message: str) -> None:
    """``error: message`` on standard error: on a terminal in red, wrapped to its width;
    anywhere else (a pipe, a log file) on one line, whatever its length, but for the lines it
    quotes of a launched process's output (``[p1] ...``), each kept on a line of its own."""
    if not err.is_terminal:
        parts = re.split(r"\n(?=\[p\d+\] )", message)
        message = "\n".join([" ".join(parts[0].split()), *(p.rstrip() for p in parts[1:])])
    err.print(
        f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=not err.is_terminal
    )


def print_json(data: Any) -> None:
    """Write ``data`` as JSON to standard output."""
    import json

    sys.stdout.write(json.dumps(data, indent=2) + "\n")


def write_file(path: Path, text: str) -> None:
    """Write a file the user asked for (a report); a path that cannot be written is their
    error, said as such."""
    try:
        write_atomic(path, text, durable=False)
    except OSError as e:
        raise ArgumentError(
            f"cannot write {path}: {e.strerror or e}; give a path in a folder that exists and "
            "that you can write to."
        ) from None


def callback_error(e: BaseException) -> str | None:
    """The exception a Python callback of the user's program raised while it ran, as JAX
    reports it (an ``XlaRuntimeError`` whose text holds the callback's traceback), in words
    (``FloatingPointError: user check failed``); ``None`` for any other error.

    >>> callback_error(RuntimeError("INTERNAL: CpuCallback error calling callback: Traceback"
    ...                             " (most recent call last):\\n  ...\\nValueError: bad x"))
    'ValueError: bad x'
    >>> callback_error(RuntimeError("INTERNAL: out of memory")) is None
    True
    """
    text = str(e)
    if "Callback error" not in text and "callback error" not in text:
        return None
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    found = [line for line in lines if re.match(r"^[A-Za-z_][\w.]*(Error|Exception)\b", line)]
    return found[-1] if found else lines[-1]


def check_plot(path: Path) -> None:
    """Refuse a ``--plot`` path no picture can be written to: a name that is not a PNG's or
    an SVG's, or a folder that does not exist (they had failed after the sweep or the
    benchmark, as a bug)."""
    if path.suffix.lower() not in (".png", ".svg"):
        raise ArgumentError(f"--plot {str(path)!r}: the file's name must end in .png or .svg.")
    if not path.parent.is_dir():
        raise ArgumentError(
            f"--plot {str(path)!r}: the folder {str(path.parent)!r} does not exist; give a "
            "path in a folder that exists."
        )


def check_out(path: Path, flag: str = "--out") -> None:
    """Refuse an output file path that is a folder, a device or a pipe, or no name at all,
    before the work that would fill it."""
    if str(path) in ("", "."):  # (the command line reads '' as '.')
        raise ArgumentError(f"{flag} names no file; give the path of a file.")
    if path.is_dir():
        raise ArgumentError(f"{flag} {str(path)!r} is a folder; give the path of a file in it.")
    kind = not_regular(path)
    if kind is not None:
        raise ArgumentError(f"{flag} {str(path)!r} is {kind}; give the path of a file.")


def show_warnings_plainly() -> None:
    """Print shardwise's own warnings as ``warning: MESSAGE`` on stderr: Python's form names
    the line of shardwise's code that warned, which tells a user of the command nothing.
    Other warnings print as Python prints them.

    >>> python = warnings.showwarning
    >>> show_warnings_plainly()
    >>> warnings.showwarning(ShardwiseWarning("a profile of another mesh"), ShardwiseWarning,
    ...                      "plan.py", 1, file=sys.stdout)
    warning: a profile of another mesh
    >>> warnings.showwarning = python  # (as it was, for what runs after)
    """
    python = warnings.showwarning
    if getattr(python, "plain", False):
        return

    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
             file: Any = None, line: str | None = None) -> None:  # fmt: skip
        if issubclass(category, ShardwiseWarning):
            print(f"warning: {message}", file=sys.stderr if file is None else file)
        else:
            python(message, category, filename, lineno, file, line)

    show.plain = True  # type: ignore[attr-defined]
    warnings.showwarning = show
