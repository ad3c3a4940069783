"""Many processes on one machine: `launch -n 2 --devices-per-process 4` against one process
with 8 devices, and how fast a killed process ends a launch.

    .venv/bin/python benchmarks/launch_bench.py [--runs 5] [--out benchmarks/launch.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

DEMO = ["demo", "--size", "small", "--no-dask", "--json", "--repeat", "3"]
CHILD = Path(__file__).resolve().parent.parent / "tests" / "mp_child.py"


def wall(args: list[str]) -> tuple[float, dict[str, object]]:
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "shardwise.cli", *args], capture_output=True, text=True, check=True
    )
    return time.perf_counter() - start, json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", default="benchmarks/launch.json")
    args = parser.parse_args()
    one, two, same = [], [], True
    run_one, run_two = [], []
    for _ in range(args.runs):
        t1, r1 = wall([*DEMO, "--devices", "8"])
        t2, r2 = wall(["launch", "-n", "2", "--devices-per-process", "4", "--", "shardwise", *DEMO])
        one.append(t1)
        two.append(t2)
        run_one.append(sum(s["seconds"] for s in r1["scenarios"]))  # type: ignore[attr-defined]
        run_two.append(sum(s["seconds"] for s in r2["scenarios"]))  # type: ignore[attr-defined]
        for s1, s2 in zip(r1["scenarios"], r2["scenarios"], strict=True):  # type: ignore[call-overload]
            same &= s1["explain"]["operands"] == s2["explain"]["operands"] and s2["ok"]
    kills = []
    for _ in range(args.runs):
        start = time.perf_counter()
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "shardwise.cli",
                "launch",
                "-n",
                "2",
                "--devices-per-process",
                "2",
                "--",
                sys.executable,
                str(CHILD),
                "--die",
                "1",
            ],
            capture_output=True,
            text=True,
        )
        kills.append(
            {
                "seconds": time.perf_counter() - start,
                "returncode": done.returncode,
                "named": "process 1 was killed by SIGKILL" in done.stderr,
            }
        )
    report = {
        "runs": args.runs,
        "one_process_8_devices_seconds": statistics.median(one),
        "two_processes_4_devices_seconds": statistics.median(two),
        "ratio": statistics.median(two) / statistics.median(one),
        "one_process_compute_seconds": statistics.median(run_one),
        "two_processes_compute_seconds": statistics.median(run_two),
        "compute_ratio": statistics.median(run_two) / statistics.median(run_one),
        "same_shards_and_ok": same,
        "kill_trials": kills,
        "kill_max_seconds": max(k["seconds"] for k in kills),
        "kill_all_named_and_nonzero": all(k["named"] and k["returncode"] for k in kills),
    }
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(
        f"demo --size small (S1-S4) wall: 1 process x 8 devices "
        f"{report['one_process_8_devices_seconds']:.2f} s, 2 processes x 4 devices "
        f"{report['two_processes_4_devices_seconds']:.2f} s ({report['ratio']:.2f}x); "
        f"scenario time {report['one_process_compute_seconds'] * 1e3:.2f} ms vs "
        f"{report['two_processes_compute_seconds'] * 1e3:.2f} ms "
        f"({report['compute_ratio']:.2f}x); same results: {same}"
    )
    print(
        f"kill: {len(kills)} trials, slowest end {report['kill_max_seconds']:.1f} s after start, "
        f"all non-zero and naming process 1: {report['kill_all_named_and_nonzero']}"
    )


if __name__ == "__main__":
    main()
