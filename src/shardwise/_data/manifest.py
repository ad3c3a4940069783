"""The manifest of a resumable streamed run, ``<out>.manifest.json``: its one commit point.

It holds the command (equation, the inputs' fingerprints, the output's shape and dtype), the
chunk plan, the chunks whose results are on disk (``done``), the file holding the running
sum when chunks are added up (``accumulator``), and whether the output is ``complete``.
Every change is written atomically and durably before the run goes on.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from shardwise._data.budget import StreamPlan
from shardwise._errors import ArgumentError, ShardwiseError
from shardwise._files import write_atomic
from shardwise._model.op import Op


def manifest_path(target: Path) -> Path:
    """Where the manifest of a run writing ``target`` lies.

    >>> manifest_path(Path("out/o.npy")).as_posix()
    'out/o.npy.manifest.json'
    """
    return target.with_name(target.name + ".manifest.json")


class Manifest:
    """The manifest JSON of one run (``data``, keys in the order written), kept on disk."""

    def __init__(self, path: Path, data: dict[str, Any]) -> None:
        self.path = path
        self.data = data

    @classmethod
    def load(cls, path: Path) -> Manifest | None:
        """The manifest at ``path``, or None when there is none."""
        if not path.exists():
            return None
        return cls(path, json.loads(path.read_text()))

    @classmethod
    def start(
        cls,
        path: Path,
        op: Op,
        fingerprints: list[dict[str, Any]],
        out_shape: tuple[int, ...],
        dtype: np.dtype[Any],
        plan: StreamPlan,
    ) -> Manifest:
        """Write the manifest of a new run, no chunk done yet."""
        manifest = cls(
            path,
            {
                "equation": op.equation,
                "inputs": fingerprints,
                "out_shape": list(out_shape),
                "dtype": dtype.name,
                "plan": {f: getattr(plan, f) for f in StreamPlan.__slots__},
                "done": [],
                "accumulator": None,
                "complete": False,
            },
        )
        manifest._write()
        return manifest

    def check(
        self,
        op: Op,
        fingerprints: list[dict[str, Any]],
        out_shape: tuple[int, ...],
        dtype: np.dtype[Any],
        checksum: bool,
    ) -> None:
        """Refuse to resume when the command or its inputs changed since this was written."""
        data, name = self.data, self.path.name
        start_over = f"delete {name} and the partial output to start over"
        if (
            data.get("equation") != op.equation
            or data.get("out_shape") != list(out_shape)
            or data.get("dtype") != dtype.name
        ):
            raise ArgumentError(
                f"{name} belongs to another run ({data.get('equation')!r}, shape "
                f"{data.get('out_shape')}, {data.get('dtype')}); choose another output or "
                f"{start_over}."
            )
        before = data.get("inputs", [])
        for k, (old, new) in enumerate(zip(before, fingerprints, strict=False)):
            keys = ["shape", "dtype", "size", "mtime_ns"] + (["sha256"] if checksum else [])
            changed = [key for key in keys if key in old and old.get(key) != new.get(key)]
            if changed:
                raise ShardwiseError(
                    f"input {k} ({new['name']}) changed since the last run ({', '.join(changed)} "
                    f"differ); restore it, or {start_over}."
                )

    @property
    def complete(self) -> bool:
        """Whether the run finished (its output lies under its real name)."""
        return bool(self.data.get("complete"))

    @property
    def plan(self) -> StreamPlan:
        """How the run cuts its inputs into chunks."""
        return StreamPlan(**self.data["plan"])

    @property
    def accumulator(self) -> str | None:
        """The file name (beside the output) of the running sum so far, if any."""
        name: str | None = self.data.get("accumulator")
        return name

    @cached_property
    def done(self) -> set[int]:
        """The chunks whose results are on disk."""
        return set(self.data["done"])

    def todo(self) -> list[int]:
        """The chunks still to compute, in order."""
        return [c for c in range(self.plan.chunks) if c not in self.done]

    def record(self, chunks: Iterable[int], accumulator: str | None = None) -> str | None:
        """Record ``chunks`` as done (with ``accumulator``, the running sum now saved
        durably, when given); return the running sum's file this replaces, now unneeded."""
        old = None
        if accumulator is not None:
            old = self.accumulator
            self.data["accumulator"] = accumulator
        self.done.update(chunks)
        self.data["done"] = sorted(self.done)
        self._write()
        return old

    def finish(self) -> str | None:
        """Record the run as complete; return the running sum's file, now unneeded."""
        self.data["complete"] = True
        old = self.accumulator
        self.data["accumulator"] = None
        self._write()
        return old

    def _write(self) -> None:
        write_atomic(self.path, json.dumps(self.data, indent=1))
