"""What-if at scale: plan one training step of a large MLP on a 16×16 TPU v5p mesh that is not
here, across batch sizes, and see where the planner moves from tensor-parallel plans to
data-parallel / FSDP ones.

The scaling book (jax-ml/scaling-book, training.md) puts the point where data parallelism and
FSDP become compute-bound at C / W_ici ≈ 4.59e14 / 1.8e11 ≈ 2550 tokens per device on v5p.
The same from the command line:

    shardwise plan --model mlp --hidden 8192 --ffn 32768 --train --dtype bfloat16 \\
        --mesh data=16,model=16 --profile tpu-v5p --sweep-batch 256..16777216 --plot sweep.png

    python benchmarks/plan_sweep.py   # writes benchmarks/plan_sweep.json and .png
"""

from __future__ import annotations

import json
from pathlib import Path

from shardwise._model.mesh import MeshSpec
from shardwise._model.profile import BUILTIN
from shardwise._program.sweep import sweep
from shardwise.render.sweep import save_sweep

HERE = Path(__file__).resolve().parent
MESH = MeshSpec.parse("data=16,model=16")
HIDDEN, FFN = 8192, 32768


def main() -> None:
    result = sweep(
        "mlp",
        [2**power * MESH.size for power in range(17)],  # 1 to 65536 tokens per device
        mesh=MESH,
        profile=BUILTIN["tpu-v5p"],
        train=True,
        hidden=HIDDEN,
        ffn=FFN,
        dtype="bfloat16",
    )
    out = {"hidden": HIDDEN, "ffn": FFN, **result.to_json()}
    (HERE / "plan_sweep.json").write_text(json.dumps(out, indent=1) + "\n")
    title = f"MLP {HIDDEN}×{FFN} training step, bf16, TPU v5p {MESH.describe()} (planned, not run)"
    save_sweep(result, HERE / "plan_sweep.png", title=title)
    print(f"switch at {result.switch} tokens per device; scaling book {result.threshold:.0f}")


if __name__ == "__main__":
    main()
