"""The bench workloads on a CUDA GPU, as a fraction of the GPU's HBM bandwidth.

Run where a CUDA GPU is at hand (after ``pip install -e '.[cuda13]'`` or ``'.[cuda]'``):

    python benchmarks/gpu_bench.py --out benchmarks/gpu-h200.json

It measures the device-to-device copy bandwidth (an H200 moves about 4.3 TB/s), then times
W1 (batched dot (1e7, 3) float32), W2 (4000×10000), W3 (matmul 4096² float32 and bfloat16)
and W4 (mean of 10000² float64, if x64 is available) with shardwise on a mesh of every GPU,
and with plain JAX, and reports each as a fraction of the roofline. On a machine without a
GPU it runs on the CPU devices and says so.
"""

from __future__ import annotations

import argparse
import json
from typing import Any


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--out", default="benchmarks/gpu-results.json")
    args = parser.parse_args()

    import jax

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import numpy as np

    import shardwise
    from shardwise._planner.layout import plan_arrays
    from shardwise._runtime.timing import median_seconds
    from shardwise._xla.lower import divided, jitted, place

    devices = jax.devices()
    mesh = shardwise.mesh(f"devices={len(devices)}")
    info = {
        "platform": devices[0].platform,
        "device_kind": getattr(devices[0], "device_kind", ""),
        "count": len(devices),
        "jax": jax.__version__,
    }
    big = jnp.ones((512 * 2**20 // 4,), jnp.float32)
    copy = jax.jit(lambda v: v * 1.0)
    hbm = 2 * big.nbytes / median_seconds(lambda: copy(big), args.repeat)
    info["copy_bandwidth_Bps"] = hbm
    rng = np.random.default_rng(0)
    rows = []

    def run(
        name: str,
        equation: str,
        arrays: list[np.ndarray],
        layout: str,
        flops: float,
        plain: Any,
        mean: bool = False,
    ) -> None:
        plan, jm = plan_arrays(equation, *arrays, mesh=mesh, layout=layout)
        placed = place(plan, jm, arrays)
        if mean:  # W4 as the suite runs it: shardwise.mean, one program with the division
            ours = median_seconds(lambda: shardwise.mean(placed[0], mesh=mesh), args.repeat)
            raw_fn = divided(plan, jm, arrays[0].size)
        else:
            ours = median_seconds(
                lambda: shardwise.einsum(equation, *placed, mesh=mesh, layout=layout), args.repeat
            )
            raw_fn = jitted(plan, jm)
        raw = median_seconds(lambda: raw_fn(*placed), args.repeat)
        theirs = median_seconds(lambda: plain(*placed), args.repeat)
        nbytes = sum(a.nbytes for a in arrays) + np.prod(plan.output_shape) * arrays[0].itemsize
        roof = max(nbytes / hbm, 0.0)
        rows.append(
            {
                "name": name,
                "equation": equation,
                "shapes": [list(a.shape) for a in arrays],
                "dtype": str(arrays[0].dtype),
                "shardwise_seconds": ours,
                "raw_jax_seconds": raw,
                "plain_jax_seconds": theirs,
                "bytes": int(nbytes),
                "flops": flops,
                "hbm_fraction": roof / ours,
                "tflops": flops / ours / 1e12,
            }
        )
        print(
            f"{name}: {ours * 1e3:.3f} ms, {roof / ours:.0%} of copy bandwidth, "
            f"{flops / ours / 1e12:.1f} TFLOP/s; plain JAX {theirs * 1e3:.3f} ms"
        )

    n = 10_000_000
    a, b = (rng.random((n, 3), dtype=np.float32) for _ in range(2))
    run("W1", "nd,nd->n", [a, b], "n=devices", 2 * n * 3, jax.jit(jax.vmap(jnp.dot)))
    a, b = (rng.random((4000, 10000), dtype=np.float32) for _ in range(2))
    run("W2", "nd,nd->n", [a, b], "n=devices", 2 * 4000 * 10000, jax.jit(jax.vmap(jnp.dot)))
    for dtype in (np.float32, jnp.bfloat16):
        m = rng.random((4096, 4096), dtype=np.float32).astype(dtype)
        run(
            f"W3 {np.dtype(dtype).name}",
            "mk,kn->mn",
            [m, m],
            "m=devices",
            2 * 4096**3,
            jax.jit(jnp.dot),
        )
    x64 = rng.random((10000, 10000))
    run("W4", "ij->", [x64], "i=devices", x64.size, jax.jit(jnp.mean), mean=True)
    with open(args.out, "w") as f:
        json.dump({"device": info, "workloads": rows}, f, indent=1)
    print(f"copy bandwidth {hbm / 1e12:.2f} TB/s on {info['device_kind']}; wrote {args.out}")


if __name__ == "__main__":
    main()
