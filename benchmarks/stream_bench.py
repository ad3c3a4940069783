"""Streaming at scale: an 8 GiB `.npy` pair through `nd,nd->n` with a 1 GiB budget.

Measures, in one run: the plain sequential read bandwidth of the same files, the
streamed run's throughput and peak resident memory, and the runtime's fixed overhead
(the peak of the same command on a tiny pair), then writes the figures as JSON. Plain
reads and streamed runs alternate (``--trials``, 3 by default) because this machine's
page-cache bandwidth swings by 2× from minute to minute; the ratio of each pair is
reported, and their median.

    .venv/bin/python benchmarks/stream_bench.py [--dir /tmp/shardwise-stream] [--gib 8]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROW = 3 * 4  # one (3,) float32 vector


def make(path: Path, rows: int, seed: int) -> None:
    """Write a (rows, 3) float32 .npy file in pieces (bounded memory)."""
    if path.exists() and path.stat().st_size >= rows * ROW:
        return
    rng = np.random.default_rng(seed)
    header = {"descr": "<f4", "fortran_order": False, "shape": (rows, 3)}
    with open(path, "wb") as f:  # plain writes: a memory map would swell this process
        np.lib.format.write_array_header_1_0(f, header)
        step = 1 << 24
        for start in range(0, rows, step):
            f.write(rng.random((min(step, rows - start), 3), dtype=np.float32).tobytes())


def plain_read(paths: list[Path]) -> float:
    """Bytes per second of reading the files front to back in 64 MiB blocks."""
    buf = bytearray(64 << 20)
    total = 0
    start = time.perf_counter()
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                total += n
    return total / (time.perf_counter() - start)


def streamed(a: Path, b: Path, out: Path, budget: str) -> dict[str, float]:
    """Run `shardwise run` in a child process; its JSON result and peak RSS."""
    for leftover in out.parent.glob(out.name + "*"):
        leftover.unlink()
    start = time.perf_counter()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "shardwise.cli",
            "run",
            "nd,nd->n",
            str(a),
            str(b),
            "--out",
            str(out),
            "--budget",
            budget,
            "--json",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    wall = time.perf_counter() - start
    result = json.loads(done.stdout)  # its peak_rss_bytes is the child's own VmHWM
    return {**result, "wall_seconds": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="/tmp/shardwise-stream")
    parser.add_argument("--gib", type=float, default=8.0, help="total size of the pair")
    parser.add_argument("--budget", default="1GiB")
    parser.add_argument("--out", default="benchmarks/stream.json")
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()
    folder = Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    rows = int(args.gib * 2**30 / 2 / ROW)
    a, b = folder / "a.npy", folder / "b.npy"
    ta, tb = folder / "tiny-a.npy", folder / "tiny-b.npy"
    print(f"writing {2 * rows * ROW / 2**30:.1f} GiB of inputs to {folder} (once)")
    make(a, rows, 0)
    make(b, rows, 1)
    make(ta, 1 << 16, 2)
    make(tb, 1 << 16, 3)
    # the tiny run first: the runtime's fixed overhead (JAX, compiled program, small chunk)
    tiny = streamed(ta, tb, folder / "tiny-out.npy", args.budget)
    reads, runs = [], []
    for _ in range(args.trials):
        reads.append(plain_read([a, b]))
        runs.append(streamed(a, b, folder / "out.npy", args.budget))
    ratios = [r["throughput_Bps"] / read for r, read in zip(runs, reads, strict=True)]
    middle = sorted(range(args.trials), key=lambda k: ratios[k])[args.trials // 2]
    big, read_bps = runs[middle], reads[middle]
    # spot-check the result against NumPy on a slice at each end
    out = np.load(folder / "out.npy", mmap_mode="r")
    for part in (slice(0, 100_000), slice(rows - 100_000, rows)):
        ref_a = np.load(a, mmap_mode="r")[part]
        ref_b = np.load(b, mmap_mode="r")[part]
        np.testing.assert_allclose(out[part], np.einsum("nd,nd->n", ref_a, ref_b), rtol=1e-5)
    budget = big["predicted_peak_bytes"]
    report = {
        "input_bytes": 2 * rows * ROW,
        "budget": args.budget,
        "trials": args.trials,
        "plain_read_Bps_each": reads,
        "stream_throughput_Bps_each": [r["throughput_Bps"] for r in runs],
        "throughput_vs_read_each": ratios,
        "plain_read_Bps": read_bps,
        "stream_throughput_Bps": big["throughput_Bps"],
        "throughput_vs_read": ratios[middle],
        "peak_rss_bytes": max(r["peak_rss_bytes"] for r in runs),
        "fixed_overhead_bytes": tiny["peak_rss_bytes"],
        "peak_over_overhead_bytes": max(r["peak_rss_bytes"] for r in runs) - tiny["peak_rss_bytes"],
        "predicted_data_bytes": budget,
        "chunks": big["chunks"],
        "chunk": big["chunk"],
        "wall_seconds": big["wall_seconds"],
        "cpu_count": os.cpu_count(),
    }
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    gib = 2**30
    each = ", ".join(f"{r:.0%}" for r in ratios)
    print(
        f"plain read {read_bps / 1e9:.2f} GB/s; streamed {big['throughput_Bps'] / 1e9:.2f} GB/s "
        f"({report['throughput_vs_read']:.0%} of it, median of {each}) in {big['chunks']} "
        f"chunks; peak RSS {report['peak_rss_bytes'] / gib:.2f} GiB = runtime overhead "
        f"{tiny['peak_rss_bytes'] / gib:.2f} GiB + {report['peak_over_overhead_bytes'] / gib:.2f}"
        f" GiB for data (budget {args.budget})"
    )


if __name__ == "__main__":
    main()
