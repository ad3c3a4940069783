"""The names of a streamed run's work files beside its output (its manifest, lock, running
sums and temporary files), and what to delete to start a run over. Pure."""

from __future__ import annotations

import re
from pathlib import Path


def manifest_path(target: Path) -> Path:
    """Where the manifest of a run writing ``target`` lies.

    >>> manifest_path(Path("out/o.npy")).as_posix()
    'out/o.npy.manifest.json'
    """
    return target.with_name(target.name + ".manifest.json")


def lock_path(target: Path) -> Path:
    """The lock file held by the one run writing ``target``.

    >>> lock_path(Path("out/o.npy")).as_posix()
    'out/o.npy.lock'
    """
    return target.with_name(target.name + ".lock")


def accumulator_name(target: Path, c: int, token: str) -> str:
    """The name of the running sum saved after chunk ``c`` by the run of ``token``.

    >>> accumulator_name(Path("o.npy"), 3, "00ff00ff00ff00ff")
    'o.npy.acc.3.00ff00ff00ff00ff.npy'
    """
    return f"{target.name}.acc.{c}.{token}.npy"


def own_files(target: Path, token: str) -> re.Pattern[str]:
    """Names of the work files only the run of ``token`` creates (its running sums and its
    temporary files): nothing else can match, so these may be removed as leftovers."""
    name, t = re.escape(target.name), re.escape(token)
    return re.compile(
        rf"{name}\.(?:acc\.(0|[1-9][0-9]*)\.{t}\.npy|(?:manifest\.json|partial)\.{t}\.tmp)"
    )


def start_over(manifest: Path) -> str:
    """What to delete to start a run over, whether it finished or not: its output too, where
    it finished (the manifest and partial output alone had been named, and the finished
    output was then refused as "not written by a finished run").

    >>> start_over(Path("o.npy.manifest.json"))
    'delete o.npy.manifest.json, o.npy.partial and o.npy (those that exist) to start over'
    """
    out = manifest.name.removesuffix(".manifest.json")
    return f"delete {manifest.name}, {out}.partial and {out} (those that exist) to start over"
