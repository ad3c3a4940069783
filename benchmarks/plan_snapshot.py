"""Every plan of a fixed set of programs, as the planner makes them now: to compare the plans
before and after a change to the planner (they must be the same, or better and explained).

The programs: the built-in ``mlp`` and ``transformer``, forward and ``train=True``, on meshes
``data=2,model=4`` and ``x=8``; an unrolled 12-layer MLP (a Python loop of layers), forward and
training step; an unrolled 3-block transformer (and its training step on the first mesh); a
2-block GPT in Flax NNX (when Flax is installed); and the MLP's training step under a memory
budget. For each plan (the search's,
its runners-up, the baselines): its name, the inputs' specs, the predicted seconds, peak
memory and collectives.

    .venv/bin/python benchmarks/plan_snapshot.py --out before.json
    .venv/bin/python benchmarks/plan_snapshot.py --out after.json --compare before.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from unrolled_models import mlp_stack, nnx_gpt, transformer_stack

import shardwise
from shardwise._program.models import loss_of

PROFILE = "cpu-2core"
MESHES = ("data=2,model=4", "x=8")


def cases() -> Iterator[tuple[str, Callable[..., Any], tuple[Any, ...], dict[str, Any]]]:
    """``(label, fn, args, plan options)`` for every program of the snapshot."""
    sizes = {
        "mlp": {"batch": 64, "hidden": 128, "ffn": 256},
        "transformer": {"batch": 8, "hidden": 64, "ffn": 256, "seq": 32, "heads": 4, "layers": 2},
    }
    for mesh in MESHES:
        for name, size in sizes.items():
            for train in (False, True):
                fn, args = shardwise.model(name, train=train, **size)
                yield f"{name} train={train} {mesh}", fn, args, {"mesh": mesh, "train": train}
        fn, args = mlp_stack(12, scan=False)
        yield f"unrolled mlp12 {mesh}", fn, args, {"mesh": mesh}
        forward, (x, ws) = mlp_stack(12, scan=False)
        train = {"mesh": mesh, "train": True}
        yield f"unrolled mlp12 train {mesh}", loss_of(forward), (ws, x, x), train
        fn, args = transformer_stack(3, scan=False)
        yield f"unrolled transformer3 {mesh}", fn, args, {"mesh": mesh}
        try:
            fn, args = nnx_gpt()
        except ImportError:
            continue
        yield f"nnx gpt2 {mesh}", fn, args, {"mesh": mesh}
    fn, args = shardwise.model("mlp", train=True, **sizes["mlp"])
    budget = {"mesh": MESHES[0], "train": True, "budget": "200KiB"}
    yield "mlp train budget 200KiB", fn, args, budget
    forward, (x, params) = transformer_stack(3, scan=False)
    train = {"mesh": MESHES[0], "train": True}
    yield "unrolled transformer3 train", loss_of(forward), (params, x, x), train


def snapshot(label: str, fn: Callable[..., Any], args: tuple[Any, ...], **options: Any) -> Any:
    """One program's plans, as JSON."""
    plan = shardwise.plan(fn, *args, profile=PROFILE, **options)
    return {
        "label": label,
        "optimal": plan.optimal,
        "chosen": plan.chosen.name,
        "plans": [
            {
                "name": p.name,
                "in_specs": [s.describe() for s in p.in_specs],
                "seconds": p.predicted.seconds,
                "memory_bytes": p.predicted.memory_bytes,
                "over_budget": p.over_budget,
                "collectives": sorted(
                    (c.kind, "+".join(c.mesh_axes), c.bytes, c.repeat, c.op_name)
                    for c in p.predicted.collectives
                ),
            }
            for p in plan.plans
        ],
    }


def compare(before: list[Any], after: list[Any]) -> list[str]:
    """Every difference between two snapshots, in words (none: the same plans)."""
    out = []
    old = {case["label"]: case for case in before}
    for case in after:
        was = old.get(case["label"])
        if was is None:
            out.append(f"{case['label']}: new")
            continue
        names = {p["name"]: p for p in was["plans"]}
        for p in case["plans"]:
            q = names.pop(p["name"], None)
            if q is None:
                out.append(f"{case['label']}: {p['name']} is new ({p['seconds']:.6g} s)")
                continue
            for key in ("seconds", "memory_bytes"):
                if not math.isclose(p[key], q[key], rel_tol=1e-9):
                    out.append(f"{case['label']}: {p['name']} {key} {q[key]:.6g} → {p[key]:.6g}")
            for key in ("in_specs", "collectives", "over_budget"):
                if json.dumps(p[key]) != json.dumps(q[key]):
                    out.append(f"{case['label']}: {p['name']} {key} differ")
        out += [f"{case['label']}: {name} is gone" for name in names]
        if case["optimal"] != was["optimal"] or case["chosen"] != was["chosen"]:
            out.append(f"{case['label']}: optimal/chosen {was['optimal']}/{was['chosen']} → "
                       f"{case['optimal']}/{case['chosen']}")  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--compare", type=Path, help="an earlier snapshot to compare with")
    parser.add_argument("--only", default="", help="only the programs whose label has this")
    ns = parser.parse_args()
    found = []
    for label, fn, args, options in cases():
        if ns.only in label:
            print(label, flush=True)
            found.append(snapshot(label, fn, args, **options))
    ns.out.write_text(json.dumps(found, indent=1))
    if ns.compare:
        differences = compare(json.loads(ns.compare.read_text()), found)
        print("\n".join(differences) or "the same plans")
        sys.exit(1 if differences else 0)


if __name__ == "__main__":
    main()
