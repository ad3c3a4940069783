"""Planner accuracy on the devices at hand: `plan --verify` over the tutorial's workloads.

Runs every strategy of S1 (10⁷×3 batched dot, devices=8), S4 (4000×10000 batched dot,
x=2,y=4) and a 2048×2048 matmul (x=2,y=4), compares predicted with measured time, and
reports Spearman per workload and pooled, the HLO match rate, and how the auto-chosen
strategy's measured time compares with the measured best.

    .venv/bin/python benchmarks/plan_verify.py [--repeat 5] [--out benchmarks/plan_verify.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import shardwise

WORKLOADS = [
    ("S1", "nd,nd->n", [(10_000_000, 3)] * 2, "devices=8"),
    ("S4", "nd,nd->n", [(4000, 10000)] * 2, "x=2,y=4"),
    ("matmul", "mk,kn->mn", [(2048, 2048)] * 2, "x=2,y=4"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", default="benchmarks/plan_verify.json")
    args = parser.parse_args()
    shardwise.use_cpu_devices(8)
    import jax

    from shardwise._model.mesh import MeshSpec, build_mesh
    from shardwise._model.profile_files import default_profile
    from shardwise._planner.einsum import rank, verify
    from shardwise._runtime.timing import spearman

    results = []
    pooled_p: list[float] = []
    pooled_m: list[float] = []
    for name, eq, shapes, mesh_text in WORKLOADS:
        mesh = MeshSpec.parse(mesh_text)
        profile = default_profile(jax.devices()[0].platform, mesh.size)
        report = rank(shardwise.Op.parse(eq), shapes, mesh, "float32", profile)
        start = time.perf_counter()
        report = verify(report, build_mesh(mesh), repeat=args.repeat)
        done = [c for c in report.strategies if c.verified]
        predicted = [c.predicted.seconds for c in done]
        measured = [c.verified.seconds for c in done if c.verified]
        pooled_p += predicted
        pooled_m += measured
        best = min(measured)
        chosen = measured[0]
        row = {
            "workload": name,
            "equation": eq,
            "shapes": shapes,
            "mesh": mesh_text,
            "profile": profile.name,
            "strategies": len(done),
            "hlo_match": sum(c.verified.collectives_match for c in done if c.verified),
            "spearman": report.spearman,
            "chosen": done[0].strategy.describe(report.op),
            "chosen_measured_s": chosen,
            "best_measured_s": best,
            "chosen_over_best": chosen / best,
            "verify_seconds": time.perf_counter() - start,
            "pairs": [
                {"strategy": c.strategy.describe(report.op), "predicted_s": p, "measured_s": m}
                for c, p, m in zip(done, predicted, measured, strict=True)
            ],
        }
        results.append(row)
        print(
            f"{name:7s} {len(done):3d} strategies, HLO match {row['hlo_match']}/{len(done)}, "
            f"Spearman {report.spearman}, chosen {row['chosen']} at {chosen * 1e3:.1f} ms, "
            f"best measured {best * 1e3:.1f} ms ({chosen / best:.2f}×)"
        )
    rho = spearman(pooled_p, pooled_m)
    print(f"pooled Spearman over {len(pooled_p)} strategies: {rho}")
    with open(args.out, "w") as f:
        json.dump(
            {
                "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}",
                "jax": jax.__version__,
                "repeat": args.repeat,
                "pooled_spearman": rho,
                "workloads": results,
            },
            f,
            indent=1,
        )


if __name__ == "__main__":
    main()
