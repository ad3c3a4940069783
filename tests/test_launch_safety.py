"""`shardwise launch` is safe to run: its coordinator listens on loopback only, its processes
end with it however it ends, and wrong set-ups are clear errors (exit 2), not native aborts."""

from __future__ import annotations

import collections
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import shardwise
from shardwise._runtime import distributed, launch

ENV = {k: v for k, v in os.environ.items() if not k.startswith("SHARDWISE_")}
LAUNCH = [sys.executable, "-m", "shardwise", "launch"]
LINUX = sys.platform.startswith("linux")
DEMO = ["shardwise", "demo", "--size", "small", "--no-dask"]

# prints the addresses the coordinator's port listens on (from /proc/net/tcp*), then the
# variables this process was given
WHERE = """
import os
port = int(os.environ["SHARDWISE_COORDINATOR"].rsplit(":", 1)[1])
found = []
for name in ("/proc/net/tcp", "/proc/net/tcp6"):
    for line in open(name).read().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
            found.append(local.rsplit(":", 1)[0])
print(" ".join(found))
print(os.environ["SHARDWISE_COORDINATOR"], os.environ.get("SHARDWISE_COORDINATOR_BIND"))
"""

# /proc/net/tcp* spell 127.0.0.K as 0K00007F (IPv4) or ::ffff:127.0.0.K (IPv6)
LOOPBACK = {"0100007F", "0000000000000000FFFF00000100007F"}


def _run(args: list[str], timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env={**ENV, **env})


def _text(result: subprocess.CompletedProcess[str]) -> str:
    return " ".join(result.stderr.split())


# --- 7: where the coordinator listens -------------------------------------------------------


@pytest.mark.skipif(not LINUX, reason="reads /proc/net/tcp")
def test_the_coordinator_listens_on_loopback_only(tmp_path):
    script = tmp_path / "where.py"
    script.write_text(WHERE)
    result = _run(
        [*LAUNCH, "-n", "1", "--devices-per-process", "1", "--", sys.executable, str(script)]
    )
    assert result.returncode == 0, result.stderr
    found, given = result.stdout.strip().splitlines()[-2:]
    assert found.split() and set(found.split()) <= LOOPBACK, found  # not 0.0.0.0 or ::
    address, bind = given.split()
    assert address.startswith("127.0.0.1:") and bind == address


@pytest.mark.skipif(not LINUX, reason="reads /proc/net/tcp; 127.0.0.2 is loopback on Linux")
def test_the_coordinator_listens_where_it_is_told(tmp_path):
    script = tmp_path / "where.py"
    script.write_text(WHERE)
    with socket.socket() as s:
        s.bind(("127.0.0.2", 0))
        port = s.getsockname()[1]
    args = ["--coordinator-address", f"127.0.0.2:{port}", "--", sys.executable, str(script)]
    result = _run([*LAUNCH, "-n", "1", "--devices-per-process", "1", *args])
    assert result.returncode == 0, result.stderr
    found, given = result.stdout.strip().splitlines()[-2:]
    assert found.split() == ["0000000000000000FFFF00000200007F"] or found.split() == ["0200007F"]
    assert given.split() == [f"127.0.0.2:{port}"] * 2


def test_help_and_docstrings_say_there_is_no_authentication():
    result = _run([*LAUNCH, "--help"], COLUMNS="200")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    assert "--coordinator-address" in text and "No authentication" in text
    assert "127.0.0.1" in text
    for doc in (launch.__doc__, distributed.__doc__, shardwise.initialize_distributed.__doc__):
        assert doc and "no authentication" in " ".join(doc.split())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--coordinator-address", "nowhere"], "'nowhere' is not HOST:PORT"),
        (["--coordinator-address", "127.0.0.1:99999"], "is not HOST:PORT"),
        (["--coordinator-address", "127.0.0.1:1234", "--port", "1234"], "both give the port"),
        # (a count of 10^20 had been taken: its processes' environments filled the memory)
        (["-n", "99999999999999999999"], "less than or equal to 1024"),
    ],
)
def test_a_wrong_coordinator_address_is_refused(args, message):
    result = _run([*LAUNCH, "-n", "2", *args, "--", "true"], timeout=60)
    assert result.returncode == 2
    assert message in _text(result) and "Traceback" not in result.stderr


