"""The manifest of a resumable streamed run, ``<out>.manifest.json``: its one commit point.

It holds the command (equation, the inputs' fingerprints, the output's shape and dtype), the
chunk plan, the run's ``token`` (which names its work files), the inode of its partial output,
the chunks whose results are on disk (``done``) with a checksum of sampled bytes of each
(``evidence``) and, where some inputs are not files (arrays in memory, Dask arrays), a checksum
of the blocks each done chunk read of those (``reads``), the file holding the running sum
when chunks are added up (``accumulator``, with a checksum of its bytes), and whether the
output is ``complete``. Every change is written
atomically and durably before the run goes on.

A manifest is input like any other: it is read without following a symbolic link and checked
against a schema (types, chunk ids in range, file names confined to the run's own work files)
before anything in it is used; anything else is refused with a clear error.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from shardwise._data.budget import StreamPlan, plan_from_json
from shardwise._data.sources import changes
from shardwise._data.workfiles import own_files, start_over
from shardwise._errors import ShardwiseError
from shardwise._files import open_regular, write_atomic
from shardwise._model.op import Op

FORMAT = "shardwise-stream/3"
"""The manifest's format; a manifest of another format is refused."""

_KEYS = {
    "format": str,
    "token": str,
    "equation": str,
    "inputs": list,
    "out_shape": list,
    "dtype": str,
    "plan": dict,
    "partial": int,
    "done": list,
    "evidence": dict,
    "reads": dict,
    "accumulator": (dict, type(None)),
    "complete": bool,
}
_INPUT_KEYS = {
    "name": str,
    "shape": list,
    "dtype": str,
    "kind": str,
    "size": int,
    "mtime_ns": int,
    "ctime_ns": int,
    "inode": int,
    "sample": str,
    "sha256": str,
    "token": str,
}
_MAX_BYTES = 1 << 26


def _bad(path: Path, why: str) -> ShardwiseError:
    return ShardwiseError(
        f"{path.name} is damaged or was edited ({why}); shardwise will not resume from it. "
        f"Delete it and the output's other work files ({path.name.removesuffix('.manifest.json')}"
        ".partial and any .acc files) to start over."
    )


def _typed(value: Any, kind: Any) -> bool:
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return isinstance(value, kind)


def _counts(value: Any) -> bool:
    return isinstance(value, list) and all(_typed(n, int) for n in value)


