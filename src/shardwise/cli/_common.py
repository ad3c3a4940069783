"""What every command shares: simulated devices, and errors printed instead of tracebacks."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperCommand, TyperGroup, TyperOption

from shardwise._errors import ArgumentError, ShardwiseError, UserCodeError
from shardwise._files import write_atomic
from shardwise._runtime.devices import ENV_CPU_DEVICES

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


class Command(TyperCommand):
    """A command whose ``--help`` shows flags as flags (every ``shardwise`` command is one)."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _plain_flags(super().get_params(ctx))


class Group(TyperGroup):
    """The ``shardwise`` group, whose own ``--help`` shows flags as flags too."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _plain_flags(super().get_params(ctx))


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
            err.print(
                f"[bold red]error:[/] {escape(str(e))} Set SHARDWISE_DEBUG=1 to see the "
                "whole traceback.",
                highlight=False,
            )
            if os.environ.get("SHARDWISE_DEBUG"):
                raise
            raise typer.Exit(EXIT_USAGE) from None
        except ShardwiseError as e:
            err.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, markup=True)
            raise typer.Exit(EXIT_USAGE) from None
        except (typer.Exit, typer.Abort, KeyboardInterrupt):
            raise
        except Exception as e:  # a bug or a JAX failure: say so plainly
            err.print(
                f"[bold red]error:[/] unexpected {type(e).__name__}: {escape(str(e))}\n"
                "This is a bug in shardwise or a failure in JAX; please report it with the "
                "command you ran. Set SHARDWISE_DEBUG=1 to see the traceback.",
                highlight=False,
            )
            if os.environ.get("SHARDWISE_DEBUG"):
                raise
            raise typer.Exit(EXIT_WRONG) from None

    return wrapper  # type: ignore[return-value]


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
