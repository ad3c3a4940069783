"""``shardwise launch``: N local processes that form one JAX runtime, and that end together.

Process 0 hosts the coordination service, on ``127.0.0.1:PORT`` unless given another address
(JAX's distributed runtime has no authentication: anyone who can reach the port can join).
Every process gets the ``SHARDWISE_*`` variables that say how to join the runtime
(``shardwise`` commands and Python programs join before they start, see
:func:`command_line`), and ``K`` simulated CPU devices where there is no accelerator.

The launcher watches them all: when one fails or is killed it stops the others at once and
names the process that failed first, with its last lines of standard error; when one
finishes, the others get ``timeout`` seconds to finish too, and one that does not is named
as timed out. A Python process tells the launcher how its program ended as soon as it ends
(:func:`shardwise._runtime.child.run_reported`), before JAX leaves the runtime, so the
process to blame is known even while the runtime's shutdown still waits for the others;
what processes print after that (the native logs of a runtime that lost a process) and
after a failure is kept back unless ``verbose``. Ctrl-C, ``SIGTERM`` and ``SIGHUP`` stop
them all. Each process leads its own process group (stopping it stops what it started),
and ends with the launcher even when that is killed outright: on Linux the kernel sends it
``SIGKILL`` (``PR_SET_PDEATHSIG``); everywhere, Python processes watch a pipe from the
launcher and end their group when it closes (:func:`shardwise._runtime.child.set_up`).
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

from shardwise._errors import DistributedError
from shardwise._runtime.address import bind_error, free_port, join_address, split_address
from shardwise._runtime.distributed import (
    ENV_COORDINATOR,
    ENV_COORDINATOR_BIND,
    ENV_HEARTBEAT_TIMEOUT,
    ENV_NUM_PROCESSES,
    ENV_PROCESS_ID,
)
from shardwise._runtime.ending import (
    Outcome,
    Run,
    judge,
    pump,
    read_reports,
    stop_all,
    stop_processes,
)
from shardwise._runtime.timing import check_seconds

ENV_LAUNCHER_FD = "SHARDWISE_LAUNCHER_FD"
"""The number of a file descriptor each launched process inherits: the read end of a pipe whose
write end only the launcher holds, so it reads end-of-file when the launcher is gone."""

ENV_LAUNCHER_STATUS_FD = "SHARDWISE_LAUNCHER_STATUS_FD"
"""The number of a file descriptor each launched process inherits: the write end of a pipe
to the launcher, on which a Python process writes its program's exit status when the program
ends (before the runtime shuts down)."""

STOP_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)
)
"""Signals to the launcher that stop every process it started."""

_PR_SET_PDEATHSIG = 1


def check_port(port: int, host: str = "127.0.0.1") -> None:
    """Refuse an address whose port is taken or that is not this machine's, before any
    process starts."""
    e = bind_error(host, port)
    if isinstance(e, socket.gaierror):  # (the name, not the port)
        raise DistributedError(
            f"the coordinator's host {host} is not a name this machine can resolve ({e}); "
            "give an address of this machine with --coordinator-address (e.g. 127.0.0.1:PORT)."
        )
    if e is not None:
        what = "is in use" if e.errno == errno.EADDRINUSE else f"cannot be used ({e})"
        raise DistributedError(
            f"port {port} on {host} {what}, so the coordinator cannot listen there; "
            "choose another with --port (or leave --port out to pick a free one), or give "
            "an address of this machine with --coordinator-address."
        )


def coordinator(address: str | None, port: int | None) -> str:
    """Where process 0 hosts the coordinator (listening there only) and the others reach it:
    ``address`` (``HOST:PORT``), else ``127.0.0.1`` and ``port`` (a free one by default)."""
    if address is None:
        host = "127.0.0.1"
        if port is None:
            port = free_port()
        else:
            check_port(port, host)
    else:
        if port is not None:
            raise DistributedError(
                f"--port {port} and --coordinator-address {address} both give the port; "
                "give the port in --coordinator-address only."
            )
        host, port = split_address(address)
        check_port(port, host)
    return join_address(host, port)


MAX_PROCESSES = 1024
"""The most processes :func:`launch` starts on one machine (a count of 10^20 had been taken,
and its processes' environments made until memory ran out)."""

_PYTHON_OPTIONS_WITH_VALUE = ("-W", "-X", "--check-hash-based-pycs")


def command_line(command: Sequence[str]) -> list[str]:
    """What each process runs. ``shardwise …`` runs with this interpreter (the same
    installation); a Python program runs through :mod:`shardwise._runtime.child`, which
    sets up the devices and joins the runtime before the program starts. Anything else runs
    as given (its Python must call ``shardwise.initialize_distributed()``).

    >>> command_line(["python", "-u", "train.py", "--steps", "3"])[1:]
    ['-u', '-m', 'shardwise._runtime.child', 'train.py', '--steps', '3']
    >>> command_line(["python3", "-mpkg.train"])[1:]
    ['-m', 'shardwise._runtime.child', '-m', 'pkg.train']
    """
    if command and command[0] == "shardwise":
        return [sys.executable, "-m", "shardwise", *command[1:]]
    if not command or not _is_python(command[0]):
        return list(command)
    options: list[str] = []
    rest = list(command[1:])
    while rest and rest[0].startswith("-") and rest[0] not in ("-m", "-c", "-"):
        if rest[0][:2] in ("-m", "-c"):  # -mpkg, -cCODE: the option and its value in one
            rest[:1] = [rest[0][:2], rest[0][2:]]
            break
        options.append(rest.pop(0))
        if options[-1] in _PYTHON_OPTIONS_WITH_VALUE and rest:
            options.append(rest.pop(0))
    if not rest or rest[0] == "-":
        return list(command)  # an interactive or piped interpreter: run as given
    return [command[0], *options, "-m", "shardwise._runtime.child", *rest]


def check_python(line: Sequence[str]) -> None:
    """Refuse a Python program whose interpreter cannot import shardwise (another
    installation than this one), before any process starts: each had failed on its own with
    "Error while finding module specification for 'shardwise._runtime.child'"."""
    if "shardwise._runtime.child" not in line or line[0] == sys.executable:
        return
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('shardwise') is None)"
    try:
        found = subprocess.run([line[0], "-c", probe], capture_output=True, timeout=60).returncode
    except (OSError, subprocess.TimeoutExpired) as e:
        raise DistributedError(f"cannot run {line[0]!r}: {e}.") from None
    if found != 0:
        raise DistributedError(
            f"{line[0]!r} cannot import shardwise (it is another Python than the one shardwise "
            f"is installed in); launch the program with {sys.executable}, e.g. shardwise "
            f"launch -n 2 -- {sys.executable} train.py."
        )


