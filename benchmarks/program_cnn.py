"""The program planner on a CNN's training step: each plan's predicted time against the time
verify measures, on the devices at hand.

The MNIST-style Linen CNN of issue 34 (``nn.Conv`` 3x3 + relu + ``nn.avg_pool`` 2x2, twice,
then flatten + ``nn.Dense``; batch 32, 28x28x1 images, 8 and 16 features), its training step
(cross-entropy, SGD) planned on mesh data=2,model=4, then verified ``rounds`` times (each plan
compiled, its collectives compared with the HLO, its memory with ``memory_analysis()``, and
all timed taking turns, the median of ``repeat`` turns each). Per plan: predicted and measured
seconds, measured ÷ predicted, whether its collectives match, predicted ÷ XLA memory.

Run it under the shardwise to measure (``PYTHONPATH`` picks it), with a ``--label`` naming
that version; each run adds its label to ``--out``. Give the versions one profile file, so
that only the model differs (``--profile calibrate`` measures this machine first and keeps
the profile beside ``--out``):

    PYTHONPATH=src .venv/bin/python benchmarks/program_cnn.py --label after \\
        [--profile calibrate|NAME|FILE] [--rounds 3] [--repeat 7] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

from calibrated import profile_for

import shardwise

MESH = "data=2,model=4"


def cnn_step() -> tuple[Any, tuple[Any, ...]]:
    """The CNN's loss and its arguments (parameters, images, labels)."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    class CNN(nn.Module):
        @nn.compact
        def __call__(self, x: Any) -> Any:
            x = nn.avg_pool(nn.relu(nn.Conv(8, (3, 3))(x)), (2, 2), (2, 2))
            x = nn.avg_pool(nn.relu(nn.Conv(16, (3, 3))(x)), (2, 2), (2, 2))
            return nn.Dense(10)(x.reshape(x.shape[0], -1))

    model = CNN()
    x = jnp.ones((32, 28, 28, 1), jnp.float32)
    y = jnp.zeros((32,), jnp.int32)
    params = model.init(jax.random.key(0), x)

    def loss(params: Any, x: Any, y: Any) -> Any:
        logp = jax.nn.log_softmax(model.apply(params, x))
        return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))

    return loss, (params, x, y)


def _round(checked: shardwise.ProgramPlan) -> dict[str, Any]:
    out = {}
    for p in checked.plans:
        v = p.verified
        if v is None:
            continue
        out[p.name] = {
            "predicted": p.predicted.seconds,
            "measured": v.seconds,
            "ratio": v.seconds / p.predicted.seconds,
            "collectives_match": bool(v.collectives_match),
            "memory_ratio": p.predicted.memory_bytes / v.memory_bytes if v.memory_bytes else None,
            "inputs": [s.describe() for s in p.in_specs],
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--profile", default="calibrate")
    parser.add_argument("--out", default="benchmarks/program_cnn.json")
    args = parser.parse_args()
    out = Path(args.out)
    profile = profile_for(args.profile, out, MESH)
    shardwise.use_cpu_devices(8)
    loss, fn_args = cnn_step()
    start = time.perf_counter()
    plan = shardwise.plan(loss, *fn_args, mesh=MESH, profile=profile, train=True)
    planned = time.perf_counter() - start
    rounds = [_round(plan.verify(repeat=args.repeat)) for _ in range(args.rounds)]
    ratios = {n: statistics.median(r[n]["ratio"] for r in rounds) for n in rounds[0]}
    for name, ratio in ratios.items():
        row = rounds[0][name]
        print(f"{args.label} {name:14s} predicted {row['predicted'] * 1e3:7.2f} ms  measured ÷ "
              f"predicted {ratio:5.2f}  HLO {row['collectives_match']}  memory "
              f"{row['memory_ratio']:.2f}", flush=True)  # fmt: skip
    data = json.loads(out.read_text()) if out.exists() else {}
    data[args.label] = {
        "machine": platform.machine(),
        "profile": profile,
        "plan_seconds": planned,
        "repeat": args.repeat,
        "median_ratio": ratios,
        "worst_ratio": max(max(ratios.values()), 1 / min(ratios.values())),
        "rounds": rounds,
    }
    out.write_text(json.dumps(data, indent=1))
    print(f"wrote {args.label} to {out}")


if __name__ == "__main__":
    main()
