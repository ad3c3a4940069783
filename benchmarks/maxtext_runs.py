"""MaxText's published training runs (v5p, v5e, v4), predicted: for each row of MaxText's
performance tables (``maxtext_published.py``), plan the same training step (AdamW, float32
weights cast to bfloat16 where used: MaxText's defaults) at the row's batch, sequence, mesh
(``ici_*`` × slices) and remat policy on the built-in profile of its TPU, and report the
predicted step time and MFU beside the published MFU; with ``--choose``, also the planner's
own choice of mesh (fsdp × tensor over all the chips, and MaxText's own mesh) and remat
policy.

The model is MaxText's decoder as its configs resolve today (Llama-style: SwiGLU MLP,
grouped-query attention, head_dim 128, untied head), sized by the row's
``global_parameter_scale`` or ``base_*`` settings, with the batch, mesh and remat policy of
the row's script today (``--config head``, the default: the scripts have since cut the batch
where today's model needs more memory than 2023's), or those the row was measured with
(``--config published``; its model was 2023's, so its memory is not this model's).
``qkv_proj_offloaded`` (activations offloaded to the host) is planned as ``full``; flash
attention (``attention: flash``) as blockwise attention in plain JAX, which has its memory. MFU is
MaxText's: its own count of a
training step's model FLOPs (``calculate_tflops_training_per_device``: 6 × the matrix FLOPs
of the layers and the vocabulary head, causal attention halved, remat not counted) over
step time × the chip's peak bf16 FLOP/s. The time model is the planner's, from the vendor
figures of each profile: matrix products at peak FLOP/s, other ops at HBM bandwidth,
collectives over the ICI links where the mesh lies (and DCN between slices past a pod), all
added, nothing overlapped; no efficiency factor is fitted.

    python benchmarks/maxtext_runs.py --out benchmarks/maxtext_runs.json [--choose] [--tpu v5p]
"""

from __future__ import annotations

import argparse
import json
import runpy
import time
from pathlib import Path
from typing import Any

import shardwise
from shardwise._model.profile_files import load_profile
from shardwise._program.mesh_search import choose_mesh

PROFILES = {"v5p": "tpu-v5p", "v5e": "tpu-v5e", "v4": "tpu-v4"}
REMAT = {"minimal": "minimal", "full": "full", "qkv_proj_offloaded": "full"}
"""MaxText's remat policies as published (2023: ``minimal`` was
``checkpoint_dots_with_no_batch_dims``) by the built-in Llama's names."""
CHOICES = ("none", "minimal", "full")
DONATED = (0, 1)
"""The step's parameters and optimizer state, donated: MaxText jits its training step with
its state donated (``train.py``: ``donate_argnums=0``, the TrainState of both), so the new
state is written over the old."""


def maxtext_tflops(run: Any, batch: float, seq: int) -> float:
    """MaxText's model TFLOPs of one training step per device (maxtext_utils.py,
    ``calculate_tflops_training_per_device``) for the decoder as planned."""
    b, s, e, m = batch, seq, run.emb_dim, run.mlp_dim
    hq, hkv, d, n, v = (run.num_query_heads, run.num_kv_heads, run.head_dim,
                        run.num_decoder_layers, run.vocab_size)  # fmt: skip
    mlp = 6 * b * s * m * e
    qkv = 2 * b * s * e * (hq + 2 * hkv) * d
    out = 2 * b * s * e * hq * d
    attention = 4 * b * s * s * hq * d / 2
    vocab = 2 * b * s * e * v
    return (3 * (n * (mlp + qkv + out) + vocab) + 3 * n * attention) / 1e12


def config(run: Any, which: str) -> dict[str, Any]:
    """The row's batch, sequence, remat and mesh settings: its script's today (``head``) or
    when it was measured (``published``)."""
    if which == "published":
        return dict(run.as_published)
    return {
        "per_device_batch_size": run.per_device_batch_size,
        "ici": run.ici,
        "dcn": run.dcn,
        "max_target_length": run.max_target_length,
        "remat_policy": run.remat_policy,
        "attention": run.attention,
    }


def program(run: Any, remat: str, published: dict[str, Any]) -> tuple[Any, Any]:
    """The row's AdamW training step and its arguments under ``remat``, its attention flash
    attention where the row's is (every row but 2023's v4 ones)."""
    return shardwise.model(
        "llama",
        batch=int(published["per_device_batch_size"] * run.num_chips),
        seq=published["max_target_length"],
        hidden=run.emb_dim,
        layers=run.num_decoder_layers,
        heads=run.num_query_heads,
        kv_heads=run.num_kv_heads,
        head_dim=run.head_dim,
        ffn=run.mlp_dim,
        vocab=run.vocab_size,
        train=True,
        optimizer="adamw",
        dtype="bfloat16",
        master=True,
        remat=remat,
        attention="flash" if published.get("attention") == "flash" else "dot_product",
    )


