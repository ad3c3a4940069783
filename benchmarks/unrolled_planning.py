"""How long planning takes for a model written as a Python loop of layers, beside the same
model under ``lax.scan``: a stack of pre-LayerNorm transformer blocks and a stack of
``relu(h @ w)`` layers, 4, 12 and 24 layers deep, and a 2-block GPT in Flax NNX (d_model 64,
4 heads, seq 32, batch 8, vocab 256), with ``top=5`` and ``top=1``. Each program is planned
``--repeat`` times on mesh ``--mesh`` (data=2,model=4 by default) with profile cpu-2core
(nothing runs on devices); the median wall time of :func:`shardwise.plan` is printed, tracing
included (JAX traces the function anew each time), and the median after tracing (the time of
``jax.make_jaxpr``'s calls within the plan taken away), with each ratio. The JSON records the
mesh and glibc's ``MALLOC_*`` settings in the environment (which decide whether memory a
plan frees is handed back to the system and faulted in again by the next plan).

    .venv/bin/python benchmarks/unrolled_planning.py [--repeat 5] [--layers 4,12,24]
        [--train] [--mesh data=2,fsdp=2,model=2] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
from unrolled_models import mlp_stack, nnx_gpt, transformer_stack

import shardwise
from shardwise._program.models import loss_of

MESH = "data=2,model=4"
"""The mesh planned on by default (``--mesh``)."""
PROFILE = "cpu-2core"


def seconds(
    fn: Callable[..., Any], args: tuple[Any, ...], repeat: int, **options: Any
) -> tuple[float, float]:
    """The median wall time of planning ``fn(*args)``, and the median of that time less the
    time ``jax.make_jaxpr``'s traces took within it."""
    times, after = [], []
    for _ in range(repeat):
        traced.clear()
        start = time.perf_counter()
        shardwise.plan(fn, *args, profile=PROFILE, **options)
        times.append(time.perf_counter() - start)
        after.append(times[-1] - sum(traced))
    return statistics.median(times), statistics.median(after)


traced: list[float] = []
"""The seconds of each trace within the plan being timed (:func:`_timed_traces`)."""


def _timed_traces() -> None:
    """``jax.make_jaxpr`` made to add each trace's time to :data:`traced`."""
    make = jax.make_jaxpr

    def make_jaxpr(fun: Any, *a: Any, **k: Any) -> Any:
        trace = make(fun, *a, **k)

        @functools.wraps(trace)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return trace(*args, **kwargs)
            finally:
                traced.append(time.perf_counter() - start)

        return timed

    jax.make_jaxpr = make_jaxpr


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
    parser.add_argument("--mesh", default=MESH, help="the mesh to plan on (default: %(default)s)")
    parser.add_argument("--out", type=Path)
    ns = parser.parse_args()
    _timed_traces()
    fn, args = mlp_stack(2, scan=True)
    shardwise.plan(fn, *args, mesh=ns.mesh, profile=PROFILE)  # imports and first compilations
    found: dict[str, float] = {}
    for layers in (int(n) for n in ns.layers.split(",")):
        for label, (fn, args) in stacks(layers, ns.train).items():
            found[label], found[f"{label} after tracing"] = seconds(
                fn, args, ns.repeat, mesh=ns.mesh, train=ns.train
            )
            print(f"{label:28} {found[label]:8.3f} s  ({found[f'{label} after tracing']:.3f} s "
                  "after tracing)", flush=True)  # fmt: skip
        for name in ("transformer", "mlp"):
            u, c = f"{name} {layers} unrolled", f"{name} {layers} scan"
            ratio = found[u] / found[c]
            after = found[f"{u} after tracing"] / found[f"{c} after tracing"]
            print(f"{name} {layers}: unrolled / scan = {ratio:.1f} ({after:.1f} after tracing)",
                  flush=True)  # fmt: skip
    try:
        fn, args = nnx_gpt()
    except ImportError:
        print("Flax is not installed: no GPT")
    else:
        for top in (5, 1):
            found[f"nnx gpt2 top={top}"] = seconds(fn, args, ns.repeat, mesh=ns.mesh, top=top)[0]
            print(f"{f'nnx gpt2 top={top}':28} {found[f'nnx gpt2 top={top}']:8.3f} s", flush=True)
    if ns.out:
        malloc = {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")}
        ns.out.write_text(json.dumps({"mesh": ns.mesh, "malloc": malloc, **found}, indent=1))


if __name__ == "__main__":
    main()