def _is_python(program: str) -> bool:
    name = os.path.basename(program)
    return program == sys.executable or name.startswith("python")


def die_with_launcher() -> Callable[[], None] | None:
    """On Linux, a function for ``Popen(preexec_fn=…)`` that has the kernel send the new
    process ``SIGKILL`` when the launcher dies (any program, not only Python); ``None``
    elsewhere, or outside the main thread (the kernel watches the thread that started the
    process, not the whole launcher)."""
    if not sys.platform.startswith("linux"):
        return None
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    parent = os.getpid()

    def arm() -> None:  # runs in the new process, between fork and exec
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:  # the launcher died before the process was armed
            os._exit(137)

    return arm


class _StopSignals:
    """While active (in the main thread), ``SIGINT``, ``SIGTERM`` and ``SIGHUP`` are noted
    in :attr:`signum` instead of ending the launcher, which then stops every process."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._saved: dict[int, Callable[[int, FrameType | None], Any] | int | None] = {}

    def _note(self, signum: int, frame: FrameType | None) -> None:
        self.signum = signum

    def __enter__(self) -> _StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._saved[sig] = signal.signal(sig, self._note)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)


def _spawn(
    argv: list[str],
    envs: list[dict[str, str]],
    all_output: bool,
    stop: _StopSignals,
    watch_fd: int,
    verbose: bool,
) -> Run:
    """Start one process per environment (before any thread: ``preexec_fn`` is safe only
    then), then the threads that relay their output."""
    arm = die_with_launcher()
    shown = [pid == 0 or all_output or verbose for pid in range(len(envs))]
    run = Run([], [], shown, verbose)
    for pid, env in enumerate(envs):
        if stop.signum is not None:
            break
        report, write_end = os.pipe()
        os.set_blocking(report, False)
        extra = {ENV_LAUNCHER_FD: str(watch_fd), ENV_LAUNCHER_STATUS_FD: str(write_end)}
        try:
            proc = subprocess.Popen(
                argv,
                env={**env, **extra},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE if pid == 0 or all_output else subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                process_group=0,
                preexec_fn=arm,
                pass_fds=(watch_fd, write_end),
            )
        except OSError as e:
            os.close(report)
            stop_processes(run.procs)
            raise DistributedError(f"cannot start {argv[0]!r}: {e.strerror or e}.") from None
        finally:
            os.close(write_end)
        run.add(proc, report)
    many = len(envs) > 1
    for pid, proc in enumerate(run.procs):
        run.pumps.append([])
        for stream, out, tagged in (
            (proc.stdout, sys.stdout, all_output),
            (proc.stderr, None, all_output or verbose),
        ):
            if stream is not None:
                prefix = f"[p{pid}] " if tagged and many else ""
                t = threading.Thread(target=pump, args=(stream, out, prefix, run, pid))
                t.daemon = True
                t.start()
                run.pumps[-1].append(t)
    return run


MAX_TIMEOUT_S = 86_400.0
"""The longest ``timeout`` (a day): the heartbeat is a whole number of seconds in JAX's
runtime, and a process silent for longer than a day is lost, not slow."""


def launch(
    command: Sequence[str],
    processes: int,
    devices_per_process: int | None = None,
    port: int | None = None,
    all_output: bool = False,
    timeout: float = 30.0,
    coordinator_address: str | None = None,
    verbose: bool = False,
) -> Outcome:
    """Run ``command`` in ``processes`` local processes joined into one runtime.

    Args:
        command: the program and its arguments (``shardwise demo …`` or any Python program
            that imports shardwise).
        processes: how many processes.
        devices_per_process: simulated CPU devices in each (where there is no accelerator).
        port: the coordinator's port on ``127.0.0.1`` (a free one by default).
        all_output: show every process's output, prefixed ``[pK]``; else process 0's only.
        timeout: seconds the others get to finish after one process ends (then those still
            running are stopped: the launch ends within ``timeout`` and a few seconds of
            the first end), and the heartbeat timeout after which a silent process counts
            as lost.
        coordinator_address: ``HOST:PORT`` where process 0 hosts the coordinator and the
            others reach it, instead of ``127.0.0.1:port``. The runtime has no
            authentication: anyone who can reach this address can join the job.
        verbose: show every process's standard error as it comes, also what processes
            print after their program ended or once the launch is stopping (the native
            crash reports of a runtime that lost a process), which is otherwise held back.
    """
    if not 1 <= processes <= MAX_PROCESSES:
        raise DistributedError(
            f"-n {processes}: give from 1 to {MAX_PROCESSES} processes (one machine's)."
        )
    check_seconds(timeout, "--timeout", 1.0, MAX_TIMEOUT_S)
    if not command:
        raise DistributedError(
            "no command to launch; give one after --, e.g. "
            "shardwise launch -n 2 -- shardwise demo --size small"
        )
    line = command_line(command)
    check_python(line)
    where = coordinator(coordinator_address, port)
    base = {k: v for k, v in os.environ.items() if k != ENV_COORDINATOR_BIND}
    base[ENV_COORDINATOR] = where
    base[ENV_NUM_PROCESSES] = str(processes)
    base[ENV_HEARTBEAT_TIMEOUT] = str(max(int(timeout), 2))
    if devices_per_process is not None:
        base["SHARDWISE_CPU_DEVICES"] = str(devices_per_process)
    envs = [{**base, ENV_PROCESS_ID: str(pid)} for pid in range(processes)]
    envs[0][ENV_COORDINATOR_BIND] = where  # process 0 listens on that address only
    watch, keep = os.pipe()  # ``keep`` stays open here only: it closes when the launcher dies
    try:
        with _StopSignals() as stop:
            try:
                run = _spawn(line, envs, all_output, stop, watch, verbose)
            finally:
                os.close(watch)
            run.reporting = any(m in line for m in ("shardwise._runtime.child", "shardwise"))
            try:
                outcome = _watch(run, timeout, stop)
            except KeyboardInterrupt:  # outside the main thread, Ctrl-C arrives so
                stop_processes(run.procs)
                outcome = Outcome(130, "interrupted: stopped every process")
            finally:
                for fd in run.reports:
                    os.close(fd)
    finally:
        os.close(keep)
    for threads in run.pumps:
        for t in threads:
            t.join(timeout=2)
    return outcome


def _watch(run: Run, timeout: float, stop: _StopSignals) -> Outcome:
    while True:
        if stop.signum is not None:
            stop_all(run)
            why = (
                "interrupted" if stop.signum == signal.SIGINT else signal.Signals(stop.signum).name
            )
            return Outcome(128 + stop.signum, f"{why}: stopped every process")
        now = time.monotonic()
        for k, p in enumerate(run.procs):
            rc = p.poll()
            if rc is not None and k not in run.exits:
                run.exits[k] = (now, rc)
        read_reports(run, now)  # after the exits: what a process reported before exiting
        for k, (t, rc) in run.exits.items():
            if run.ended[k] is None:  # it reported nothing: how it exited is how it ended
                run.ended[k] = (t, rc)
                if run.reporting:
                    run.unreported.add(k)
        outcome = judge(run, timeout, now)
        if outcome is not None:
            return outcome
        time.sleep(0.05)
