"""How long planning takes for a model written as a Python loop of layers, beside the same
model under ``lax.scan``: a stack of pre-LayerNorm transformer blocks and a stack of
``relu(h @ w)`` layers, 4, 12 and 24 layers deep, and a 2-block GPT in Flax NNX (d_model 64,
4 heads, seq 32, batch 8, vocab 256), with ``top=5`` and ``top=1``. Each program is planned
``--repeat`` times on mesh data=2,model=4 with profile cpu-2core (nothing runs on devices);
the median wall time of :func:`shardwise.plan` is printed, tracing included (JAX traces the
function anew each time).

    .venv/bin/python benchmarks/unrolled_planning.py [--repeat 5] [--layers 4,12,24]
        [--train] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from unrolled_models import mlp_stack, nnx_gpt, transformer_stack

import shardwise
from shardwise._program.models import loss_of

MESH = "data=2,model=4"
PROFILE = "cpu-2core"


def seconds(fn: Callable[..., Any], args: tuple[Any, ...], repeat: int, **options: Any) -> float:
    """The median wall time of planning ``fn(*args)``."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        shardwise.plan(fn, *args, mesh=MESH, profile=PROFILE, **options)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def stacks(layers: int, train: bool) -> dict[str, tuple[Callable[..., Any], tuple[Any, ...]]]:
    """Each stack, unrolled and under ``lax.scan`` (their training steps with ``train``)."""
    out = {}
    for name, make in (("transformer", transformer_stack), ("mlp", mlp_stack)):
        for scan in (False, True):
            fn, (x, params) = make(layers, scan)
            label = f"{name} {layers} {'scan' if scan else 'unrolled'}"
            out[label] = (loss_of(fn), (params, x, x)) if train else (fn, (x, params))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--layers", default="4,12,24")
    parser.add_argument("--train", action="store_true", help="plan the training steps")
    parser.add_argument("--out", type=Path)
    ns = parser.parse_args()
    fn, args = mlp_stack(2, scan=True)
    shardwise.plan(fn, *args, mesh=MESH, profile=PROFILE)  # imports and first compilations
    found: dict[str, float] = {}
    for layers in (int(n) for n in ns.layers.split(",")):
        for label, (fn, args) in stacks(layers, ns.train).items():
            found[label] = seconds(fn, args, ns.repeat, train=ns.train)
            print(f"{label:28} {found[label]:8.3f} s", flush=True)
        for name in ("transformer", "mlp"):
            ratio = found[f"{name} {layers} unrolled"] / found[f"{name} {layers} scan"]
            print(f"{name} {layers}: unrolled / scan = {ratio:.1f}", flush=True)
    try:
        fn, args = nnx_gpt()
    except ImportError:
        print("Flax is not installed: no GPT")
    else:
        for top in (5, 1):
            found[f"nnx gpt2 top={top}"] = seconds(fn, args, ns.repeat, top=top)
            print(f"{f'nnx gpt2 top={top}':28} {found[f'nnx gpt2 top={top}']:8.3f} s", flush=True)
    if ns.out:
        ns.out.write_text(json.dumps(found, indent=1))


if __name__ == "__main__":
    main()
