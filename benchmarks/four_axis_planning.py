"""How long planning takes on a mesh of four axes, where every array has hundreds or thousands
of layouts and each step is priced between every two: Llama-3 8B's AdamW training step (batch
8, sequence 2048) on ``data=2,fsdp=2,sequence=2,tensor=4`` and the built-in transformer's
training step (hidden 256, ffn 1024, batch 256) on ``data=2,fsdp=2,sequence=2,tensor=2``,
both under profile ``tpu-v5p`` with ``top=3`` and the default time limit (a minute for
pricing). Printed per program: the pricing's seconds (every step between every two layouts)
and its pairs of layouts, the search's seconds (``solve_seconds``), the whole plan's, and
the process's peak memory so far.

    .venv/bin/python benchmarks/four_axis_planning.py [--only llama|transformer]
        [--out benchmarks/four_axis_planning.json]

Nothing runs on devices; the mesh need not exist.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path
from typing import Any

import jax

import shardwise
import shardwise._program.pricing as pricing
import shardwise._program.reading as reading

PROGRAMS: dict[str, tuple[dict[str, Any], str, bool]] = {
    "llama": (  # (the AdamW step itself)
        dict(name="llama", size="llama3-8b", batch=8, seq=2048, train=True, optimizer="adamw"),
        "data=2,fsdp=2,sequence=2,tensor=4",
        False,
    ),
    "transformer": (  # (its loss, planned as one SGD step, as ``--train``)
        dict(name="transformer", batch=256, hidden=256, ffn=1024, train=True),
        "data=2,fsdp=2,sequence=2,tensor=2",
        True,
    ),
}


def planned(name: str) -> dict[str, Any]:
    """One program planned, with the pricing timed and its pairs counted."""
    options, mesh, train = PROGRAMS[name]
    fn, args = shardwise.model(**options)
    found: dict[str, Any] = {"pairs": 0}
    build, grid = reading.build_problem, pricing.reshard_grid

    def timed_build(*a: Any, **k: Any) -> Any:
        start = time.perf_counter()
        try:
            return build(*a, **k)
        finally:
            found["pricing_s"] = round(time.perf_counter() - start, 1)

    def counted_grid(value: Any, srcs: Any, dsts: Any, *a: Any, **k: Any) -> Any:
        found["pairs"] += len(srcs) * len(dsts)
        return grid(value, srcs, dsts, *a, **k)

    reading.build_problem, pricing.reshard_grid = timed_build, counted_grid
    try:
        start = time.perf_counter()
        plan = shardwise.plan(fn, *args, mesh=mesh, profile="tpu-v5p", train=train, top=3)
        found["plan_s"] = round(time.perf_counter() - start, 1)
    finally:
        reading.build_problem, pricing.reshard_grid = build, grid
    found.update(
        mesh=mesh,
        search_s=round(plan.solve_seconds, 1),
        method=plan.method,
        plans={p.name: round(p.predicted.seconds * 1e3, 3) for p in plan.plans},
        peak_rss_gib=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
    )
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(PROGRAMS))
    parser.add_argument("--out", type=Path)
    ns = parser.parse_args()
    jax.config.update("jax_num_cpu_devices", 8)
    results = {}
    for name in [ns.only] if ns.only else list(PROGRAMS):
        results[name] = planned(name)
        print(name, json.dumps(results[name]), flush=True)
    if ns.out:
        ns.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