def maxtext_mesh(published: dict[str, Any]) -> str:
    """MaxText's mesh: its data axis over the slices (DCN) and within them, fsdp and tensor."""
    ici, dcn = published["ici"], published["dcn"]
    sizes = {a: ici.get(a, 1) * dcn.get(a, 1) for a in ("data", "fsdp", "tensor")}
    return ",".join(f"{a}={n}" for a, n in sizes.items() if n > 1)


def predict(run: Any, choose: bool, published: dict[str, Any]) -> dict[str, Any]:
    profile = load_profile(PROFILES[run.tpu])
    peak = run.peak_tflops_per_chip
    tflops = maxtext_tflops(run, published["per_device_batch_size"],
                            published["max_target_length"])  # fmt: skip
    remat = REMAT[published["remat_policy"]]
    fn, args = program(run, remat, published)
    start = time.perf_counter()
    mesh = maxtext_mesh(published)
    # within the chip's memory, as MaxText's runs were (plan's default); where nothing
    # fits, the fastest plan, said in plan.over_memory
    plan = shardwise.plan(fn, *args, mesh=mesh, profile=profile, top=1, donate_argnums=DONATED)
    best = plan.chosen.predicted
    row: dict[str, Any] = {
        "tpu": run.tpu, "topology": run.topology, "slices": run.slices, "model": run.model,
        "chips": run.num_chips, "per_device_batch": published["per_device_batch_size"],
        "seq": published["max_target_length"], "remat": remat, "mesh": mesh,
        "attention": published.get("attention"),
        "published_mfu": run.published_mfu, "model_tflops_per_device": tflops,
        "predicted_seconds": best.seconds, "predicted_mfu": tflops / (best.seconds * peak),
        "overlapped_seconds": best.overlapped_seconds,
        "overlapped_mfu": tflops / (best.overlapped_seconds * peak),
        "memory_gib": best.memory_bytes / 2**30,
        "fits": profile.memory_bytes is None or best.memory_bytes <= profile.memory_bytes,
        "plan_seconds": time.perf_counter() - start,
    }  # fmt: skip
    if choose:
        start = time.perf_counter()
        heads, ffn = run.num_query_heads, run.mlp_dim
        variants = {r: program(run, r, published) for r in CHOICES}
        choice = choose_mesh(fn, args, run.num_chips, profile, top=3,
                             batch=int(args[2].shape[0]), seq=published["max_target_length"],
                             heads=heads, ffn=ffn, limit=8, variants=variants,
                             donate_argnums=DONATED, also=(mesh,))  # fmt: skip
        top = choice.candidates[0]
        row |= {"chosen_mesh": choice.mesh, "chosen_remat": choice.variant,
                "chosen_seconds": top.seconds, "chosen_mfu": tflops / (top.seconds * peak),
                "chosen_fits": top.fits, "chosen_memory_gib": top.memory_bytes / 2**30,
                "choose_seconds": time.perf_counter() - start}  # fmt: skip
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--choose", action="store_true", help="also the planner's own choice")
    parser.add_argument("--tpu", choices=sorted(PROFILES), help="only this TPU's rows")
    parser.add_argument("--slices", type=int, help="only rows of this many slices")
    parser.add_argument("--config", choices=("head", "published"), default="head")
    parser.add_argument(
        "--attention",
        choices=("row", "dot_product"),
        default="row",
        help="the row's attention (flash, blockwise) or dot-product attention everywhere",
    )
    given = parser.parse_args()
    runs = runpy.run_path(str(Path(__file__).with_name("maxtext_published.py")))["RUNS"]
    rows = []
    for run in runs:
        if (given.tpu and run.tpu != given.tpu) or (given.slices and run.slices != given.slices):
            continue
        settings = config(run, given.config)
        if given.attention == "dot_product":
            settings["attention"] = "dot_product"
        row = predict(run, given.choose, settings)
        rows.append(row)
        ratio = row["predicted_mfu"] / row["published_mfu"]
        overlapped = row["overlapped_mfu"] / row["published_mfu"]
        extra = ""
        if given.choose:
            extra = (f" | choice {row['chosen_mesh']} remat={row['chosen_remat']} "
                     f"MFU {row['chosen_mfu']:.1%}")  # fmt: skip
        print(f"{run.model:>6} {run.slices}x {run.topology:<9} {row['mesh']:<28} "
              f"published {row['published_mfu']:.1%} predicted {row['predicted_mfu']:.1%} "
              f"({ratio:.2f}x), overlapped {row['overlapped_mfu']:.1%} ({overlapped:.2f}x) "
              f"{row['memory_gib']:.1f} GiB{extra}", flush=True)  # fmt: skip

    def within(key: str) -> int:
        return sum(0.75 <= r[key] / r["published_mfu"] <= 1.25 for r in rows)

    summary = {"config": given.config, "attention": given.attention, "rows": len(rows),
               "within_25_percent": within("predicted_mfu"),
               "overlapped_within_25_percent": within("overlapped_mfu"),
               "fit": sum(r["fits"] for r in rows)}  # fmt: skip
    print(summary)
    given.out.write_text(json.dumps({"summary": summary, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
