"""How well the program planner's predicted times rank many plans, measured on the devices at hand.

``program_verify.py`` times ten plans per program: the search's best five and the five named
baselines. The five search plans are often predicted within 1% of each other, so much of
that rank correlation is decided by differences the model calls ties. This benchmark ranks a
larger and more varied set. It takes the plans made under the profile at hand and under
``--trials`` random profiles (those of ``program_random_profiles.py``: every rate scaled by
0.1–10), each distinct plan once. It predicts every plan under the profile at hand, compiles
it, and times all of them taking turns (``--repeat`` turns, median).

Per program it reports the rank correlation over all plans and over the ten of the profile at
hand, and the median of measured ÷ predicted. The JSON keeps each plan's predicted and
measured seconds.

    .venv/bin/python benchmarks/program_corpus.py [--trials 6] [--seed 1] [--repeat 7]
        [--profile calibrate|NAME|FILE] [--out benchmarks/program_corpus.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import random
import statistics
import tempfile
from typing import Any

from program_parts import choice
from program_random_profiles import random_profile
from program_verify import MESH, PROGRAMS, _figures, _profile

import shardwise
from shardwise._program import verify
from shardwise._program.pricing import build_problem
from shardwise._program.problem import effective_mesh
from shardwise._program.program import PlannedLayout, ProgramPlan
from shardwise._program.solution import predicted
from shardwise._runtime.timing import alternate, spearman


def corpus(
    fn: Any, args: Any, train: bool, profile: str, trials: int, seed: int
) -> tuple[ProgramPlan, list[tuple[str, ProgramPlan, PlannedLayout, float]]]:
    """The plan under ``profile`` and every distinct plan made under it or a random profile,
    each with its label and its predicted seconds under ``profile``."""
    reference = shardwise.plan(fn, *args, mesh=MESH, profile=profile, train=train)
    mesh = effective_mesh(reference.mesh)
    problem = build_problem(reference.graph, mesh, reference.profile)
    rng = random.Random(seed)
    plans = [reference] + [
        shardwise.plan(fn, *args, mesh=MESH, profile=random_profile(rng, t), train=train)
        for t in range(trials)
    ]
    seen: set[tuple[int, ...]] = set()
    out = []
    for k, plan in enumerate(plans):
        for item in plan.plans:
            key = tuple(choice(reference, problem, item))
            if key not in seen:
                seen.add(key)
                label = item.name if k == 0 else f"{plan.profile.name}: {item.name}"
                _, again = predicted(reference.graph, problem, key, mesh, reference.profile)
                out.append((label, plan, item, again.seconds))
    return reference, out


def measure(
    items: list[tuple[str, ProgramPlan, PlannedLayout, float]], repeat: int
) -> dict[str, float]:
    """Median seconds of every plan, all compiled first, then taking turns."""
    runners = {}
    leaves = verify._arrays(items[0][1])  # every plan is of one program: the same inputs
    for label, plan, item, _ in items:
        _, compiled, args = verify.compile_program(plan, item, verify.mesh_for(plan, None), leaves)
        runners[label] = functools.partial(compiled, *args)
    return alternate(runners, repeat, at_least=verify.TURN_SECONDS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--profile", default="calibrate")
    parser.add_argument("--out", default="benchmarks/program_corpus.json")
    args = parser.parse_args()
    shardwise.use_cpu_devices(8)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        profile = _profile(args.profile, folder)
        for name, train, sizes in PROGRAMS:
            fn, fn_args = shardwise.model(name, train=train, **sizes)
            reference, items = corpus(fn, fn_args, train, profile, args.trials, args.seed)
            seconds = measure(items, args.repeat)
            predicted = [p for *_, p in items]
            measured = [seconds[label] for label, *_ in items]
            ten = [k for k, (label, plan, *_) in enumerate(items) if plan is reference]
            row = {
                "program": name,
                "train": train,
                "sizes": sizes,
                "plans": len(items),
                "spearman": spearman(predicted, measured),
                "spearman_reference": spearman(
                    [predicted[k] for k in ten], [measured[k] for k in ten]
                ),
                "measured_over_predicted": statistics.median(
                    m / p for m, p in zip(measured, predicted, strict=True)
                ),
                "seconds": {label: [p, seconds[label]] for label, *_, p in items},
            }
            rows.append(row)
            print(
                f"{name} {'training step' if train else 'forward'}: {len(items)} plans; "
                f"Spearman {row['spearman']:.2f} (the profile's own ten: "
                f"{row['spearman_reference']:.2f}); measured ÷ predicted "
                f"{row['measured_over_predicted']:.2f}",
                flush=True,
            )
        figures = _figures(profile)
    out = {"machine": platform.machine(), "python": platform.python_version(),
           "trials": args.trials, "seed": args.seed, "repeat": args.repeat,
           "profile": args.profile, "figures": figures, "programs": rows}  # fmt: skip
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
