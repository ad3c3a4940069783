"""The entry of each Python process that ``shardwise launch`` starts.

``python -m shardwise._runtime.child SCRIPT ARGS…`` (or ``-m MODULE ARGS…``, or ``-c CODE``)
simulates the CPU devices and joins the runtime that the ``SHARDWISE_*`` variables describe,
then runs the program as ``python`` would, as ``__main__``. ``import shardwise`` itself
changes nothing, so the setting up happens here. A process started by ``shardwise launch``
also watches the launcher, and ends (with its process group) when the launcher is gone,
and tells it how its program ended as soon as it has (:func:`run_reported`).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import runpy
import signal
import stat
import sys
import threading
import types
from collections.abc import Callable, Sequence
from pathlib import Path

from shardwise._errors import ShardwiseError
from shardwise._runtime.devices import apply_env
from shardwise._runtime.distributed import join_from_env
from shardwise._runtime.ending import PROGRAM_ENDED
from shardwise._runtime.hostmem import keep_freed_memory_warm
from shardwise._runtime.launch import ENV_LAUNCHER_FD, ENV_LAUNCHER_STATUS_FD

USAGE = "usage: python -m shardwise._runtime.child (SCRIPT | -m MODULE | -c CODE) [ARGS…]"


def set_up() -> None:
    """Simulated devices and the runtime, from the environment; exit 2 with the reason if
    the runtime cannot be joined. In a process that ``shardwise launch`` started, first
    :func:`watch_launcher`."""
    watch_launcher()
    report = _report_fd()
    try:
        apply_env()
        join_from_env(native_stdout_to_stderr=True)
    except ShardwiseError as e:
        sys.stderr.write(f"error: {e}\n")
        raise SystemExit(2) from None
    if report is not None:
        # registered after JAX's own exit handlers, so it runs before them: before the
        # runtime's shutdown, which waits for every process
        atexit.register(_report, report)


_STATUS: list[int] = []
"""The exit status of the program :func:`run_reported` ran, once it has ended."""


def _report_fd() -> int | None:
    """The pipe to ``shardwise launch`` on which to report the program's exit status (taken
    out of the environment: the processes this one starts do not report)."""
    fd = _inherited_pipe(ENV_LAUNCHER_STATUS_FD)
    if fd is None:
        return None
    try:
        os.set_inheritable(fd, False)
    except OSError:
        return None
    return fd


def _inherited_pipe(name: str) -> int | None:
    """The pipe from ``shardwise launch`` whose descriptor the environment variable ``name``
    holds, the variable taken out of the environment (the processes this one starts do not
    inherit it); None where there is no such pipe."""
    raw = os.environ.pop(name, "").strip()
    if not raw.isdigit():
        return None
    fd = int(raw)
    try:
        return fd if stat.S_ISFIFO(os.fstat(fd).st_mode) else None
    except OSError:
        return None


def _report(fd: int) -> None:
    """Tell the launcher the program's exit status, once what it printed is out, and mark
    the end of the program's standard error: what follows is the runtime's."""
    if not _STATUS:
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed by the program
            stream.flush()
    try:
        os.write(2, f"{PROGRAM_ENDED}\n".encode())
        os.write(fd, f"{_STATUS[-1]}\n".encode())
        os.close(fd)
    except OSError:
        pass


def run_reported(program: Callable[[], object]) -> None:
    """Run ``program`` and note how it ended, as the exit status it gives the process: a
    process that ``shardwise launch`` started reports it on exit, before JAX leaves the
    runtime (which waits for every process, and may then abort this one), so the launcher
    knows which process failed first, and which finished."""
    try:
        program()
    except SystemExit as e:
        code = e.code
        _STATUS.append(0 if code is None else code if isinstance(code, int) else 1)
        raise
    except KeyboardInterrupt:
        _STATUS.append(128 + signal.SIGINT)
        raise
    except BaseException as e:
        _STATUS.append(1)
        tb = e.__traceback__  # the user's frames, not this module's and runpy's above them
        while tb is not None and tb.tb_frame.f_code.co_filename in _LAUNCHING:
            tb = tb.tb_next
        sys.excepthook(type(e), e.with_traceback(tb), tb)  # (the program's hook, if it set one)
        raise SystemExit(1) from None
    _STATUS.append(0)


_LAUNCHING = frozenset({__file__, runpy.__file__, "<frozen runpy>"})
"""The files whose frames lead to the user's program under ``shardwise launch``."""


def watch_launcher() -> bool:
    """If ``SHARDWISE_LAUNCHER_FD`` names the pipe from ``shardwise launch``, watch it from a
    thread and end this process's group (this process, when it leads none) with ``SIGKILL``
    once the pipe closes: the launcher is gone, even if it was killed outright. Takes the
    variable out of the environment (the processes this one starts do not inherit the pipe);
    returns whether it watches."""
    fd = _inherited_pipe(ENV_LAUNCHER_FD)
    if fd is None:
        return False
    threading.Thread(target=_end_with_launcher, args=(fd,), daemon=True).start()
    return True


def _end_with_launcher(fd: int) -> None:
    try:
        while os.read(fd, 4096):  # the launcher never writes: this returns at end of file
            pass
    except OSError:  # the program closed the descriptor: nothing to watch, nothing to end
        return
    if os.getpgrp() == os.getpid():
        os.killpg(os.getpid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def main(argv: Sequence[str]) -> None:
    """Set up, then run ``argv`` as ``python`` would run it."""
    if not argv or (argv[0] in ("-m", "-c") and len(argv) < 2):
        sys.stderr.write(USAGE + "\n")
        raise SystemExit(2)
    set_up()
    keep_freed_memory_warm()  # as the shardwise command does
    run_reported(lambda: _run(argv))


def _run(argv: Sequence[str]) -> None:
    if argv[0] == "-c":
        sys.argv = ["-c", *argv[2:]]
        module = types.ModuleType("__main__")
        sys.modules["__main__"] = module
        exec(compile(argv[1], "<string>", "exec"), module.__dict__)
    elif argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        script = Path(argv[0]).resolve()
        if not script.exists():  # as python says it (a traceback through runpy had)
            sys.stderr.write(f"python: can't open file {str(script)!r}: no such file\n")
            raise SystemExit(2)
        sys.argv = list(argv)
        sys.path[0] = str(script.parent)
        runpy.run_path(str(script), run_name="__main__")  # (__file__ absolute, as python's)


if __name__ == "__main__":
    main(sys.argv[1:])
