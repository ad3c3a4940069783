"""``shardwise launch``: N local processes that form one JAX runtime, and that end together.

Process 0 hosts the coordination service on ``127.0.0.1:PORT``; every process gets the
``SHARDWISE_*`` variables that say how to join the runtime (``shardwise`` commands and Python
programs join before they start, see :func:`command_line`), and ``K``
simulated CPU devices where there is no accelerator. The launcher watches them all: when
one fails or is killed it stops the others at once and names the lost process; when one
finishes, the others get a bounded time to finish too. Ctrl-C stops them all.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO

from shardwise._errors import DistributedError
from shardwise._runtime.distributed import (
    ENV_COORDINATOR,
    ENV_HEARTBEAT_TIMEOUT,
    ENV_NUM_PROCESSES,
    ENV_PROCESS_ID,
)

NOISE = ("[Gloo]", "peer ranks. Expected number of connected peer ranks")
"""What the native collectives library prints to standard output (from several threads at
once, so its lines can arrive cut and interleaved); lines holding any of it are dropped."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a launch ended: the exit status to return, and why."""

    returncode: int
    message: str


def free_port() -> int:
    """A TCP port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def check_port(port: int) -> None:
    """Refuse a port that is taken, before any process starts."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            raise DistributedError(
                f"port {port} on 127.0.0.1 is in use, so the coordinator cannot listen there; "
                "choose another with --port, or leave --port out to pick a free one."
            ) from None


def _pump(stream: IO[bytes], out: IO[str], prefix: str) -> None:
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace")
        if not any(mark in line for mark in NOISE):
            out.write(prefix + line)
            out.flush()


def _describe(rc: int) -> str:
    if rc < 0:
        try:
            return f"was killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"was killed by signal {-rc}"
    return f"exited with status {rc}"


def _stop(procs: Sequence[subprocess.Popen[bytes]], grace: float = 3.0) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + grace
    for p in procs:
        if p.poll() is None:
            try:
                p.wait(max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


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
        return [sys.executable, "-m", "shardwise.cli", *command[1:]]
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


def _is_python(program: str) -> bool:
    name = os.path.basename(program)
    return program == sys.executable or name.startswith("python")


def launch(
    command: Sequence[str],
    processes: int,
    devices_per_process: int | None = None,
    port: int | None = None,
    all_output: bool = False,
    timeout: float = 30.0,
) -> Outcome:
    """Run ``command`` in ``processes`` local processes joined into one runtime.

    Args:
        command: the program and its arguments (``shardwise demo …`` or any Python program
            that imports shardwise).
        processes: how many processes.
        devices_per_process: simulated CPU devices in each (where there is no accelerator).
        port: the coordinator's port (a free one by default).
        all_output: show every process's output, prefixed ``[pK]``; else process 0's only.
        timeout: seconds the others get to finish after one process ends, and the heartbeat
            timeout after which a silent process counts as lost.
    """
    if processes < 1:
        raise DistributedError(f"-n {processes}: at least one process is needed.")
    if not command:
        raise DistributedError(
            "no command to launch; give one after --, e.g. "
            "shardwise launch -n 2 -- shardwise demo --size small"
        )
    if port is None:
        port = free_port()
    else:
        check_port(port)
    argv = command_line(command)
    procs: list[subprocess.Popen[bytes]] = []
    pumps: list[threading.Thread] = []
    for pid in range(processes):
        env = dict(os.environ)
        env.update(
            {
                ENV_COORDINATOR: f"127.0.0.1:{port}",
                ENV_NUM_PROCESSES: str(processes),
                ENV_PROCESS_ID: str(pid),
                ENV_HEARTBEAT_TIMEOUT: str(max(int(timeout), 2)),
            }
        )
        if devices_per_process is not None:
            env["SHARDWISE_CPU_DEVICES"] = str(devices_per_process)
        shown = pid == 0 or all_output
        try:
            proc = subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE if shown else subprocess.DEVNULL,
                stderr=subprocess.PIPE if shown else subprocess.DEVNULL,
            )
        except OSError as e:
            _stop(procs)
            raise DistributedError(f"cannot start {argv[0]!r}: {e.strerror or e}.") from None
        procs.append(proc)
        if shown:
            prefix = f"[p{pid}] " if all_output and processes > 1 else ""
            for stream, out in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr)):
                assert stream is not None
                t = threading.Thread(target=_pump, args=(stream, out, prefix), daemon=True)
                t.start()
                pumps.append(t)
    try:
        outcome = _watch(procs, timeout)
    except KeyboardInterrupt:
        _stop(procs)
        outcome = Outcome(130, "interrupted: stopped every process")
    for t in pumps:
        t.join(timeout=2)
    return outcome


def _watch(procs: Sequence[subprocess.Popen[bytes]], timeout: float) -> Outcome:
    first_done: float | None = None
    while True:
        codes = [p.poll() for p in procs]
        failed = [(k, rc) for k, rc in enumerate(codes) if rc not in (None, 0)]
        if failed:
            k, rc = failed[0]
            assert rc is not None
            _stop(procs)
            status = 128 - rc if rc < 0 else rc
            return Outcome(status or 1, f"process {k} {_describe(rc)}; stopped the others")
        if all(rc == 0 for rc in codes):
            return Outcome(0, "")
        if any(rc == 0 for rc in codes):
            first_done = first_done or time.monotonic()
            if time.monotonic() - first_done > timeout:
                late = [k for k, rc in enumerate(codes) if rc is None]
                _stop(procs)
                return Outcome(
                    1,
                    f"process {late[0]} did not finish within {timeout:.0f} s of "
                    "the others; stopped it",
                )
        time.sleep(0.05)
