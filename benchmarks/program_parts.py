"""Where each program plan's predicted time goes, beside the time it measures.

For one built-in model (the sizes of ``program_verify.py``) on mesh data=2,model=4, each plan's
predicted seconds are split into parts, each part the prediction under a profile in which only
it costs anything: **dots** (multiplying and packing), **elementwise** (the arrays XLA writes
between fused elementwise ops), **maps and slices** (reductions, broadcasts, local slices and
the CPU's copies back), and **collectives**. Then ``rounds`` rounds of ``verify(repeat=…)``
measure every plan (median). Where two plans predicted alike measure apart, or one plan's
rank is off, its parts say which part of the model to look at, or that none counts what
differs (the plan guide's shortfalls give such a case: a GELU gradient fused with a
transpose).

    .venv/bin/python benchmarks/program_parts.py --model transformer --train
        [--profile calibrate|NAME|FILE] [--rounds 1] [--repeat 15] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import tempfile
from typing import Any

from program_verify import BLOCKS, MESH, MLP, _profile

import shardwise
from shardwise._model.profile import Link, Profile
from shardwise._program.pricing import build_problem
from shardwise._program.problem import Problem, effective_mesh
from shardwise._program.program import PlannedLayout, ProgramPlan
from shardwise._program.solution import predicted

BIG = 1e30


def variants(profile: Profile) -> dict[str, Profile]:
    """Profiles in which only one part costs: dots, memory traffic, collectives."""
    free = Link(0.0, BIG)
    quiet = dataclasses.replace(
        profile,
        link=free,
        axis_links={k: free for k in profile.axis_links},
        gather=free,
        gather_links={k: free for k in profile.gather_links},
    )
    flops = {k: BIG for k in profile.flops_per_s}
    return {
        "dots": dataclasses.replace(quiet, memory_Bps=BIG),
        "memory": dataclasses.replace(quiet, flops_per_s=flops, matmul_Bps=BIG),
        "collectives": dataclasses.replace(
            profile, flops_per_s=flops, matmul_Bps=BIG, memory_Bps=BIG
        ),
    }


def choice(plan: ProgramPlan, problem: Problem, item: PlannedLayout) -> list[int]:
    """``item``'s layouts as one choice per variable of ``problem``."""
    out = []
    for label, options in zip(problem.labels, problem.choices, strict=True):
        if label[0] == "class":
            out.append(options.index(item.layouts.specs[label[1]]))
            continue
        step = plan.graph.steps[label[1]]
        ins, made = item.layouts.steps[step.key]
        out.append(next(k for k, s in enumerate(options)
                        if s.in_specs(step.op) == ins and s.out_spec == made))  # fmt: skip
    return out


def parts(plan: ProgramPlan) -> dict[str, dict[str, float]]:
    """Seconds by part for every plan of ``plan``."""
    mesh = effective_mesh(plan.mesh)
    graph = plan.graph
    fused = dataclasses.replace(graph, elementwise={})  # no elementwise traffic at all
    cases = {name: (graph, p) for name, p in variants(plan.profile).items()}
    cases["memory less elementwise"] = (fused, variants(plan.profile)["memory"])
    cases["all"] = (graph, plan.profile)
    problems = {k: build_problem(g, mesh, p) for k, (g, p) in cases.items()}
    out = {}
    for item in plan.plans:
        t = {
            k: predicted(cases[k][0], p, choice(plan, p, item), mesh, cases[k][1])[1].seconds
            for k, p in problems.items()
        }
        out[item.name] = {
            "predicted": t["all"],
            "dots": t["dots"],
            "elementwise": t["memory"] - t["memory less elementwise"],
            "maps and slices": t["memory less elementwise"],
            "collectives": t["collectives"],
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["mlp", "transformer"], default="transformer")
    parser.add_argument("--train", action="store_true")
    parser.add_argument("--profile", default="calibrate")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    shardwise.use_cpu_devices(8)
    sizes = MLP if args.model == "mlp" else BLOCKS
    fn, fn_args = shardwise.model(args.model, train=args.train, **sizes)
    with tempfile.TemporaryDirectory() as folder:
        profile = _profile(args.profile, folder)
        plan = shardwise.plan(fn, *fn_args, mesh=MESH, profile=profile, train=args.train)
    rows: dict[str, dict[str, Any]] = parts(plan)
    measured: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(args.rounds):
        for p in plan.verify(repeat=args.repeat).plans:
            assert p.verified is not None
            measured[p.name].append(p.verified.seconds)
    print(f"{'plan':14s} " + " ".join(f"{k:>15s}" for k in [*rows["search"], "measured"]))
    for name, row in rows.items():
        row["measured"] = statistics.median(measured[name])
        print(f"{name:14s} " + " ".join(f"{v * 1e3:12.2f} ms" for v in row.values()))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"model": args.model, "train": args.train, "sizes": sizes,
                       "profile": args.profile, "plans": rows}, f, indent=1)  # fmt: skip
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
