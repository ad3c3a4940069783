"""Streaming under faults: kills, tampering, swapped inputs and two writers at once.

Each scenario runs in a folder of its own that also holds files the run must never touch
(``victims/``, and link targets); after it, every file outside the output's own work files
(``OUT`` and ``OUT.*``) is compared with what was there before ("data lost").

* kills: a streamed run (``tests/stream_child.py --slow``, a child process) is killed with
  SIGKILL at a random moment of its life, resumed in a child that may be killed again, and
  finished in this process; the output must be byte-identical to an uninterrupted run's.
* tampering: an interrupted run's manifest, partial output or running sum is truncated,
  garbled or edited, or replaced by a symbolic link, or its inputs are swapped, rewritten or
  given in another order; the resume must refuse (a ``ShardwiseError``), or, where a case
  allows it, produce the right output.
* an input truncated under a running child: a clear error, never SIGBUS.
* two writers: two children start on one output at once; one must be refused at once.

Prints the counts as JSON (and writes them with ``--json PATH``).

    .venv/bin/python benchmarks/stream_faults.py [--quick] [--kills 40] [--json PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import shardwise

shardwise.use_cpu_devices(8)

CHILD = Path(__file__).resolve().parent.parent / "tests" / "stream_child.py"
BUDGET = "64KiB"
EQUATIONS = ("nd,nd->n", "nd,nd->")


class Stop(Exception):
    """Stops an in-process run after some chunks, leaving its work files as a kill does."""


def snapshot(folder: Path, out: Path) -> dict[str, str]:
    """Hashes of every file under ``folder`` but ``out`` and its work files (links by
    target text)."""
    found = {}
    for p in sorted(folder.rglob("*")):
        if p.parent == out.parent and (p.name == out.name or p.name.startswith(out.name + ".")):
            continue
        if p.is_symlink():
            found[str(p.relative_to(folder))] = "link:" + os.readlink(p)
        elif p.is_file():
            found[str(p.relative_to(folder))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return found


class Lab:
    """Inputs, reference outputs and fresh folders for the scenarios."""

    def __init__(self, root: Path, rows: int) -> None:
        self.root = root
        self.master = root / "master"
        self.master.mkdir()
        rng = np.random.default_rng(0)
        for name in ("a.npy", "b.npy"):
            np.save(self.master / name, rng.random((rows, 3), dtype=np.float32))
        self.reference: dict[str, bytes] = {}
        for eq in EQUATIONS:
            out = self.master / f"ref{len(self.reference)}.npy"
            self.run(eq, self.ins(self.master), out)
            self.reference[eq] = out.read_bytes()
        self.count = 0
        self.lost: list[str] = []

    @staticmethod
    def ins(folder: Path) -> list[Path]:
        return [folder / "a.npy", folder / "b.npy"]

    @staticmethod
    def run(eq: str, ins: list[Path], out: Path, **kwargs: Any) -> Any:
        return shardwise.stream(eq, *ins, mesh="devices=8", out=out, budget=BUDGET, **kwargs)

    def folder(self) -> Path:
        """A fresh folder with copies of the inputs and files nobody may touch."""
        self.count += 1
        folder = self.root / f"case{self.count}"
        (folder / "victims").mkdir(parents=True)
        for p in self.ins(self.master):
            shutil.copy(p, folder / p.name)
        np.save(folder / "victims" / "victim.npy", np.arange(3.0))
        (folder / "victims" / "notes.txt").write_text("keep me")
        return folder

    def interrupted(self, eq: str, folder: Path, after: int, **kwargs: Any) -> Path:
        """``folder/o.npy``'s work files as a run stopped after ``after`` chunks leaves them."""
        out = folder / "o.npy"

        def stop(done: int, total: int, nbytes: int) -> None:
            if done >= after:
                raise Stop

        with contextlib.suppress(Stop):
            self.run(eq, self.ins(folder), out, on_chunk=stop, **kwargs)
        return out

    def check_kept(self, name: str, folder: Path, out: Path, before: dict[str, str]) -> None:
        after = snapshot(folder, out)
        if after != before:
            changed = sorted(set(before.items()) ^ set(after.items()))
            self.lost.append(f"{name}: {changed[:4]}")


