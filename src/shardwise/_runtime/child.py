"""The entry of each Python process that ``shardwise launch`` starts.

``python -m shardwise._runtime.child SCRIPT ARGS…`` (or ``-m MODULE ARGS…``, or ``-c CODE``)
simulates the CPU devices and joins the runtime that the ``SHARDWISE_*`` variables describe,
then runs the program as ``python`` would, as ``__main__``. ``import shardwise`` itself
changes nothing, so the setting up happens here.
"""

from __future__ import annotations

import runpy
import sys
import types
from collections.abc import Sequence
from pathlib import Path

from shardwise._errors import ShardwiseError
from shardwise._runtime.devices import apply_env
from shardwise._runtime.distributed import join_from_env
from shardwise._runtime.hostmem import keep_freed_memory_warm

USAGE = "usage: python -m shardwise._runtime.child (SCRIPT | -m MODULE | -c CODE) [ARGS…]"


def set_up() -> None:
    """Simulated devices and the runtime, from the environment; exit 2 with the reason if
    the runtime cannot be joined."""
    try:
        apply_env()
        join_from_env(native_stdout_to_stderr=True)
    except ShardwiseError as e:
        sys.stderr.write(f"error: {e}\n")
        raise SystemExit(2) from None


def main(argv: Sequence[str]) -> None:
    """Set up, then run ``argv`` as ``python`` would run it."""
    if not argv or (argv[0] in ("-m", "-c") and len(argv) < 2):
        sys.stderr.write(USAGE + "\n")
        raise SystemExit(2)
    set_up()
    keep_freed_memory_warm()  # as the shardwise command does
    if argv[0] == "-c":
        sys.argv = ["-c", *argv[2:]]
        module = types.ModuleType("__main__")
        sys.modules["__main__"] = module
        exec(compile(argv[1], "<string>", "exec"), module.__dict__)
    elif argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        sys.path[0] = str(Path(argv[0]).resolve().parent)
        runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