def test_a_python_without_shardwise_is_refused_before_any_process_starts(tmp_path):
    # each process had failed on its own ("Error while finding module specification for
    # 'shardwise._runtime.child'"), and the launch with "process 0 exited with status 1"
    other = tmp_path / "python3"
    other.write_text("#!/bin/sh\nexit 1\n")
    other.chmod(0o755)
    result = _run([*LAUNCH, "-n", "2", "--", str(other), "-c", "print(1)"], timeout=60)
    assert result.returncode == 2
    assert "cannot import shardwise" in _text(result) and sys.executable in _text(result)


# --- 8: the processes end with the launcher -------------------------------------------------


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def _wait_for_pids(folder: Path, count: int, launcher: subprocess.Popen[bytes]) -> list[int]:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        # only the finished files: each child writes pid.N.tmp and renames it, so a .tmp seen
        # here may be gone by the time it is read
        files = sorted(f for f in folder.glob("pid.*") if f.suffix != ".tmp")
        if len(files) == count:
            return [int(x) for f in files for x in f.read_text().split()]
        assert launcher.poll() is None, launcher.communicate()
        time.sleep(0.1)
    raise AssertionError(f"the launched processes did not start: {list(folder.iterdir())}")


def _gone_within(pids: list[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while (alive := [p for p in pids if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


def _start(
    argv: list[str], folder: Path, started: list[int], stderr: int = subprocess.DEVNULL
) -> tuple[subprocess.Popen[bytes], list[int]]:
    """Start ``argv`` (a launcher of 2 processes that write their pids into ``folder``) and
    return it with the pids, all noted in ``started``."""
    launcher = subprocess.Popen(argv, env=ENV, stdout=subprocess.DEVNULL, stderr=stderr)
    started.append(launcher.pid)
    pids = _wait_for_pids(folder, 2, launcher)
    started.extend(pids)
    return launcher, pids


@pytest.fixture
def started() -> Iterator[list[int]]:
    """Pids a test started: whatever is left of them at the end is killed."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


# each process (and, with `&`, a process it starts) sleeps; pid.K holds their pids
PIDS = 'f="$0/pid.$SHARDWISE_PROCESS_ID"; echo "$@" > "$f.tmp"; mv "$f.tmp" "$f"'
SLEEPERS = f"sleep 60 & set -- $$ $!; {PIDS}; wait"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_signal_to_the_launcher_ends_every_process(tmp_path, started, signum):
    argv = [*LAUNCH, "-n", "2", "--", "sh", "-c", SLEEPERS, str(tmp_path)]
    launcher, pids = _start(argv, tmp_path, started, stderr=subprocess.PIPE)
    launcher.send_signal(signum)
    _, err = launcher.communicate(timeout=10)
    assert launcher.returncode == 128 + signum
    assert f"{signal.Signals(signum).name}: stopped every process" in err.decode()
    assert _gone_within(pids, 5) == []  # the processes and what they started


@pytest.mark.skipif(not LINUX, reason="the kernel's parent-death signal is Linux's")
def test_killing_the_launcher_outright_ends_any_command(tmp_path, started):
    # not Python: the kernel ends it when the launcher dies (PR_SET_PDEATHSIG)
    script = f"set -- $$; {PIDS}; exec sleep 60"
    argv = [*LAUNCH, "-n", "2", "--", "sh", "-c", script, str(tmp_path)]
    launcher, pids = _start(argv, tmp_path, started)
    launcher.kill()
    launcher.wait(timeout=10)
    assert _gone_within(pids, 5) == []


# a launcher without the parent-death signal, as where prctl does not exist: Python processes
# still end (with what they started) when the pipe from the launcher closes
WITHOUT_PRCTL = """
import sys
from shardwise._runtime import launch
launch.die_with_launcher = lambda: None
program = '''
import os, subprocess, sys, time
folder = sys.argv[1]
sleeper = subprocess.Popen(["sleep", "60"])
name = os.path.join(folder, "pid." + os.environ["SHARDWISE_PROCESS_ID"])
with open(name + ".tmp", "w") as f:
    f.write(f"{os.getpid()} {sleeper.pid}")
os.rename(name + ".tmp", name)
time.sleep(60)
'''
outcome = launch.launch([sys.executable, "-c", program, sys.argv[1]], 2, 1)
raise SystemExit(outcome.returncode)
"""


def test_killing_the_launcher_outright_ends_python_programs_everywhere(tmp_path, started):
    argv = [sys.executable, "-c", textwrap.dedent(WITHOUT_PRCTL), str(tmp_path)]
    launcher, pids = _start(argv, tmp_path, started)
    launcher.kill()
    launcher.wait(timeout=10)
    assert _gone_within(pids, 5) == []


# --- 9: clear errors, exit 2 ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("per_process", "message"),
    [
        (2, "run on 8 devices (a line of 8 and a 2 × 4 grid), but 6 are"),  # 3 × 2: too few
        (4, "so process 2 holds none of them"),  # 3 × 4: the 8-device mesh leaves process 2 out
    ],
)
def test_three_processes_that_do_not_fit_the_mesh_are_a_clear_error(per_process, message):
    start = time.monotonic()
    result = _run(
        [*LAUNCH, "-n", "3", "--devices-per-process", str(per_process), "--", *DEMO],
    )
    assert time.monotonic() - start < 60
    assert result.returncode == 2, result.stderr
    text = _text(result)
    assert message in text and "unexpected" not in text and "Traceback" not in text


def _fake_coordinator(answer: bytes | None) -> tuple[socket.socket, list[socket.socket]]:
    """A plain TCP listener: it sends ``answer`` to whoever connects, or keeps silent."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    held: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            held.append(conn)
            if answer is not None:
                conn.sendall(answer)

    threading.Thread(target=serve, daemon=True).start()
    return server, held


@pytest.mark.parametrize(
    ("answer", "said"),
    [(None, "kept silent"), (b"SSH-2.0-OpenSSH_9.6\r\n", "answered b'SSH-2.0-O'")],
)
def test_a_port_that_is_not_a_coordinator_is_a_clear_error(answer, said):
    server, held = _fake_coordinator(answer)
    port = server.getsockname()[1]
    start = time.monotonic()
    try:
        result = _run(
            [sys.executable, "-m", "shardwise", "demo", "--size", "small"],
            timeout=60,
            SHARDWISE_COORDINATOR=f"127.0.0.1:{port}",
            SHARDWISE_NUM_PROCESSES="2",
            SHARDWISE_PROCESS_ID="1",
        )
    finally:
        server.close()
        for conn in held:
            conn.close()
    assert time.monotonic() - start < 30
    assert result.returncode == 2, result.stderr  # JAX itself would abort (status 134)
    text = _text(result)
    assert f"coordinator 127.0.0.1:{port} is not JAX's coordinator" in text
    assert said in text and "Traceback" not in text


def test_a_hidden_process_that_fails_says_why():
    script = (
        'if [ "$SHARDWISE_PROCESS_ID" = 1 ]; then echo "error: [b]p1[/b] broke" >&2; exit 3; fi; '
        "exec sleep 30"
    )
    start = time.monotonic()
    result = _run([*LAUNCH, "-n", "2", "--", "sh", "-c", script], timeout=60)
    assert time.monotonic() - start < 20
    assert result.returncode == 3
    assert "process 1 exited with status 3" in result.stderr
    assert "[p1] error: [b]p1[/b] broke" in result.stderr  # shown as written, not as markup


# --- the process that failed first is named, and the launch honours --timeout ----------------

# Python programs, joined into one runtime before their first line: process 1 ends at once
# with status 3 while process 0 waits (JAX's runtime then aborts process 0), or process 1
# hangs while process 0 finishes (JAX's shutdown then waits for it, and aborts process 0)
EXITS = """
import os, sys, time
if os.environ["SHARDWISE_PROCESS_ID"] == "1":
    print("p1: no data to read", file=sys.stderr)
    sys.exit(3)
time.sleep(300)
"""
HANGS = """
import os, sys, time
if os.environ["SHARDWISE_PROCESS_ID"] == "1":
    print("p1: waiting for a lock", file=sys.stderr, flush=True)
    time.sleep(600)
"""
NATIVE_DUMP = ("SIGABRT", "Check failure", "Fatal Python error", "coordination_service")


def _launch_python(tmp_path: Path, program: str, *options: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "program.py"
    script.write_text(program)
    args = ["-n", "2", "--devices-per-process", "1", "--timeout", "5", *options]
    return _run([*LAUNCH, *args, "--", sys.executable, str(script)], timeout=300)


def test_the_process_that_failed_first_is_named_not_the_one_the_runtime_aborted(tmp_path):
    result = _launch_python(tmp_path, EXITS)
    text = _text(result)
    assert result.returncode == 3, result.stderr
    assert "error: process 1 exited with status 3; stopped the others" in text
    assert "[p1] p1: no data to read" in text and "process 0" not in text
    assert not [mark for mark in NATIVE_DUMP if mark in result.stderr], result.stderr
    assert "--verbose shows them" in text


LEAVES = """
import os, time
from jax.experimental import multihost_utils
if os.environ["SHARDWISE_PROCESS_ID"] == "1":
    time.sleep(1)
    os._exit(0)
multihost_utils.sync_global_devices("waits for process 1")
"""


def test_a_process_that_leaves_with_os_exit_is_named_not_the_one_left_waiting(tmp_path):
    """Process 1 leaves with ``os._exit(0)`` (no report of its program's end) while process 0
    waits for it in a collective, which the runtime then aborts: the launcher had blamed
    process 0 (killed by SIGABRT) and shown the runtime's native crash report."""
    result = _launch_python(tmp_path, LEAVES)
    text = _text(result)
    assert result.returncode == 1, result.stderr
    assert "error: process 1 exited with status 0 before its program ended" in text, text
    assert "process 0 was killed" not in text
    assert not [mark for mark in NATIVE_DUMP if mark in result.stderr], result.stderr
    assert "The tasks have crashed" not in text


@pytest.mark.parametrize("then", ["aborted", "timed out"])
def test_the_process_that_left_first_is_named_whatever_the_others_then_do(then):
    """How the others end once one left with ``os._exit`` depends on the machine's load: the
    runtime aborts them, or they are still waiting when the timeout comes. Either way the
    one that left is named."""
    from shardwise._runtime.ending import Run, judge

    run = Run([], [], [True, False], False, reporting=True)
    run.ended, run.after, run.kept, run.held = [None, None], [False, False], [[], []], [0, 0]
    run.exits = {1: (10.0, 0)}
    run.ended[1], run.unreported = (10.0, 0), {1}  # (as _watch marks an exit with no report)
    if then == "aborted":  # (by its runtime: it reports nothing, as a failed program does)
        run.exits[0] = (12.0, -6)
        run.ended[0] = (12.0, -6)
        run.unreported.add(0)
    outcome = judge(run, timeout=5.0, now=16.0)
    assert outcome is not None and outcome.returncode == 1
    assert outcome.message.startswith("process 1 exited with status 0 before its program ended")


def test_a_program_that_fails_after_another_left_is_named_with_its_own_error():
    """Where the process still running fails by its own program (it reports that), it is the
    one named, not the one that left before it (review)."""
    from shardwise._runtime.ending import Run, judge

    run = Run([], [], [True, False], False, reporting=True)
    run.ended, run.after, run.kept, run.held = [None, None], [False, False], [[], []], [0, 0]
    run.exits = {1: (10.0, 0), 0: (12.0, 1)}
    run.ended = [(11.0, 1), (10.0, 0)]  # (process 0 reported its program's status 1)
    run.unreported = {1}
    outcome = judge(run, timeout=5.0, now=13.0)
    assert outcome is not None and outcome.message.startswith("process 0 exited with status 1")


def test_a_hung_process_times_out_and_is_named(tmp_path):
    # the program sleeps 600 s: that the launch ends at all (within _run's 300 s) is the
    # --timeout at work; its bound is not asserted, the machine may be loaded
    result = _launch_python(tmp_path, HANGS)
    text = _text(result)
    assert result.returncode == 1, result.stderr
    assert "error: process 1 timed out after" in text and "(--timeout 5); stopped it" in text
    assert "still running when process 0 had finished" in text
    assert "[p1] p1: waiting for a lock" in text
    assert not [mark for mark in NATIVE_DUMP if mark in result.stderr], result.stderr


# process 0 says so when it is stopped; process 1 fails once process 0 is ready to say it
STOPPED = (
    'if [ "$SHARDWISE_PROCESS_ID" = 1 ]; then while [ ! -e "$0/ready" ]; do sleep 0.05; done; '
    "exit 3; fi; "
    "trap 'echo p0 was stopped >&2; exit 1' TERM; touch \"$0/ready\"; sleep 60 & wait"
)


@pytest.mark.parametrize("verbose", [False, True], ids=["quiet", "verbose"])
def test_what_the_others_print_once_one_failed_is_held_back_unless_verbose(tmp_path, verbose):
    options = ["--verbose"] if verbose else []
    argv = [*LAUNCH, "-n", "2", *options, "--", "sh", "-c", STOPPED, str(tmp_path)]
    result = _run(argv, timeout=60)
    text = _text(result)
    assert result.returncode == 3, result.stderr
    assert "process 1 exited with status 3" in text
    assert ("p0 was stopped" in text) == verbose
    assert ("1 more lines of standard error held back" in text) != verbose


@pytest.mark.parametrize("reporting", [False, True], ids=["any command", "python"])
def test_a_native_log_line_after_an_exit_holds_back_only_a_reporting_processs_report(
    capsys, reporting
):
    """Once a process has exited, a runtime's crash report from another is held back, and what
    follows it, for Python programs only: a command's own glog-style line and its progress
    after it had all been hidden (review). What is held stays in its last words."""
    from shardwise._runtime.ending import Run, _last_words

    run = Run([], [], [True, True], False, reporting=reporting)
    run.ended, run.after, run.kept, run.held = [None, None], [False, False], [[], []], [0, 0]
    run.kept = [collections.deque(), collections.deque()]
    run.exits = {0: (1.0, 0)}
    for line in ("W0101 00:00:00.000000 1 worker.cc:12] slow disk\n", "step 100 loss 0.5\n"):
        run.err(1, "[p1] ", line)
    shown = capsys.readouterr().err
    assert ("step 100 loss 0.5" in shown) != reporting, shown
    assert ("step 100 loss 0.5" in _last_words(run, 1)) == reporting


def test_a_processs_last_words_keep_their_lines_where_errors_are_one_line(capsys):
    """Off a terminal every error is one line; a process's last words, quoted line by line,
    had been joined into that line with it, a traceback run together (probe U)."""
    from shardwise.cli._common import print_error

    words = '[p1] Traceback:\n[p1]   File "a.py", line 5\n[p1] ValueError: boom'
    print_error(f"process 1 failed;\n  stopped the others. Its last words:\n{words}")
    assert capsys.readouterr().err.splitlines() == [
        "error: process 1 failed; stopped the others. Its last words:",
        "[p1] Traceback:",
        '[p1]   File "a.py", line 5',
        "[p1] ValueError: boom",
    ]
