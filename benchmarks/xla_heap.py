"""What XLA holds against what its heap takes: for every plan of the libraries' own models
(``tests/library_models.py``), the plan's predicted memory per device beside the compiled
program's, split into XLA's *live* bytes (arguments, results, and its temporaries at their
fullest point, from the live ranges XLA dumps) and the heap it allocates for those temporaries
(``memory_analysis``). The heap is at least the temporaries' fullest point (two values in
one buffer, one written over the other as it reads it last, counted once); what it holds
beyond is space its buffer assignment leaves between buffers (XLA places the largest first,
each in the smallest gap free over its whole life, and a gap left early can stay unused).

    .venv/bin/python benchmarks/xla_heap.py [--models nnx-gpt-loss,linen-cnn-step]
        [--mesh data=2,model=4] [--out benchmarks/xla_heap.json]

Nothing is timed. Each plan is compiled once, with XLA's dumps written to a temporary folder.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import jax

import shardwise

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from library_models import MODELS

PROFILE = "cpu-2core"


def temp_live_peak(folder: Path, temp_bytes: int) -> int | None:
    """The most bytes XLA's temporaries hold at one point of the program, from the dumps in
    ``folder`` of the module whose heap of temporaries is ``temp_bytes``."""
    for assignment in sorted(folder.glob("*after_optimizations-buffer-assignment.txt")):
        text = assignment.read_text()
        # (jaxlib 0.12.1 writes a page after the size: "size 98304, page 0, preallocated-temp")
        heap = re.search(
            rf"allocation \d+: size {temp_bytes}(?:, page \d+)?, preallocated-temp:\n"
            r"((?: value:.*\n)+)",
            text,
        )
        if heap is None:
            continue
        ranges_file = Path(str(assignment).replace("-buffer-assignment.txt", "-live-range.txt"))
        ranges = {
            m.group(1): (int(m.group(2)), int(m.group(3)))
            for m in re.finditer(r"^    (\S+):(\d+)-(\d+)$", ranges_file.read_text(), re.M)
        }
        spans = []  # (first point, last point, offset, bytes)
        for m in re.finditer(r"value: <\d+ (\S+) @\d+> \(size=(\d+),offset=(\d+)\)", heap.group(1)):
            name = m.group(1) if m.group(1).endswith("}") else m.group(1) + "{}"
            if name in ranges:
                spans.append((*ranges[name], int(m.group(3)), int(m.group(2))))
        most = 0
        for point in sorted({start for start, _, _, _ in spans}):
            # the bytes in use there: values that share a buffer (one written over another
            # that it reads last) are counted once
            used = sorted((o, o + n) for s, e, o, n in spans if s <= point <= e)
            held, reach = 0, 0
            for lo, hi in used:
                held += max(0, hi - max(lo, reach))
                reach = max(reach, hi)
            most = max(most, held)
        return most
    return None


def plan_rows(name: str, mesh: str) -> list[dict[str, Any]]:
    """Each plan of model ``name``: predicted, compiled and live bytes per device."""
    fn, args = MODELS[name]()
    p = shardwise.plan(fn, *args, mesh=mesh, profile=PROFILE)
    rows, seen, twins = [], {}, p.same_programs()
    for item in p.plans:
        if item.name in twins:  # (a baseline that is the search's plan: the same program)
            rows.append({**seen[twins[item.name]], "plan": item.name})
            continue
        with tempfile.TemporaryDirectory() as folder:
            compiled = (
                p.sharded(item.name).lower(*args).compile(compiler_options={"xla_dump_to": folder})
            )
            m = compiled.memory_analysis()
            fixed = m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
            live = temp_live_peak(Path(folder), m.temp_size_in_bytes)
        row = {
            "model": name,
            "plan": item.name,
            "predicted": item.predicted.memory_bytes,
            "compiled": fixed + m.temp_size_in_bytes,
            "live": None if live is None else fixed + live,
            "heap": m.temp_size_in_bytes,
            "heap_live": live,
        }
        seen[item.name] = row
        rows.append(row)
    return rows


def main() -> None:
    jax.config.update("jax_num_cpu_devices", 8)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--mesh", default="data=2,model=4")
    parser.add_argument("--out", type=Path)
    ns = parser.parse_args()
    rows = []
    print(f"{'model':20} {'plan':14} {'compiled/pred':>13} {'live/pred':>9} {'heap/live':>9}")
    for name in ns.models.split(","):
        for row in plan_rows(name, ns.mesh):
            rows.append(row)
            live = row["live"] / row["predicted"] if row["live"] else float("nan")
            spare = row["heap"] / row["heap_live"] if row["heap_live"] else float("nan")
            print(f"{name:20} {row['plan']:14} {row['compiled'] / row['predicted']:13.3f} "
                  f"{live:9.3f} {spare:9.3f}", flush=True)  # fmt: skip
    within = [r for r in rows if 0.8 <= r["compiled"] / r["predicted"] <= 1.25]
    live_within = [r for r in rows if r["live"] and 0.8 <= r["live"] / r["predicted"] <= 1.25]
    print(f"compiled within [0.8, 1.25] of the prediction: {len(within)} of {len(rows)} plans")
    print(f"live within [0.8, 1.25] of the prediction: {len(live_within)} of {len(rows)} plans")
    if ns.out:
        ns.out.write_text(json.dumps({"mesh": ns.mesh, "profile": PROFILE, "plans": rows},
                                     indent=1) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