def child(eq: str, out: Path, ins: list[Path], *extra: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, str(CHILD), eq, str(out), BUDGET, *extra, *map(str, ins)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def kills(lab: Lab, trials: int, life: float, rng: random.Random) -> dict[str, int]:
    """Kill children at random moments, resume, and compare with the reference."""
    counts = {"runs": 0, "kills": 0, "resumes": 0, "identical": 0}
    for trial in range(trials):
        eq = EQUATIONS[trial % len(EQUATIONS)]
        folder = lab.folder()
        out = folder / "o.npy"
        before = snapshot(folder, out)
        for _ in range(2):  # the first run, then a resume, each killed at a random moment
            proc = child(eq, out, lab.ins(folder), "--slow")
            counts["runs"] += 1
            time.sleep(rng.uniform(0.0, life))
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                counts["kills"] += 1
            proc.communicate()
        lab.run(eq, lab.ins(folder), out)
        counts["resumes"] += 1
        counts["identical"] += out.read_bytes() == lab.reference[eq]
        lab.check_kept(f"kill {trial}", folder, out, before)
    return counts


def _edit(out: Path, change: Callable[[dict[str, Any]], None]) -> None:
    path = out.with_name(out.name + ".manifest.json")
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _manifest(out: Path) -> Any:
    return json.loads(out.with_name(out.name + ".manifest.json").read_text())


def _work(out: Path, suffix: str) -> Path:
    return out.with_name(out.name + suffix)


def _swap(a: Path, b: Path) -> None:
    tmp = a.with_name("swap.tmp")
    a.rename(tmp)
    b.rename(a)
    tmp.rename(b)


def _rewrite(path: Path) -> None:
    st = path.stat()
    np.save(path, np.load(path) + 1)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _flip(path: Path, at: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0xFF]))


def _link(path: Path, target: Path) -> None:
    target.write_bytes(path.read_bytes())
    path.unlink()
    path.symlink_to(target)


