"""The profile a benchmark plans with, given on its command line (``--profile``): a name or a
file as it is, or ``calibrate``: this machine measured first (``shardwise calibrate``), the
profile kept beside the benchmark's output."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path


def profile_for(name: str, out: Path | None, mesh: str) -> str:
    """``name``, or with ``calibrate`` the file this machine's calibration on ``mesh`` wrote,
    beside ``out`` (``<stem>_profile.json``; in a temporary folder where ``out`` is ``None``)."""
    if name != "calibrate":
        return name
    where = out if out is not None else Path(tempfile.mkdtemp()) / "benchmark.json"
    path = where.with_name(where.stem + "_profile.json")
    cli = [sys.executable, "-m", "shardwise.cli", "calibrate", "--mesh", mesh, "--out", str(path)]
    subprocess.run(cli, check=True, stdout=subprocess.DEVNULL)
    return str(path)
