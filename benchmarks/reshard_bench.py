"""What resharding disagreeing operands costs where XLA was already right: shardwise.einsum,
and shardwise's program with ``jnp.einsum`` as the local step (so only the resharding
differs), against plain ``jax.jit(jnp.einsum)`` with the same shardings; taking turns, medians.

    .venv/bin/python benchmarks/reshard_bench.py [--repeat 15] [--out benchmarks/reshard.json]

Each case has operands that split a shared index differently, so shardwise brings them to one
agreed layout (``with_sharding_constraint``) before the contraction, where plain jit lets XLA
choose. Both results are checked against NumPy; a case where plain jit is wrong is marked.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

CASES = [
    # name, equation, shapes, mesh, in_specs, out_spec
    ("S1 (v2 replicated)", "nd,nd->n", [(10**7, 3)] * 2, "devices=8", ["devices", None], "devices"),
    ("matmul, one operand whole", "ij,jk->ik", [(2048, 2048)] * 2, "x=2,y=4", ["-,x", None], None),
    ("batched dot, axes swapped", "nd,nd->n", [(4000, 10000)] * 2, "x=2,y=4", ["x,y", "y,x"], "x"),
    ("matmul, split vs whole", "ij,jk->ik", [(2048, 2048)] * 2, "x=2,y=4", ["x,y", "-,-"], "x"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    import jax

    jax.config.update("jax_num_cpu_devices", 8)
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding

    import shardwise
    from shardwise._model.mesh import MeshSpec, build_mesh
    from shardwise._model.plan import Plan
    from shardwise._xla.lower import lower

    rows: list[dict[str, Any]] = []
    rng = np.random.default_rng(0)
    for name, equation, shapes, mesh_text, in_specs, out_spec in CASES:
        mesh = build_mesh(MeshSpec.parse(mesh_text))
        arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        shardings = [
            NamedSharding(mesh, shardwise.Spec.parse(s).to_partition_spec()) for s in in_specs
        ]
        placed = [jax.device_put(a, s) for a, s in zip(arrays, shardings, strict=True)]
        out_sharding = NamedSharding(mesh, shardwise.Spec.parse(out_spec).to_partition_spec())
        raw = jax.jit(
            lambda *xs, eq=equation: jnp.einsum(eq, *xs),
            in_shardings=tuple(shardings),
            out_shardings=out_sharding,
        )
        options = {"mesh": mesh, "in_specs": in_specs, "out_specs": out_spec}

        def ours(placed: list[Any] = placed, eq: str = equation, o: Any = options) -> Any:
            return shardwise.einsum(eq, *placed, **o)

        def theirs(placed: list[Any] = placed, fn: Any = raw) -> Any:
            return fn(*placed)

        plan = Plan.make(equation, shapes, mesh=mesh_text, in_specs=in_specs, out_specs=out_spec)
        plain_fn = lower(plan, mesh, kernels=False)

        def plain(placed: list[Any] = placed, fn: Any = plain_fn) -> Any:
            return fn(*placed)

        runners = (("shardwise", ours), ("resharded einsum", plain), ("jit", theirs))

        expected = np.einsum(equation, *(a.astype(np.float64) for a in arrays))
        scale = float(np.abs(expected).max()) or 1.0
        errors = {
            label: float(np.abs(np.asarray(run()) - expected).max()) / scale
            for label, run in runners
        }
        times: dict[str, list[float]] = {label: [] for label, _ in runners}
        for r in range(args.repeat):  # taking turns, each first in turn, on the same machine
            for label, run in runners[r % 3 :] + runners[: r % 3]:
                start = time.perf_counter()
                jax.block_until_ready(run())
                times[label].append(time.perf_counter() - start)
        med = {k: statistics.median(v) for k, v in times.items()}
        expl = shardwise.explain_einsum(
            equation, shapes, mesh=mesh, in_specs=in_specs, out_specs=out_spec
        )
        rows.append(
            {
                "case": name,
                "equation": equation,
                "shapes": [list(s) for s in shapes],
                "mesh": mesh_text,
                "in_specs": in_specs,
                "out_spec": out_spec,
                "shardwise_ms": med["shardwise"] * 1e3,
                "resharded_einsum_ms": med["resharded einsum"] * 1e3,
                "jit_ms": med["jit"] * 1e3,
                "ratio": med["shardwise"] / med["jit"],
                "resharded_einsum_ratio": med["resharded einsum"] / med["jit"],
                "relative_error": errors,
                "shardwise_collectives": [c.to_json() for c in expl.collectives],
            }
        )
        print(
            f"{name:34s} shardwise {med['shardwise'] * 1e3:8.2f} ms, resharded einsum "
            f"{med['resharded einsum'] * 1e3:8.2f} ms, jit {med['jit'] * 1e3:8.2f} ms; "
            f"relative errors {', '.join(f'{k} {v:.1e}' for k, v in errors.items())}"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"repeat": args.repeat, "jax": jax.__version__, "cases": rows}, f, indent=1)


if __name__ == "__main__":
    main()
