"""Random sharded einsums against NumPy, thousands at a time: the property test's cases and
checks (``tests/property_cases.py``) without hypothesis, summarized by failure class.

    .venv/bin/python benchmarks/property_sweep.py --cases 3000 --seed 0 \\
        [--out benchmarks/property_sweep.json]

Each case is drawn by ``property_cases.draw_case`` from ``random.Random(seed)`` and checked by
``property_cases.run_case``; the summary counts each failure class (a case may fall in
several), keeps the first and the smallest repros of each, groups the messages, and compares
shardwise's collectives with plain ``jax.jit(jnp.einsum)``'s on the same shardings.
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def _signature(note: str) -> str:
    """A message with its particulars (numbers, quoted names, shapes) blanked, so that
    messages of one cause group together."""
    text = re.sub(r"'[^']*'", "'…'", note)
    text = re.sub(r"mesh axes \S+", "mesh axes A", text)
    text = re.sub(r"\d+(\.\d+)?(e-?\d+)?", "N", text)
    return text[:120]


def _size(case: Any) -> tuple[int, int, int]:
    return (len(case.inputs), sum(max(1, n) for _, n in case.sizes), len(case.equation))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="where to write the JSON summary")
    parser.add_argument("--examples", type=int, default=3, help="repros kept per class")
    args = parser.parse_args()

    import jax

    jax.config.update("jax_num_cpu_devices", 8)

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn
    from rich.table import Table

    import property_cases as pc

    rng = random.Random(args.seed)
    cases = [pc.draw_case(rng) for _ in range(args.cases)]
    counts: collections.Counter[str] = collections.Counter()
    first: dict[str, list[Any]] = collections.defaultdict(list)
    smallest: dict[str, list[Any]] = collections.defaultdict(list)
    signatures: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    breakdown: dict[str, dict[str, collections.Counter[str]]] = collections.defaultdict(
        lambda: collections.defaultdict(collections.Counter)
    )
    verdicts: collections.Counter[str] = collections.Counter()
    raw_status: collections.Counter[str] = collections.Counter()
    raw_failures: list[dict[str, Any]] = []
    verdict_dtypes: dict[str, collections.Counter[str]] = collections.defaultdict(
        collections.Counter
    )
    verdict_examples: dict[str, list[Any]] = collections.defaultdict(list)

    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
    ) as progress:
        task = progress.add_task("cases", total=len(cases))
        bad = 0
        for k, case in enumerate(cases):
            outcome = pc.run_case(case)
            for name in outcome.problems or ("ok",):
                counts[name] += 1
                for facet in ("mode", "dtype", "mesh"):
                    breakdown[name][facet][str(getattr(case, facet))] += 1
                breakdown[name]["kind"][case.kind] += 1
                if name == "ok":
                    continue
                if len(first[name]) < args.examples:
                    first[name].append(outcome)
                smallest[name].append(outcome)
                smallest[name].sort(key=lambda o: _size(o.case))
                del smallest[name][args.examples :]
                for note in outcome.notes:
                    if note.startswith(f"{name}:"):
                        signatures[name][_signature(note)] += 1
                if name == "wrong-result" and outcome.raw is not None:
                    breakdown[name]["raw jit"][outcome.raw.status] += 1
            verdict = outcome.collectives_verdict()
            if verdict is not None:
                verdicts[verdict] += 1
                verdict_dtypes[verdict][case.dtype] += 1
                if verdict != "same":
                    kept = verdict_examples[verdict]
                    kept.append(outcome)
                    kept.sort(key=lambda o: (o.case.dtype in ("float64", "int64"), _size(o.case)))
                    del kept[args.examples :]
            if outcome.raw is not None:
                raw_status[outcome.raw.status] += 1
                if outcome.raw.status != "ok" and len(raw_failures) < 10:
                    raw_failures.append(
                        {"repro": case.describe(), "problems": list(outcome.problems)}
                        | outcome.raw.to_json()
                    )
            bad += not outcome.ok
            progress.update(task, advance=1, description=f"cases ({bad} failing)")
            if k % 200 == 199:
                jax.clear_caches()  # thousands of programs: keep memory bounded

    classes = sum(1 for c in counts if c != "ok")
    summary = {
        "command": " ".join(["python", "benchmarks/property_sweep.py", *sys.argv[1:]]),
        "cases": len(cases),
        "seed": args.seed,
        "jax": jax.__version__,
        "ok": counts.get("ok", 0),
        "failing": bad,
        "counts": dict(counts.most_common()),
        "classes": {k: v for k, v in pc.PROBLEMS.items() if k in counts},
        "signatures": {name: sig.most_common(12) for name, sig in sorted(signatures.items())},
        "breakdown": {
            name: {facet: dict(c.most_common()) for facet, c in facets.items()}
            for name, facets in sorted(breakdown.items())
        },
        "first": {name: [o.to_json() for o in found] for name, found in sorted(first.items())},
        "smallest": {
            name: [o.to_json() for o in found] for name, found in sorted(smallest.items())
        },
        "collectives_vs_raw_jit": dict(verdicts.most_common()),
        "collectives_vs_raw_jit_by_dtype": {
            v: dict(c.most_common()) for v, c in sorted(verdict_dtypes.items())
        },
        "collectives_examples": {
            v: [o.to_json() for o in found] for v, found in sorted(verdict_examples.items())
        },
        "raw_jit_status": dict(raw_status.most_common()),
        "raw_jit_failures": raw_failures,
    }
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=2) + "\n")

    console = Console()
    table = Table(
        title=f"{len(cases)} random sharded einsums (seed {args.seed}): {bad} failing, "
        f"{classes} classes"
    )
    table.add_column("class")
    table.add_column("cases", justify="right")
    table.add_column("smallest repro", overflow="fold")
    for name, n in counts.most_common():
        repro = smallest[name][0].case.describe() if smallest.get(name) else ""
        table.add_row(name, str(n), repro)
    console.print(table)
    console.print(f"collectives vs raw jit: {dict(verdicts.most_common())}")
    if args.out:
        console.print(f"summary written to {args.out}")


if __name__ == "__main__":
    main()