class Manifest:
    """The manifest JSON of one run (``data``, keys in the order written), kept on disk."""

    def __init__(self, path: Path, data: dict[str, Any]) -> None:
        self.path = path
        self.data = data

    @classmethod
    def load(cls, path: Path) -> Manifest | None:
        """The manifest at ``path``, checked against the schema, or None when there is none."""
        try:
            fd = open_regular(path)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise _bad(path, f"it is a symbolic link or not a regular file: {e.strerror}") from None
        try:
            with os.fdopen(fd, "rb") as f:
                raw = f.read(_MAX_BYTES + 1)
        except OSError as e:
            raise _bad(path, f"it cannot be read: {e.strerror}") from None
        if len(raw) > _MAX_BYTES:
            raise _bad(path, f"it is over {_MAX_BYTES:,} bytes")
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError) as e:
            raise _bad(path, f"it is not JSON: {e}") from None
        manifest = cls(path, data)
        manifest._validate()
        return manifest

    def _validate(self) -> None:
        """Refuse a manifest that does not follow the schema or contradicts itself."""
        data, path = self.data, self.path
        if not isinstance(data, dict):
            raise _bad(path, "it is not a JSON object")
        if data.get("format") != FORMAT:
            raise _bad(
                path,
                f"its format is {data.get('format')!r}, not {FORMAT!r}: written by another "
                "version of shardwise?",
            )
        if set(data) != set(_KEYS):
            raise _bad(path, f"its keys are {sorted(data)}, not {sorted(_KEYS)}")
        for key, kind in _KEYS.items():
            if not _typed(data[key], kind):
                raise _bad(path, f"{key!r} is {data[key]!r}")
        if not re.fullmatch(r"[0-9a-f]{16}", data["token"]):
            raise _bad(path, f"'token' is {data['token']!r}")
        if not _counts(data["out_shape"]):
            raise _bad(path, f"'out_shape' is {data['out_shape']!r}")
        for k, fp in enumerate(data["inputs"]):
            if not isinstance(fp, dict) or not all(
                key in _INPUT_KEYS and _typed(v, _INPUT_KEYS[key]) for key, v in fp.items()
            ):
                raise _bad(path, f"input {k}'s fingerprint is {fp!r}")
            if not {"name", "shape", "dtype", "kind"} <= set(fp) or not _counts(fp["shape"]):
                raise _bad(path, f"input {k}'s fingerprint is {fp!r}")
        plan = plan_from_json(data["plan"], lambda why: _bad(path, why))
        self._validate_progress(plan)

    def _validate_progress(self, plan: StreamPlan) -> None:
        """Refuse a ``done`` list, evidence or running sum the schema does not allow."""
        data, path = self.data, self.path
        done = data["done"]
        if not _counts(done) or done != sorted(set(done)) or any(c >= plan.chunks for c in done):
            raise _bad(path, f"'done' is {done!r}; chunk ids run from 0 to {plan.chunks - 1}")
        if data["complete"] and len(done) != plan.chunks:
            raise _bad(path, "it is marked complete with chunks not done")
        evidence = data["evidence"]
        want = set() if plan.accumulate else {str(c) for c in done}
        if set(evidence) != want or not all(_typed(v, int) for v in evidence.values()):
            raise _bad(path, "'evidence' does not hold one checksum for each chunk done")
        reads, n = data["reads"], self.unstamped
        want = {str(c) for c in done} if n else set()
        if set(reads) != want or not all(_counts(v) and len(v) == n for v in reads.values()):
            raise _bad(path, f"'reads' does not hold {n} checksums for each chunk done")
        acc = data["accumulator"]
        if not plan.accumulate or data["complete"] or not done:
            if acc is not None:
                raise _bad(path, f"'accumulator' is {acc!r} where none can be")
            return
        pattern = own_files(Path(path.name.removesuffix(".manifest.json")), data["token"])
        found = pattern.fullmatch(acc.get("name", "")) if isinstance(acc, dict) else None
        if (
            found is None
            or found[1] is None
            or set(acc) != {"name", "crc32"}
            or not _typed(acc["crc32"], int)
            or int(found[1]) not in done
        ):
            raise _bad(path, f"'accumulator' is {acc!r}, not this run's running sum")

    @classmethod
    def start(
        cls,
        path: Path,
        op: Op,
        fingerprints: list[dict[str, Any]],
        out_shape: tuple[int, ...],
        dtype: np.dtype[Any],
        plan: StreamPlan,
        token: str,
        partial: int,
    ) -> Manifest:
        """Write the manifest of a new run, no chunk done yet; ``partial``: the inode of its
        partial output."""
        manifest = cls(
            path,
            {
                "format": FORMAT,
                "token": token,
                "equation": op.equation,
                "inputs": fingerprints,
                "out_shape": list(out_shape),
                "dtype": dtype.name,
                "plan": {f: getattr(plan, f) for f in StreamPlan.__slots__},
                "partial": partial,
                "done": [],
                "evidence": {},
                "reads": {},
                "accumulator": None,
                "complete": False,
            },
        )
        manifest.write()
        return manifest

    def check(
        self,
        op: Op,
        fingerprints: list[dict[str, Any]],
        out_shape: tuple[int, ...],
        dtype: np.dtype[Any],
        sizes: dict[str, int],
    ) -> None:
        """Refuse to resume when the command or its inputs changed since this was written."""
        data, name = self.data, self.path.name
        again = start_over(self.path)
        if (
            data["equation"] != op.equation
            or data["out_shape"] != list(out_shape)
            or data["dtype"] != dtype.name
            or len(data["inputs"]) != len(fingerprints)
        ):
            raise ShardwiseError(
                f"{name} belongs to another run ({data['equation']!r}, shape "
                f"{data['out_shape']}, {data['dtype']}); choose another output or {again}."
            )
        plan = self.plan
        if plan.index not in sizes or plan.total != sizes[plan.index]:
            raise _bad(self.path, f"its plan runs along {plan.index!r} of size {plan.total}")
        if plan.accumulate != (plan.index not in op.output) or (
            plan.accumulate and plan.total and any(plan.index not in t for t in op.inputs)
        ):
            raise _bad(self.path, f"its plan cannot stream {op.equation!r} along {plan.index!r}")
        before = data["inputs"]
        for k, new in enumerate(fingerprints):
            changed = changes(before[k], new)
            if changed:
                moved = [  # (a rename moves the ctime: it names the file, not its bytes)
                    j
                    for j, old in enumerate(before)
                    if j != k and not changes(old, new, ignore="ctime_ns")
                ]
                how = f"it now holds what input {moved[0]} held" if moved else ""
                if not how and changed == ["ctime_ns"]:
                    how = (
                        "ctime_ns differ: the file was written, or its times or mode were set, "
                        "though its size and mtime are as they were; a run with checksum=True "
                        "(--checksum) records SHA-256 and resumes across such changes"
                    )
                other = before[k].get("inode") != new.get("inode")  # (not ./a.npy for a.npy)
                if (moved or other) and before[k].get("name") != new["name"]:
                    was = f" (it was input {moved[0]})" if moved else ""
                    raise ShardwiseError(
                        f"input {k} is {new['name']}{was}, where the run begun read "
                        f"{before[k].get('name')}: give the same inputs, in the same order, to "
                        f"resume, or {again}."
                    )
                raise ShardwiseError(
                    f"input {k} ({new['name']}) changed since the last run "
                    f"({how or ', '.join(changed) + ' differ'}); restore it, or {again}."
                )

    @property
    def unstamped(self) -> int:
        """How many inputs are not files (arrays in memory, Dask arrays): each done chunk's
        ``reads`` checksums of its blocks of those are what shows a resume reads the same."""
        return sum("inode" not in fp for fp in self.data["inputs"])

    def reads(self, c: int) -> list[int]:
        """The checksums recorded for the blocks done chunk ``c`` read of each input that is not
        a file, in input order."""
        crcs: list[int] = self.data["reads"][str(c)]
        return crcs

    @property
    def checksums(self) -> bool:
        """Whether the inputs' fingerprints hold SHA-256 checksums (then a resume computes
        them too, whatever it was asked)."""
        return any("sha256" in fp for fp in self.data["inputs"])

    @property
    def token(self) -> str:
        """The run's random token, in the names of the work files only it creates."""
        token: str = self.data["token"]
        return token

    @property
    def partial(self) -> int:
        """The inode of the run's partial output."""
        inode: int = self.data["partial"]
        return inode

    @property
    def complete(self) -> bool:
        """Whether the run finished (its output lies, or is about to lie, under its name)."""
        return bool(self.data["complete"])

    @cached_property
    def plan(self) -> StreamPlan:
        """How the run cuts its inputs into chunks."""
        return StreamPlan(**self.data["plan"])

    @property
    def accumulator(self) -> dict[str, Any] | None:
        """The running sum so far, if any: its file's ``name`` beside the output and the
        ``crc32`` of its array's bytes."""
        acc: dict[str, Any] | None = self.data["accumulator"]
        return acc

    @cached_property
    def done(self) -> set[int]:
        """The chunks whose results are on disk."""
        return set(self.data["done"])

    def evidence(self, c: int) -> int:
        """The checksum recorded for done chunk ``c``'s bytes."""
        crc: int = self.data["evidence"][str(c)]
        return crc

    def todo(self) -> list[int]:
        """The chunks still to compute, in order."""
        return [c for c in range(self.plan.chunks) if c not in self.done]

    def record(
        self,
        chunks: Iterable[int],
        evidence: dict[int, int] | None = None,
        accumulator: dict[str, Any] | None = None,
        reads: dict[int, list[int]] | None = None,
    ) -> str | None:
        """Record ``chunks`` as done, with the checksums of their bytes (``evidence``), or with
        ``accumulator``, the running sum now saved durably, and the checksums of the blocks
        they read of the inputs that are not files (``reads``); return the name of the running
        sum's file this replaces, now unneeded."""
        old = None
        if accumulator is not None:
            old = self.accumulator
            self.data["accumulator"] = accumulator
        self.done.update(chunks)
        self.data["done"] = sorted(self.done)
        self.data["evidence"].update({str(c): crc for c, crc in (evidence or {}).items()})
        self.data["reads"].update({str(c): crc for c, crc in (reads or {}).items()})
        self.write()
        return old["name"] if old else None

    def restart(self, partial: int) -> None:
        """Record a new partial output (inode ``partial``) for a run with no chunk done."""
        assert not self.done
        self.data["partial"] = partial
        self.write()

    def finish(self) -> str | None:
        """Record the run as complete; return the running sum's file, now unneeded."""
        self.data["complete"] = True
        old = self.accumulator
        self.data["accumulator"] = None
        self.write()
        return old["name"] if old else None

    def write(self) -> None:
        """Replace the manifest on disk, atomically and durably."""
        tmp = self.path.with_name(f"{self.path.name}.{self.token}.tmp")
        write_atomic(self.path, json.dumps(self.data, indent=1), tmp=tmp)
