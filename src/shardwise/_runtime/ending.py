"""How a launch ends: the launched processes' output relayed (or held back), and which
process to name when one fails first, finishes, or keeps the others waiting.

The launcher (:mod:`shardwise._runtime.launch`) polls :func:`judge`; each Python process
reports its program's exit status as soon as the program ends
(:func:`shardwise._runtime.child.run_reported`), before JAX leaves the runtime, so the
process to blame is known even while the runtime's shutdown still waits for the others.
"""

from __future__ import annotations

import collections
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO

NOISE = ("[Gloo]", "peer ranks. Expected number of connected peer ranks")
"""What the native collectives library prints to standard output (from several threads at
once, so its lines can arrive cut and interleaved); lines holding any of it are dropped."""

PROGRAM_ENDED = "[shardwise launch: the program ended]"
"""The line a launched Python process writes to its standard error when its program has
ended, just before it reports its exit status: what it prints after is the runtime's."""

_LAST_LINES = 12
_KEPT_LINES = 400  # of each process's held-back standard error, to find its last words in

NATIVE = re.compile(
    r"^(?:[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\]"  # a C++ (absl) log line
    r"|\s*@\s+0x[0-9a-f]+"  # a frame of a native stack
    r"|\*\*\* |Fatal Python error|(?:Current thread|Thread) 0x|Extension modules:"
    r"|\s+File \".*\", line \d+ in )"  # Python's fault handler's stack
)
"""The lines of a native crash report: a runtime's C++ log, its stack, Python's fault
handler's dump. They are left out of a process's last words unless ``verbose``."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a launch ended: the exit status to return, and why."""

    returncode: int
    message: str


def pump(stream: IO[bytes], out: IO[str] | None, prefix: str, run: Run, k: int) -> None:
    """Relay process ``k``'s ``stream`` to ``out`` (standard output: ``out`` is ``None`` for
    standard error, whose lines :meth:`Run.err` places)."""
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace")
        if any(mark in line for mark in NOISE):
            continue
        if out is None:
            run.err(k, prefix, line)
        else:
            out.write(prefix + line)
            out.flush()


def _describe(rc: int) -> str:
    if rc < 0:
        try:
            return f"was killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"was killed by signal {-rc}"
    return f"exited with status {rc}"


def _signal_group(proc: subprocess.Popen[bytes], signum: int) -> None:
    """Send ``signum`` to the process group ``proc`` leads (to ``proc`` where it leads none)."""
    try:
        if os.getpgid(proc.pid) == proc.pid:
            os.killpg(proc.pid, signum)
        else:
            proc.send_signal(signum)
    except (ProcessLookupError, PermissionError):
        pass


