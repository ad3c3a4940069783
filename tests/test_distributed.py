"""Many processes, one mesh: `shardwise launch` on loopback (gloo collectives)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

CHILD = Path(__file__).with_name("mp_child.py")
ENV = {k: v for k, v in os.environ.items() if not k.startswith("SHARDWISE_")}


def shardwise(*args: str, env: dict[str, str] | None = None, timeout: float = 240):
    return subprocess.run(
        [sys.executable, "-m", "shardwise", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**ENV, **(env or {})},
    )


def _json(text: str):
    return json.loads(text)  # launched processes send native noise to stderr, not stdout


@pytest.mark.slow
def test_demo_on_two_processes_matches_one():
    one = shardwise("demo", "--size", "small", "--json", "--repeat", "1", "--devices", "8")
    two = shardwise(
        "launch",
        "-n",
        "2",
        "--devices-per-process",
        "4",
        "--",
        "shardwise",
        "demo",
        "--size",
        "small",
        "--json",
        "--repeat",
        "1",
    )
    assert one.returncode == 0, one.stderr
    assert two.returncode == 0, two.stderr
    a, b = _json(one.stdout), _json(two.stdout)
    assert b["devices"] == {"platform": "cpu", "count": 8, "processes": 2, "used": 8}
    assert b["ok"]
    for s1, s2 in zip(a["scenarios"][:4], b["scenarios"], strict=False):
        assert s1["name"] == s2["name"]
        assert s2["ok"] and s2["max_abs_error"] <= s2["tolerance"]
        if not s1["explain"]["collectives"]:  # no cross-device sums: bit for bit the same
            assert s1["max_abs_error"] == s2["max_abs_error"]
        for key in ("operands", "output"):
            assert s1["explain"][key] == s2["explain"][key]
        assert [(c["kind"], c["mesh_axes"]) for c in s1["explain"]["collectives"]] == [
            (c["kind"], c["mesh_axes"]) for c in s2["explain"]["collectives"]
        ]
    assert [s["name"] for s in b["scenarios"]] == ["S1", "S2", "S3", "S4"]


@pytest.mark.slow
def test_property_family_on_two_processes_matches_one():
    one = subprocess.run(  # the entry of launched processes, here with no runtime to join
        [sys.executable, "-m", "shardwise._runtime.child", str(CHILD)],
        capture_output=True,
        text=True,
        env={**ENV, "SHARDWISE_CPU_DEVICES": "8"},
        timeout=240,
    )
    two = shardwise(
        "launch", "-n", "2", "--devices-per-process", "4", "--", sys.executable, str(CHILD)
    )
    assert one.returncode == 0, one.stderr
    assert two.returncode == 0, two.stderr
    a, b = _json(one.stdout), _json(two.stdout)
    assert len(a) > 40
    assert [r["case"] for r in a] == [r["case"] for r in b]
    for r1, r2 in zip(a, b, strict=True):
        # gloo may add partial sums in another order than the in-process all-reduce
        assert r2["sum"] == pytest.approx(r1["sum"], rel=1e-5), r1["case"]
        assert r2["max_error"] <= 1e-4, r1["case"]
        assert r1["collectives"] == r2["collectives"], r1["case"]


def test_a_killed_process_ends_the_launch_in_bounded_time():
    start = time.monotonic()
    result = shardwise(
        "launch",
        "-n",
        "2",
        "--devices-per-process",
        "2",
        "--timeout",
        "10",
        "--",
        sys.executable,
        str(CHILD),
        "--die",
        "1",
        timeout=120,
    )
    elapsed = time.monotonic() - start
    assert result.returncode != 0
    assert "process 1 was killed by SIGKILL" in result.stderr
    assert elapsed < 60


def test_port_in_use():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        result = shardwise("launch", "-n", "2", "--port", str(port), "--", "shardwise", "demo")
    assert result.returncode == 2
    assert f"port {port} on 127.0.0.1 is in use" in " ".join(result.stderr.split())


def test_a_coordinator_host_that_does_not_resolve_is_blamed_not_its_port():
    result = shardwise("launch", "-n", "2", "--coordinator-address", "no.such.host.invalid:1234",
                       "--", sys.executable, "-c", "pass")  # fmt: skip
    assert result.returncode == 2
    assert "no.such.host.invalid is not a name this machine can resolve" in result.stderr
    assert "--port" not in result.stderr


def test_the_launcher_picks_a_port_no_outgoing_connection_can_take():
    # a port from the ephemeral range may become some connection's end (gloo opens many)
    # in the second before process 0 listens there: that failed a launch in the test suite
    from shardwise._runtime.address import _ephemeral_low, bind_error, free_port

    low = _ephemeral_low()
    for _ in range(20):
        port = free_port()
        assert 1024 <= port < low
        assert bind_error("127.0.0.1", port) is None


def _alone(port: int, process_id: int, timeout: int) -> subprocess.CompletedProcess[str]:
    """The demo as process ``process_id`` of 2 at coordinator port ``port``, the other never
    started, waiting ``timeout`` seconds for it."""
    env = {
        "SHARDWISE_COORDINATOR": f"127.0.0.1:{port}",
        "SHARDWISE_NUM_PROCESSES": "2",
        "SHARDWISE_PROCESS_ID": str(process_id),
        "SHARDWISE_INIT_TIMEOUT": str(timeout),
    }
    return shardwise("demo", "--size", "small", "--no-dask", env=env, timeout=120)


def test_wrong_coordinator_fails_with_a_clear_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing will listen here
    result = _alone(port, process_id=1, timeout=3)
    assert result.returncode != 0
    text = " ".join(result.stderr.split())
    assert "could not join the runtime" in text and f"127.0.0.1:{port}" in text
    assert "Traceback" not in result.stderr


def test_process_zero_whose_peer_never_joins_ends_with_a_clear_error():
    """Process 0 of 2 alone: JAX's runtime had aborted it from native code (status 134 and a
    C++ stack) when its peer never registered."""
    from shardwise._runtime.address import free_port

    result = _alone(free_port(), process_id=0, timeout=2)
    assert result.returncode == 2, result.stderr[-2000:]
    text = " ".join(result.stderr.split())
    assert "process 0 of 2: not every process joined the runtime within 2 s" in text
    assert "Check failure" not in result.stderr


def test_mismatched_process_settings():
    result = shardwise(
        "demo",
        "--size",
        "small",
        env={
            "SHARDWISE_COORDINATOR": "127.0.0.1:1",
            "SHARDWISE_NUM_PROCESSES": "2",
            "SHARDWISE_PROCESS_ID": "5",
        },
    )
    assert result.returncode != 0
    assert "outside 0..1" in result.stderr


def test_launch_needs_a_command():
    result = shardwise("launch", "-n", "2")
    assert result.returncode == 2


def test_a_missing_script_and_a_scripts_error_read_as_under_python(tmp_path):
    """Under ``launch``, a script that is not there had given a traceback through shardwise's
    child runner and runpy; a script's own exception had begun with five of their frames."""
    missing = shardwise("launch", "-n", "2", "--", sys.executable, str(tmp_path / "nope.py"))
    assert missing.returncode == 2
    assert "can't open file" in missing.stderr and "Traceback" not in missing.stderr
    script = tmp_path / "raiser.py"
    script.write_text("def f():\n    raise ValueError('boom')\n\n\nf()\n")
    raised = shardwise("launch", "-n", "2", "--", sys.executable, str(script))
    assert raised.returncode == 1
    # (the launcher passes a process's stderr on, or quotes its last words line by line)
    frames = re.findall(r'File "([^"]+)"', raised.stderr)
    assert frames and set(frames) == {str(script)}, raised.stderr
    assert "ValueError: boom" in raised.stderr


def test_a_launched_program_joins_once_even_when_it_asks_to_join():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = (
        "import __main__, sys, jax, shardwise; shardwise.initialize_distributed(); "
        "print(__main__.__name__, sys.argv[1:], jax.process_count(), jax.device_count())"
    )
    result = subprocess.run(
        [sys.executable, "-m", "shardwise._runtime.child", "-c", code, "a", "b"],
        capture_output=True,
        text=True,
        timeout=120,
        env={
            **ENV,
            "SHARDWISE_COORDINATOR": f"127.0.0.1:{port}",
            "SHARDWISE_NUM_PROCESSES": "1",
            "SHARDWISE_PROCESS_ID": "0",
            "SHARDWISE_CPU_DEVICES": "2",
        },
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["__main__", "['a',", "'b']", "1", "2"]
