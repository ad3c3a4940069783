"""What a resume's input check costs, beside a fresh run of the same stream.

A resume must give a fresh run's result on the inputs as they are now, or refuse. Files are
checked by their size, mtime, inode and ctime (a write whose mtime was put back still moves
the ctime) and a hash of 64 sampled blocks: a fixed cost whatever their size. Inputs that are
not files (arrays in memory) are checked by a hash (XXH3) of every block each chunk reads,
summed on the reading thread as the run goes, and read again for the done chunks on resume.

Measured here, in one process, alternating (``--trials``, medians reported):
- the stream benchmark's `.npy` pair (``benchmarks/stream_bench.py`` writes it): a fresh run,
  and the check a resume of it makes (the same call once it is complete: fingerprints only);
- an in-memory pair (``--memory-gib``): a fresh run, the same run with its checksums stubbed
  out, the hash of all its input bytes alone (what the run sums on its reading thread), and
  a resume's check after half the chunks.

    .venv/bin/python benchmarks/stream_resume_check.py [--dir /tmp/shardwise-stream]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from pathlib import Path

import numpy as np
import xxhash

import shardwise


class _Stop(Exception):
    pass


def _fresh(inputs: list, out: Path, budget: str) -> float:
    for leftover in out.parent.glob(out.name + "*"):
        leftover.unlink()
    start = time.perf_counter()
    shardwise.stream("nd,nd->n", *inputs, out=out, budget=budget)
    return time.perf_counter() - start


def _timed(fn) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _resume_check_seconds(pair: list, out: Path, budget: str) -> float:
    """Resume the interrupted run writing ``out``; the seconds its input check took."""
    from shardwise._data import reader as chunks

    spent: list[float] = []
    check = chunks.ChunkReader.check_resumed

    def timed_check(self, manifest):  # type: ignore[no-untyped-def]
        start = time.perf_counter()
        check(self, manifest)
        spent.append(time.perf_counter() - start)

    chunks.ChunkReader.check_resumed = timed_check  # type: ignore[method-assign]
    try:
        shardwise.stream("nd,nd->n", *pair, out=out, budget=budget)
    finally:
        chunks.ChunkReader.check_resumed = check  # type: ignore[method-assign]
    return spent[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="/tmp/shardwise-stream")
    parser.add_argument("--memory-gib", type=float, default=2.0)
    parser.add_argument("--budget", default="1GiB")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/stream_resume_check.json")
    parser.add_argument("--skip-files", action="store_true")
    args = parser.parse_args()
    shardwise.use_cpu_devices(8)
    folder = Path(args.dir)
    report: dict[str, object] = {"budget": args.budget, "trials": args.trials}

    files = [folder / "a.npy", folder / "b.npy"]
    if all(p.exists() for p in files) and not args.skip_files:
        out = folder / "resume-out.npy"
        fresh, check = [], []
        for _ in range(args.trials):
            fresh.append(_fresh(files, out, args.budget))
            call = lambda: shardwise.stream("nd,nd->n", *files, out=out, budget=args.budget)  # noqa: E731
            check.append(_timed(call))  # complete: it checks the inputs, then does nothing
        report["files"] = {
            "input_bytes": sum(p.stat().st_size for p in files),
            "fresh_seconds": fresh,
            "check_seconds": check,
            "check_vs_fresh": statistics.median(check) / statistics.median(fresh),
        }
        for leftover in folder.glob("resume-out.npy*"):
            leftover.unlink()
    else:
        print(f"no .npy pair in {folder}: run benchmarks/stream_bench.py first for the files")

    rows = int(args.memory_gib * 2**30 / 2 / 12)
    rng = np.random.default_rng(0)
    pair = [rng.random((rows, 3), dtype=np.float32), rng.random((rows, 3), dtype=np.float32)]
    out = folder / "resume-mem.npy"
    fresh, bare, sums, resume = [], [], [], []
    from shardwise._data.reader import ChunkReader

    checksum = ChunkReader.__dict__["_checksum"]  # the staticmethod itself
    for _ in range(args.trials):
        fresh.append(_fresh(pair, out, args.budget))
        ChunkReader._checksum = staticmethod(lambda c, rows: 0)  # type: ignore[method-assign]
        try:
            bare.append(_fresh(pair, out, args.budget))  # the same run, summing nothing
        finally:
            ChunkReader._checksum = checksum  # type: ignore[method-assign]
        sums.append(
            _timed(
                lambda: [xxhash.xxh3_64_intdigest(a.reshape(-1).view(np.uint8).data) for a in pair]
            )
        )
        for leftover in folder.glob("resume-mem.npy*"):
            leftover.unlink()

        def half(done: int, total: int, nbytes: int) -> None:
            if 2 * done >= total:
                raise _Stop

        with contextlib.suppress(_Stop):
            shardwise.stream("nd,nd->n", *pair, out=out, budget=args.budget, on_chunk=half)
        resume.append(_resume_check_seconds(pair, out, args.budget))
        for leftover in folder.glob("resume-mem.npy*"):
            leftover.unlink()
    report["memory"] = {
        "input_bytes": sum(a.nbytes for a in pair),
        "fresh_seconds": fresh,
        "fresh_without_checksums_seconds": bare,
        "checksums_vs_fresh": statistics.median(fresh) / statistics.median(bare) - 1,
        "hash_all_inputs_seconds": sums,
        "resume_check_seconds": resume,
        "hash_vs_fresh": statistics.median(sums) / statistics.median(fresh),
        "resume_check_vs_fresh": statistics.median(resume) / statistics.median(fresh),
    }
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
