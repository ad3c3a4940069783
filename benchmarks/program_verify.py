"""The program planner against the devices at hand: plan, then verify, the built-in models.

For the MLP (256×1024×4096) and a 2-layer transformer (batch 16, seq 64, hidden 256,
ffn 1024, 8 heads), forward pass and training step, on mesh data=2,model=4 with a profile
of the machine at hand (``shardwise calibrate`` first; ``--profile cpu-2core`` for the
built-in one, fitted on another 2-core machine): the time to plan in this process, then
``tune(repeat=…)``, which times the 10 plans (the search's plan, 4 runners-up, 5 baselines,
taking turns) and chooses the fastest; then ``rounds`` more rounds of ``verify(repeat=…)``
on the tuned plan, each timing them again. Per round: how many plans' collectives equal the
compiled HLO's (kind, axes, bytes), how many belong to the predicted ops and source lines,
predicted ÷ XLA memory, the rank correlation of predicted and measured time, the measured
time ÷ the best measured plan's of the search's plan (the model's choice) and of the tuned
choice (made on other timings than the round's), and the search's ÷ the best named
baseline's; the JSON keeps each plan's predicted and measured seconds.

    .venv/bin/python benchmarks/program_verify.py [--rounds 3] [--repeat 15]
        [--profile calibrate|NAME|FILE] [--out benchmarks/program_verify.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import shardwise

MLP: dict[str, Any] = {"batch": 256, "hidden": 1024, "ffn": 4096}
BLOCKS: dict[str, Any] = {
    "batch": 16,
    "seq": 64,
    "hidden": 256,
    "ffn": 1024,
    "heads": 8,
    "layers": 2,
}
PROGRAMS = [("mlp", False, MLP), ("mlp", True, MLP),
            ("transformer", False, BLOCKS), ("transformer", True, BLOCKS)]  # fmt: skip
MESH = "data=2,model=4"
BASELINES = ("replicated", "data-parallel", "fsdp", "megatron", "data×tensor")


def _round(checked: shardwise.ProgramPlan) -> dict[str, Any]:
    plans = [p for p in checked.plans if p.verified is not None]
    measured = {p.name: p.verified.seconds for p in plans if p.verified}
    chosen = measured["search"]
    bases = [measured[n] for n in BASELINES if n in measured]
    memory = [
        p.predicted.memory_bytes / p.verified.memory_bytes
        for p in plans
        if p.verified and p.verified.memory_bytes
    ]
    return {
        "plans": len(plans),
        "collectives_match": sum(bool(p.verified and p.verified.collectives_match) for p in plans),
        "sources_match": sum(bool(p.verified and p.verified.sources_match) for p in plans),
        "memory_ratio": [min(memory), max(memory)],
        "spearman": checked.spearman,
        "chosen_over_best": chosen / min(measured.values()),
        "tuned_over_best": measured[checked.chosen_name] / min(measured.values()),
        "chosen_over_best_baseline": chosen / min(bases),
        "seconds": {p.name: [p.predicted.seconds, measured[p.name]] for p in plans},
    }


def _profile(name: str, folder: str) -> str:
    """``name``, or where it is ``calibrate`` a profile of this machine's devices, measured
    now by ``shardwise calibrate`` in a process of its own."""
    if name != "calibrate":
        return name
    out = str(Path(folder) / "local.json")
    cli = [sys.executable, "-m", "shardwise.cli", "calibrate", "--mesh", MESH, "--out", out]
    subprocess.run(cli, check=True, stdout=subprocess.DEVNULL)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--profile", default="calibrate")
    parser.add_argument("--out", default="benchmarks/program_verify.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        profile = _profile(args.profile, folder)
        rows = _measure(profile, args.rounds, args.repeat)
        figures = _figures(profile)
    out = {"machine": platform.machine(), "python": platform.python_version(),
           "repeat": args.repeat, "profile": args.profile,
           "figures": figures, "programs": rows}  # fmt: skip
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {args.out}")


def _measure(profile: str, times: int, repeat: int) -> list[dict[str, Any]]:
    shardwise.use_cpu_devices(8)
    rows = []
    for name, train, sizes in PROGRAMS:
        fn, fn_args = shardwise.model(name, train=train, **sizes)
        start = time.perf_counter()
        plan = shardwise.plan(fn, *fn_args, mesh=MESH, profile=profile,
                              train=train)  # fmt: skip
        planned = time.perf_counter() - start
        tuned = plan.tune(repeat=repeat)
        rounds = [_round(tuned.verify(repeat=repeat)) for _ in range(times)]
        row = {"program": name, "train": train, "sizes": sizes, "plan_seconds": planned,
               "chosen": plan.chosen.name, "tuned": tuned.chosen_name,
               "tune_round": _round(tuned), "rounds": rounds}  # fmt: skip
        rows.append(row)
        rho = [r["spearman"] for r in rounds]
        print(
            f"{name} {'training step' if train else 'forward'}: planned in {planned:.2f} s; "
            f"HLO {min(r['collectives_match'] for r in rounds)}/{rounds[0]['plans']}, "
            f"ops and lines {min(r['sources_match'] for r in rounds)}/{rounds[0]['plans']}; "
            f"Spearman median {statistics.median(rho):.2f} {[round(x, 2) for x in rho]}; "
            f"chosen ÷ best {[round(r['chosen_over_best'], 2) for r in rounds]}; "
            f"tuned ({tuned.chosen_name}) ÷ best "
            f"{[round(r['tuned_over_best'], 2) for r in rounds]}; "
            f"÷ best baseline {[round(r['chosen_over_best_baseline'], 2) for r in rounds]}",
            flush=True,
        )
    return rows


def _figures(profile: str) -> dict[str, Any]:
    if not profile.endswith(".json"):
        return {"name": profile}
    with open(profile) as f:
        return dict(json.load(f))


if __name__ == "__main__":
    main()
