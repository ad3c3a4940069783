"""The program planner's HLO and memory checks under device profiles far from this machine.

Each trial draws a profile whose FLOP rate, memory bandwidth, matmul packing rate and
collective latencies and bandwidths are the built-in ``cpu-2core`` figures scaled by factors
from 0.1 to 10 (log-uniform), plans the MLP and the 2-layer transformer, forward pass and
training step, with it, and compiles every plan on the devices at hand: how many plans'
collectives (kind, axes, bytes) equal the compiled HLO's, how many also belong to the
predicted ops and lines, and the range of predicted ÷ XLA memory. Such profiles make plans
the machine's own profile never would (gathers fifty times cheaper than all-reduces, say),
which is what this looks for. Nothing is timed.

    .venv/bin/python benchmarks/program_random_profiles.py [--trials 6] [--seed 1]
        [--mesh data=2,model=4] [--out benchmarks/program_random_profiles.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
from typing import Any

import shardwise
from shardwise._model.profile import BUILTIN, Link, Profile
from shardwise._program import verify

PROGRAMS: list[tuple[str, dict[str, Any]]] = [
    ("mlp", {"batch": 256, "hidden": 1024, "ffn": 4096}),
    ("transformer", {"batch": 16, "seq": 64, "hidden": 256, "ffn": 1024, "heads": 8, "layers": 2}),
]


def random_profile(rng: random.Random, trial: int) -> Profile:
    """The built-in ``cpu-2core`` profile with each rate and latency scaled by a factor from
    0.1 to 10, log-uniform, drawn from ``rng``."""
    cpu = BUILTIN["cpu-2core"]

    def f() -> float:
        return float(10 ** rng.uniform(-1, 1))

    return dataclasses.replace(
        cpu,
        name=f"random-{trial}",
        flops_per_s={"float32": cpu.flops("float32") * f()},
        memory_Bps=cpu.memory_Bps * f(),
        link=Link(cpu.link.latency_s * f(), cpu.link.bandwidth_Bps * f()),
        matmul_Bps=(cpu.matmul_Bps or cpu.memory_Bps) * f(),
        gather=Link(1e-4 * f(), 0.9e9 * f()),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--mesh", default="data=2,model=4")
    parser.add_argument("--out", default="benchmarks/program_random_profiles.json")
    args = parser.parse_args()
    shardwise.use_cpu_devices(8)
    verify.TURN_SECONDS = 0.0  # compiled once each; run once, not timed
    rng = random.Random(args.seed)
    rows: list[dict[str, Any]] = []
    for trial in range(args.trials):
        profile = random_profile(rng, trial)
        for name, sizes in PROGRAMS:
            for train in (False, True):
                fn, fn_args = shardwise.model(name, train=train, **sizes)
                plan = shardwise.plan(fn, *fn_args, mesh=args.mesh, profile=profile, train=train)
                checked = plan.verify(repeat=1)
                done = [p for p in checked.plans if p.verified and p.verified.memory_bytes]
                off = [p.name for p in done if p.verified and not p.verified.collectives_match]
                unsourced = [p.name for p in done if p.verified and not p.verified.sources_match]
                memory = [
                    p.predicted.memory_bytes / p.verified.memory_bytes
                    for p in done
                    if p.verified and p.verified.memory_bytes
                ]
                rows.append({"trial": trial, "program": name, "train": train,
                             "plans": len(done), "hlo_differs": off,
                             "ops_or_lines_differ": unsourced,
                             "memory_ratio": [min(memory), max(memory)]})  # fmt: skip
                print(
                    f"{trial} {name} {'training step' if train else 'forward'}: "
                    f"HLO {len(done) - len(off)}/{len(done)}, ops and lines "
                    f"{len(done) - len(unsourced)}/{len(done)}, memory "
                    f"{min(memory):.2f}–{max(memory):.2f}" + (f"; differ: {off}" if off else ""),
                    flush=True,
                )
    with open(args.out, "w") as f:
        json.dump({"seed": args.seed, "mesh": args.mesh, "rows": rows}, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