def stop_processes(procs: Sequence[subprocess.Popen[bytes]], grace: float = 3.0) -> None:
    for p in procs:
        if p.poll() is None:
            _signal_group(p, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for p in procs:
        if p.poll() is None:
            try:
                p.wait(max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                _signal_group(p, signal.SIGKILL)
                p.wait()


@dataclass
class Run:
    """The processes of one launch, what relays their output, and what the launcher knows of
    how each ended."""

    procs: list[subprocess.Popen[bytes]]
    pumps: list[list[threading.Thread]]
    shown: list[bool]
    verbose: bool
    reports: list[int] = field(default_factory=list)
    """Read ends of the pipes on which each process reports its program's exit status."""
    kept: list[collections.deque[tuple[float, bool, str]]] = field(default_factory=list)
    """Each process's standard error that was held back, its last lines: when each came,
    whether after its program ended, and the line."""
    after: list[bool] = field(default_factory=list)
    """Whether each process's program has ended (it wrote :data:`PROGRAM_ENDED`)."""
    held: list[int] = field(default_factory=list)
    """How many lines of each process's standard error were held back."""
    ended: list[tuple[float, int] | None] = field(default_factory=list)
    """When each process's program ended (by the launcher's clock), and its exit status."""
    exits: dict[int, tuple[float, int]] = field(default_factory=dict)
    """When each process that has exited did so, and its return code."""
    stopping: bool = False
    reporting: bool = False
    """Whether the processes are Python programs that report how their program ended."""
    unreported: set[int] = field(default_factory=set)
    """The processes that exited without reporting it (``os._exit``, an ended interpreter)."""
    crashing: set[int] = field(default_factory=set)
    """The processes that began a native crash report once another had exited."""

    def add(self, proc: subprocess.Popen[bytes], report: int) -> None:
        """Watch one more process, which reports its program's end on pipe ``report``."""
        self.procs.append(proc)
        self.reports.append(report)
        self.kept.append(collections.deque(maxlen=_KEPT_LINES))
        self.held.append(0)
        self.after.append(False)
        self.ended.append(None)

    def err(self, k: int, prefix: str, line: str) -> None:
        """A line of process ``k``'s standard error: shown while its program runs (if its
        output is shown), held back once it has ended or the launch is stopping, where it
        would be a runtime's noise about another process, unless ``verbose``."""
        if line.rstrip("\r\n") == PROGRAM_ENDED:
            self.after[k] = True
            return
        if self.reporting and self.exits and NATIVE.match(line):  # a runtime that lost a
            self.crashing.add(k)  # process: its report, and what goes on it, held back here
        if self.verbose or (
            self.shown[k] and not self.stopping and not self.after[k] and k not in self.crashing
        ):
            sys.stderr.write(prefix + line)
            sys.stderr.flush()
        else:  # (its last words, where it is named, leave the report's own lines out)
            self.kept[k].append((time.monotonic(), self.after[k], line))
            self.held[k] += 1


def stop_all(run: Run) -> None:
    """Stop every process, holding back what they print from now on (unless verbose)."""
    run.stopping = True
    stop_processes(run.procs)


def _last_words(run: Run, k: int, mine: bool = True, before: float | None = None) -> str:
    """Process ``k``'s held-back last lines of standard error: those of its program
    (``mine``: not what came after its program ended), those that came ``before`` a time if
    given, and never a native crash report unless verbose; then how many lines were held,
    by every process (all have ended, or been stopped: every pipe reaches its end, and the
    count waits for what is still in them)."""
    for threads in run.pumps:
        for t in threads:
            t.join(timeout=2)
    kept = [
        line.rstrip()
        for when, after, line in run.kept[k]
        if line.strip() and not (mine and after) and (before is None or when <= before)
    ]
    lines = (kept if run.verbose else [x for x in kept if not NATIVE.match(x)])[-_LAST_LINES:]
    text = ". Its last words:\n" + "\n".join(f"[p{k}] {x}" for x in lines) if lines else ""
    held = sum(run.held) - len(lines)
    if not run.verbose and held > 0:
        text += (
            f"\n({held} more lines of standard error held back, such as what the runtime "
            "printed once a process had ended; --verbose shows them)"
        )
    return text


def _blame(run: Run, k: int, rc: int, leaving: bool = False) -> Outcome:
    """Process ``k`` failed first (its program ended with ``rc``, or after it ended, it
    failed ``leaving`` the runtime): stop every process and say so."""
    stop_all(run)
    status = 128 - rc if rc < 0 else rc
    if leaving:
        message = f"process {k} finished its program but {_describe(rc)} leaving the runtime"
    else:
        message = f"process {k} {_describe(rc)}"
    return Outcome(status or 1, f"{message}; stopped the others{_last_words(run, k, not leaving)}")


def _left(run: Run, by: float) -> int | None:
    """The first process that exited with status 0 by ``by`` without reporting its program's
    end (``os._exit``, an ended interpreter), where the processes report it."""
    gone = sorted((run.exits[j][0], j) for j in run.unreported
                  if run.exits[j][1] == 0 and run.exits[j][0] <= by)  # fmt: skip
    return gone[0][1] if gone else None


def _left_early(run: Run, j: int) -> Outcome:
    """Process ``j`` (:func:`_left`) left while the others ran: their collectives waited for
    it, and failed or timed out; it is named, the others stopped."""
    stop_all(run)
    return Outcome(1, f"process {j} exited with status 0 before its program ended (os._exit, "
                   "or its interpreter was ended) while the others still ran; stopped the "
                   f"others{_last_words(run, j)}")  # fmt: skip


def read_reports(run: Run, now: float) -> None:
    """Note the exit status each Python process reported for its program (see
    :func:`shardwise._runtime.child.run_reported`)."""
    for k, fd in enumerate(run.reports):
        if run.ended[k] is not None:
            continue
        try:
            data = os.read(fd, 64)
        except BlockingIOError:
            continue
        except OSError:
            data = b""
        if data.strip().lstrip(b"-").isdigit():
            run.ended[k] = (now, int(data))


def judge(run: Run, timeout: float, now: float) -> Outcome | None:
    """How the launch ends, if it ends now: the program that failed first (named, the
    others stopped), every program done, or those still running after ``timeout``."""
    ended = run.ended
    failed = [(e[0], k, e[1]) for k, e in enumerate(ended) if e is not None and e[1] != 0]
    if failed:
        when, k, rc = min(failed)
        if k in run.unreported and (j := _left(run, when)) is not None:  # (aborted by its
            return _left_early(run, j)  # runtime, not failed by its program: that reports it)
        return _blame(run, k, rc)
    done = [(e[0], k) for k, e in enumerate(ended) if e is not None]
    if len(done) == len(ended):  # every program ended well: the processes leave the runtime
        bad = sorted((t, k, rc) for k, (t, rc) in run.exits.items() if rc != 0)
        if bad:
            return _blame(run, bad[0][1], bad[0][2], leaving=True)
        if len(run.exits) == len(ended):
            return Outcome(0, "")
        if now - max(t for t, _ in done) <= timeout:
            return None
        stuck = [k for k in range(len(ended)) if k not in run.exits]
        stop_all(run)
        return Outcome(
            1,
            f"process {stuck[0]} timed out after {timeout:g} s: it finished its program but "
            "did not leave the runtime; stopped it",
        )
    if not done:
        return None
    first_t, first = min(done)
    # a process that finished and then failed leaving the runtime: JAX's shutdown waits for
    # every process, and gives up when one does not come (the one still running is to blame)
    gave_up = any(rc != 0 for k, (_, rc) in run.exits.items() if ended[k] is not None)
    if now - first_t <= timeout and not gave_up:
        return None
    if (j := _left(run, now)) is not None:  # (the others waited for it until the timeout)
        return _left_early(run, j)
    late = [k for k, e in enumerate(ended) if e is None]
    # its last words are what it printed until now, when it is stopped (on a loaded machine
    # it may print them after the first process has finished), not what stopping it prints
    stop_all(run)
    return Outcome(
        1,
        f"process {late[0]} timed out after {now - first_t:.0f} s: it was still running "
        f"when process {first} had finished (--timeout {timeout:g}); stopped it"
        + _last_words(run, late[0], before=now),
    )
