"""What-if at scale: plan one training step of a large MLP on a 16×16 TPU v5p mesh that is not
here, across batch sizes, and see where the planner moves from tensor-parallel plans to
data-parallel / FSDP ones.

The scaling book (jax-ml/scaling-book, training.md) puts the point where data parallelism and
FSDP become compute-bound at C / W_ici ≈ 4.59e14 / 1.8e11 ≈ 2550 tokens per device on v5p.

    python benchmarks/plan_sweep.py   # writes benchmarks/plan_sweep.json and .png
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import shardwise
from shardwise._model.profile import BUILTIN
from shardwise._planner.models import model

HERE = Path(__file__).resolve().parent
MESH = "data=16,model=16"
DEVICES = 256
HIDDEN, FFN = 8192, 32768
V5P = BUILTIN["tpu-v5p"]
THRESHOLD = V5P.flops("bfloat16") / (2 * V5P.link.bandwidth_Bps)  # C / W_ici, both directions
DATA = ("data-parallel", "fsdp")
TENSOR = ("megatron", "data×tensor")


def main() -> None:
    rows = []
    for power in range(0, 17):
        per_device = 2**power
        fn, args = model("mlp", batch=per_device * DEVICES, hidden=HIDDEN, ffn=FFN, train=True,
                         dtype="bfloat16")  # fmt: skip
        start = time.perf_counter()
        report = shardwise.plan(fn, *args, mesh=MESH, profile=V5P, train=True, top=1)
        seconds = {p.name: p.predicted.seconds for p in report.plans}
        best = seconds["search"]
        rows.append(
            {
                "tokens_per_device": per_device,
                "search_seconds": best,
                "in_specs": [s.describe() for s in report.chosen.in_specs],
                "baselines": {n: s / best for n, s in seconds.items() if n != "search"},
                "best_data_parallel": min(seconds[n] for n in DATA if n in seconds) / best,
                "best_tensor_parallel": min(seconds[n] for n in TENSOR if n in seconds) / best,
                "plan_seconds": time.perf_counter() - start,
            }
        )
        print(json.dumps(rows[-1]))
    out = {"mesh": MESH, "profile": "tpu-v5p", "hidden": HIDDEN, "ffn": FFN,
           "threshold_tokens_per_device": THRESHOLD, "rows": rows}  # fmt: skip
    (HERE / "plan_sweep.json").write_text(json.dumps(out, indent=1) + "\n")
    plot(out, HERE / "plan_sweep.png")


def plot(out: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [r["tokens_per_device"] for r in out["rows"]]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    ax.plot(
        x,
        [r["best_tensor_parallel"] for r in out["rows"]],
        "o-",
        label="best of Megatron, data×tensor",
    )
    ax.plot(
        x, [r["best_data_parallel"] for r in out["rows"]], "s-", label="best of data-parallel, FSDP"
    )
    threshold = out["threshold_tokens_per_device"]
    ax.axvline(
        threshold, color="grey", ls="--", label=f"C / W_ici ≈ {threshold:.0f} (scaling book)"
    )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("tokens per device (batch / 256 devices)")
    ax.set_ylabel("predicted time / search's plan")
    ax.set_title(
        f"MLP {HIDDEN}×{FFN} training step, bf16, TPU v5p {MESH} (planned, not run)", fontsize=9
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
