"""The libraries' own models (``tests/library_models.py``: Flax NNX and Linen, Equinox, Haiku,
optax) planned, run and verified on 8 simulated CPU devices, one line per model: how long
planning took, whether ``.sharded()`` equals ``jax.jit``, how many plans' collectives equal the
compiled HLO's, how many plans' memory is within ±20% of ``memory_analysis()`` (and the
furthest), and each plan's predicted ÷ measured time (median of ``repeat`` turns). Planned with
the built-in profile ``cpu-2core`` unless ``--profile`` names another (a name or a file), or is
``calibrate``: this machine measured first (``shardwise calibrate``), the profile kept beside
``--out`` (or in a temporary folder). ``--dtype bfloat16`` (or ``float16``) casts every
float32 argument of each model (its parameters and its data) to that type first, as a user
who trains or serves in 16-bit floats holds them; ``.sharded()`` is then compared with
``jax.jit`` at that type's precision.

    .venv/bin/python benchmarks/library_models.py [--mesh data=2,model=4|explicit]
        [--repeat 5] [--profile cpu-2core|calibrate|NAME|FILE] [--dtype float32|bfloat16|float16]
        [--out FILE.json] [MODEL ...]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import jax

jax.config.update("jax_num_cpu_devices", 8)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import numpy as np  # noqa: E402
from calibrated import profile_for  # noqa: E402
from library_models import MODELS, TOLERANCES  # noqa: E402

import shardwise  # noqa: E402


HALF_TOLERANCE = (5e-2, 5e-2)
"""``.sharded()`` against ``jax.jit`` with 16-bit floats: a split contraction rounds each
device's partial sum to the type before they are summed (8 bits of bfloat16's mantissa)."""


def measure(
    name: str, mesh: Any, repeat: int, profile: str, dtype: str = "float32"
) -> dict[str, Any]:
    fn, args = MODELS[name]()
    if dtype != "float32":
        args = jax.tree.map(lambda a: a.astype(dtype) if a.dtype == np.float32 else a, args)
    start = time.perf_counter()
    p = shardwise.plan(fn, *args, mesh=mesh, profile=profile)
    planning = time.perf_counter() - start
    want, got = jax.jit(fn)(*args), p.sharded()(*args)
    rtol, atol = TOLERANCES.get(name, (1e-4, 1e-5))  # (the tests' own: float32, or bfloat16)
    if dtype != "float32":
        rtol, atol = HALF_TOLERANCE
    same = all(
        np.allclose(np.asarray(_data(a)), np.asarray(_data(b)), rtol=rtol, atol=atol)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True)
    )
    done = p.verify(repeat=repeat)
    ran = [q for q in done.plans if q.verified]
    memory = {q.name: q.verified.memory_bytes / q.predicted.memory_bytes for q in ran}
    times = {q.name: q.predicted.seconds / q.verified.seconds for q in ran}
    return {
        "model": name,
        "plan_seconds": round(planning, 3),
        "sharded_equals_jit": same,
        "plans": len(ran),
        "hlo_match": sum(q.verified.collectives_match for q in ran),
        "memory_within_20pct": sum(0.8 <= r <= 1.25 for r in memory.values()),
        "memory_ratio": {k: round(v, 3) for k, v in memory.items()},
        "predicted_over_measured": {k: round(v, 3) for k, v in times.items()},
        "ordered": done.ordered,
        "ordered_pairs": done.ordered_pairs,
        "chosen_vs_fastest": done.chosen_vs_fastest,
    }


def _data(x: Any) -> Any:
    return jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", default=list(MODELS))
    parser.add_argument("--mesh", default="data=2,model=4")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--profile", default="cpu-2core")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--out")
    given = parser.parse_args()
    profile = profile_for(given.profile, Path(given.out) if given.out else None, "data=2,model=4")
    mesh: Any = given.mesh
    if mesh == "explicit":
        mesh = jax.make_mesh((2, 4), ("data", "model"))
    rows = []
    for name in given.models:
        row = measure(name, mesh, given.repeat, profile, given.dtype)
        rows.append(row)
        worst = max(row["memory_ratio"].values(), key=lambda r: abs(np.log(r)))
        times = list(row["predicted_over_measured"].values())
        print(
            f"{name:16s} plan {row['plan_seconds']:6.2f} s  sharded=jit {row['sharded_equals_jit']}"
            f"  HLO {row['hlo_match']}/{row['plans']}  memory ±20% "
            f"{row['memory_within_20pct']}/{row['plans']} (furthest {worst:.2f}×)  "
            f"predicted/measured {min(times):.2f}–{max(times):.2f}",
            flush=True,
        )
    if given.out:
        found = {"mesh": given.mesh, "profile": given.profile, "dtype": given.dtype,
                 "jax": jax.__version__, "rows": rows}  # fmt: skip
        Path(given.out).write_text(json.dumps(found, indent=1))


if __name__ == "__main__":
    main()
