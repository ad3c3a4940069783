"""Whether a checkpointed training step that shardwise runs (``plan(...).sharded()``) recomputes
what ``jax.jit`` of the same step recomputes, on the devices at hand: an MLP whose layers are
each under ``jax.checkpoint`` (``prevent_cse=True``, the default), its loss and gradients.

shardwise runs a plan by walking the traced program with each array put in its layout, and
inlines the checkpoint there without the optimisation barrier that JAX's own lowering puts on
its operands. XLA's CPU compiler merges the recomputed dots with the forward pass's ones
either way; on other platforms the barrier is what keeps them apart, and without it the
backward pass could read the forward pass's results instead of recomputing them (holding
what the checkpoint was there to free). This prints, for ``jax.jit`` and for the plan's
program on one device, the dots XLA compiles (beside the dots the step traces, the
recomputed ones included), its temporary and total bytes (and the plan's prediction of the
total), and the optimisation barriers lowered.

    python benchmarks/remat_check.py [--layers 4] [--width 2048] [--batch 2048] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--out", type=Path)
    given = parser.parse_args()

    import jax
    import jax.numpy as jnp

    import shardwise

    def layer(w: jax.Array, x: jax.Array) -> jax.Array:
        return jnp.tanh(x @ w)

    def loss(ws: list[jax.Array], x: jax.Array) -> jax.Array:
        for w in ws[:-1]:
            x = jax.checkpoint(layer)(w, x)
        return jnp.mean((x @ ws[-1]) ** 2)

    step = jax.value_and_grad(loss)
    S = jax.ShapeDtypeStruct
    ws = [S((given.width, given.width), "float32") for _ in range(given.layers)]
    args = (ws, S((given.batch, given.width), "float32"))
    device = jax.devices()[0]
    plan = shardwise.plan(step, *args, mesh=jax.make_mesh((1,), ("data",), devices=[device]))
    found: dict[str, Any] = {
        "platform": device.platform,
        "device_kind": getattr(device, "device_kind", ""),
        "jax": jax.__version__,
        "layers": given.layers,
        "width": given.width,
        "batch": given.batch,
        "dots_traced": sum(s.kind == "dot" for s in plan.graph.steps),
    }
    for name, fn in (("jax.jit", jax.jit(step)), ("shardwise", plan.sharded())):
        lowered = fn.lower(*args)
        compiled = lowered.compile()
        text = compiled.as_text() or ""
        stats = compiled.memory_analysis()
        found[name] = {
            "dots": _dots(text),
            "temp_bytes": int(stats.temp_size_in_bytes),
            "total_bytes": int(stats.argument_size_in_bytes + stats.output_size_in_bytes
                               + stats.temp_size_in_bytes - stats.alias_size_in_bytes),
            "barriers_lowered": lowered.as_text().count("optimization_barrier"),
        }  # fmt: skip
    found["shardwise"]["predicted_bytes"] = plan.chosen.predicted.memory_bytes
    for name in ("jax.jit", "shardwise"):
        print(f"{name:10} {found[name]}")
    if given.out:
        given.out.write_text(json.dumps(found, indent=1))


def _dots(hlo: str) -> int:
    """The matrix products of a compiled program: its ``dot`` instructions (within fusions
    too, whatever their layouts) and the GEMM library calls XLA makes on GPUs instead."""
    return len(re.findall(r"\sdot\(", hlo)) + len(re.findall(r'custom_call_target="__cublas', hlo))


if __name__ == "__main__":
    main()
