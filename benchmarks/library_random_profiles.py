"""The libraries' own models (``tests/library_models.py``) planned under device profiles far
from this machine's, every plan compiled and checked against XLA: the plans a profile chooses
depend on its rates, and each choice is a program whose collectives and memory the planner
must predict (one calibrated on this machine while it was busy chose plans whose memory the
model had missed). Each trial draws a profile as ``program_random_profiles.py`` does (the
built-in ``cpu-2core`` figures scaled by factors from 0.1 to 10), plans every model with it
on ``--mesh``, and runs every plan once: how many plans' collectives equal the compiled HLO's,
how many are within 20% of XLA's memory (compiled ÷ predicted in [0.8, 1.25]), and the plans
outside. Nothing is timed.

    .venv/bin/python benchmarks/library_random_profiles.py [--trials 3] [--seed 1]
        [--mesh data=2,model=4] [--out benchmarks/library_random_profiles.json] [MODEL ...]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

import jax

jax.config.update("jax_num_cpu_devices", 8)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from program_random_profiles import random_profile  # noqa: E402

import shardwise  # noqa: E402
from library_models import MODELS  # noqa: E402
from shardwise._program import verify  # noqa: E402

LOW, HIGH = 0.8, 1.25
"""Compiled ÷ predicted memory per device counted as within 20%."""


def check(name: str, profile: Any, mesh: str) -> dict[str, Any]:
    """One model planned with ``profile``: each plan's collectives and memory against XLA's."""
    fn, args = MODELS[name]()
    plan = shardwise.plan(fn, *args, mesh=mesh, profile=profile)
    done = [p for p in plan.verify(repeat=1).plans if p.verified and p.verified.memory_bytes]
    ratios = {p.name: p.verified.memory_bytes / p.predicted.memory_bytes for p in done}
    return {
        "model": name,
        "plans": len(done),
        "hlo_match": sum(p.verified.collectives_match for p in done),
        "memory_within_20pct": sum(LOW <= r <= HIGH for r in ratios.values()),
        "outside": {n: round(r, 3) for n, r in ratios.items() if not LOW <= r <= HIGH},
        "memory_ratio": [round(min(ratios.values()), 3), round(max(ratios.values()), 3)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=list(MODELS))
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--mesh", default="data=2,model=4")
    parser.add_argument("--out", default="benchmarks/library_random_profiles.json")
    ns = parser.parse_args()
    verify.TURN_SECONDS = 0.0  # each plan run once, not timed
    rng = random.Random(ns.seed)
    rows = []
    for trial in range(ns.trials):
        profile = random_profile(rng, trial)
        for name in ns.models:
            row = {"trial": trial, **check(name, profile, ns.mesh)}
            rows.append(row)
            low, high = row["memory_ratio"]
            outside = f"  outside: {row['outside']}" if row["outside"] else ""
            print(f"{trial} {name:20s} HLO {row['hlo_match']}/{row['plans']}  memory ±20% "
                  f"{row['memory_within_20pct']}/{row['plans']} ({low:.2f}–{high:.2f}){outside}",
                  flush=True)  # fmt: skip
    total = sum(r["plans"] for r in rows)
    within = sum(r["memory_within_20pct"] for r in rows)
    hlo = sum(r["hlo_match"] for r in rows)
    print(f"all: HLO {hlo}/{total}, memory within 20% {within}/{total}")
    Path(ns.out).write_text(json.dumps({"seed": ns.seed, "mesh": ns.mesh, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