TAMPERING: dict[str, tuple[str, bool, Callable[[Path, Path], Any]]] = {
    # name: (equation, must be refused, tamper(folder, out))
    "manifest truncated": (
        "nd,nd->n",
        True,
        lambda f, o: os.truncate(_work(o, ".manifest.json"), 100),
    ),
    "manifest garbage": (
        "nd,nd->n",
        True,
        lambda f, o: _work(o, ".manifest.json").write_bytes(os.urandom(300)),
    ),
    "manifest done claims all": (
        "nd,nd->n",
        True,
        lambda f, o: _edit(o, lambda d: d.update(done=list(range(d["plan"]["chunks"])))),
    ),
    "manifest done and evidence made up": (
        "nd,nd->n",
        True,
        lambda f, o: _edit(
            o,
            lambda d: d.update(
                done=list(range(d["plan"]["chunks"])),
                evidence={str(c): 12345 for c in range(d["plan"]["chunks"])},
            ),
        ),
    ),
    "manifest summed chunks claim all": (
        "nd,nd->",
        True,
        lambda f, o: _edit(o, lambda d: d.update(done=list(range(d["plan"]["chunks"])))),
    ),
    "manifest accumulator outside": (
        "nd,nd->",
        True,
        lambda f, o: _edit(o, lambda d: d["accumulator"].update(name="../victims/victim.npy")),
    ),
    "manifest accumulator absolute": (
        "nd,nd->",
        True,
        lambda f, o: _edit(
            o, lambda d: d["accumulator"].update(name=str(f / "victims" / "victim.npy"))
        ),
    ),
    "manifest token path": (
        "nd,nd->n",
        True,
        lambda f, o: _edit(o, lambda d: d.update(token="../victims")),
    ),
    "manifest chunk out of range": (
        "nd,nd->n",
        True,
        lambda f, o: _edit(o, lambda d: d.update(done=[*d["done"], 10**6])),
    ),
    "manifest plan changed": (
        "nd,nd->n",
        True,
        lambda f, o: _edit(o, lambda d: d["plan"].update(chunks=d["plan"]["chunks"] + 1)),
    ),
    "manifest linked to a victim": (
        "nd,nd->n",
        True,
        lambda f, o: _link(_work(o, ".manifest.json"), f / "victims" / "m.json"),
    ),
    "partial truncated": (
        "nd,nd->n",
        True,
        lambda f, o: os.truncate(_work(o, ".partial"), _work(o, ".partial").stat().st_size // 2),
    ),
    "partial byte flipped in a done chunk": (
        "nd,nd->n",
        True,
        lambda f, o: _flip(_work(o, ".partial"), 130),
    ),
    "partial zeroed": (
        "nd,nd->n",
        True,
        lambda f, o: _work(o, ".partial").write_bytes(
            _work(o, ".partial").read_bytes()[:128]
            + bytes(_work(o, ".partial").stat().st_size - 128)
        ),
    ),
    "partial linked to a victim": (
        "nd,nd->n",
        True,
        lambda f, o: _link(_work(o, ".partial"), f / "victims" / "p.npy"),
    ),
    "running sum flipped": (
        "nd,nd->",
        True,
        lambda f, o: _flip(o.with_name(_manifest(o)["accumulator"]["name"]), 130),
    ),
    "inputs swapped": ("nd,nd->n", True, lambda f, o: _swap(f / "a.npy", f / "b.npy")),
    "input rewritten, size and mtime kept": ("nd,nd->n", True, lambda f, o: _rewrite(f / "a.npy")),
    "inputs in another order": ("nd,nd->n", True, lambda f, o: "reverse"),
    "stale temporary file linked to a victim": (
        "nd,nd->n",
        False,
        lambda f, o: _work(o, ".manifest.json.tmp").symlink_to(f / "victims" / "notes.txt"),
    ),
}


def tampering(lab: Lab) -> tuple[dict[str, int], dict[str, str]]:
    """Tamper with interrupted runs and resume: refused, or right where allowed."""
    outcomes = {}
    for name, (eq, _, tamper) in TAMPERING.items():
        folder = lab.folder()
        out = lab.interrupted(eq, folder, after=3)
        ins = lab.ins(folder)
        if tamper(folder, out) == "reverse":
            ins = ins[::-1]
        before = snapshot(folder, out)
        try:
            lab.run(eq, ins, out)
            right = out.exists() and out.read_bytes() == lab.reference[eq]
            outcomes[name] = "finished, right" if right else "finished, WRONG"
        except shardwise.ShardwiseError:
            outcomes[name] = "refused"
        except Exception as e:  # counted as a failure of the guard
            outcomes[name] = f"crashed: {type(e).__name__}: {e}"
        lab.check_kept(name, folder, out, before)
    must = [n for n, (_, refuse, _) in TAMPERING.items() if refuse]
    counts = {
        "tampering_cases": len(TAMPERING),
        "tampering_must_refuse": len(must),
        "tampering_refused": sum(outcomes[n] == "refused" for n in must),
        "tampering_allowed_and_right": sum(
            outcomes[n] == "finished, right" for n in TAMPERING if n not in must
        ),
    }
    return counts, outcomes


def truncated_input(lab: Lab) -> dict[str, Any]:
    """Truncate an input under a running child: it must stop with a clear error."""
    folder = lab.folder()
    out = folder / "o.npy"
    proc = child("nd,nd->n", out, lab.ins(folder), "--truncate", str(folder / "a.npy"))
    _, err = proc.communicate()
    clear = "changed or was truncated" in err or "ended early" in err
    return {"truncated_input_rc": proc.returncode, "truncated_input_clear_error": clear}


def two_writers(lab: Lab, trials: int) -> dict[str, int]:
    """Start two children on one output at once: one must be refused, the output right."""
    counts = {"two_writer_trials": trials, "second_writer_refused": 0, "two_writer_identical": 0}
    for _ in range(trials):
        folder = lab.folder()
        out = folder / "o.npy"
        before = snapshot(folder, out)
        procs = [child("nd,nd->n", out, lab.ins(folder), "--slow") for _ in range(2)]
        errs = [p.communicate()[1] for p in procs]
        busy = [
            p.returncode == 1 and "is being written by process" in e
            for p, e in zip(procs, errs, strict=True)
        ]
        ok = [p.returncode == 0 for p in procs]
        counts["second_writer_refused"] += sorted(busy) == [False, True] and any(ok)
        if not out.exists():
            lab.run("nd,nd->n", lab.ins(folder), out)
        counts["two_writer_identical"] += out.read_bytes() == lab.reference["nd,nd->n"]
        lab.check_kept("two writers", folder, out, before)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer trials (under 2 minutes)")
    parser.add_argument("--kills", type=int, default=40, help="kill trials (two kills each)")
    parser.add_argument("--writers", type=int, default=10, help="two-writer trials")
    parser.add_argument("--rows", type=int, default=40_000, help="rows of each input")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    if args.quick:
        args.kills, args.writers = 4, 2
    rng = random.Random(args.seed)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="shardwise-faults-") as tmp:
        lab = Lab(Path(tmp), args.rows)
        folder = lab.folder()  # how long a child's whole run lasts, to spread the kills
        timed = time.perf_counter()
        child("nd,nd->n", folder / "o.npy", lab.ins(folder), "--slow").communicate()
        life = time.perf_counter() - timed
        figures: dict[str, Any] = {"rows": args.rows, "budget": BUDGET, "child_life_s": life}
        figures.update(kills(lab, args.kills, life, rng))
        counts, outcomes = tampering(lab)
        figures.update(counts)
        figures.update(truncated_input(lab))
        figures.update(two_writers(lab, args.writers))
        figures["data_lost"] = len(lab.lost)
        figures["data_lost_cases"] = lab.lost
        figures["tampering_outcomes"] = outcomes
    figures["seconds"] = time.perf_counter() - start
    text = json.dumps(figures, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
