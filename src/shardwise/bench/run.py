"""Run a benchmark suite: every workload by shardwise, the raw JAX program it builds, and
every installed peer, alternated within one process; medians; the machine's limits."""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from shardwise._runtime.timing import alternate, paired_ratio
from shardwise.bench.workloads import PEERS, Workload, installed, seed_workloads

SUITES = ("seed", "full", "tiny")
"""``seed``: W1–W4 at the tutorial's sizes; ``full``: seed plus W1's time against N;
``tiny``: the same code paths at test sizes."""

CURVE = {"seed": (10**5, 10**6, 10**7, 10**8), "tiny": (1_000, 8_000)}


def correct(result: Any, reference: np.ndarray, terms: int) -> tuple[bool, float]:
    """Within the rounding bound of a sum of ``terms`` products (data are non-negative)."""
    got = np.asarray(result, dtype=np.float64)
    eps = float(np.finfo(np.asarray(result).dtype).eps)
    error = float(np.abs(got - reference).max()) if reference.size else 0.0
    bound = (terms + 2) * eps * float(np.abs(reference).max()) + 1e-300
    return error <= bound and got.shape == reference.shape, error


def run_workload(
    w: Workload,
    peers: Sequence[str],
    repeat: int,
    machine: dict[str, Any],
    probe: tuple[Callable[[], Any], int] | None = None,
) -> dict[str, Any]:
    """Time one workload; every runner's result is checked against float64 NumPy first.

    ``probe`` (a read and its bytes, see :func:`~shardwise.bench.machine.bandwidth_probe`)
    takes turns with the runners; the bandwidth it shows in that window gives
    ``roofline_fraction``, the machine's best figure ``roofline_fraction_machine``."""
    runners = {"shardwise": w.shardwise(), "raw": w.raw()}
    for p in peers:
        if p in w.peers and installed(p):
            runners[p] = w.peers[p]()
    reference = w.reference()
    checks = {name: correct(fn(), reference, w.terms) for name, fn in runners.items()}
    timed: dict[str, Callable[[], Any]] = dict(runners)
    if probe is not None:
        timed["probe"] = probe[0]
    seconds = alternate(timed, repeat)
    ours = seconds["shardwise"]
    window_gbps = probe[1] / seconds["probe"] / 1e9 if probe is not None else None
    # the layer's cost is a few tens of microseconds a call: measured in close pairs, about
    # two seconds of them, so that the machine's drift does not swamp it
    pairs = min(101, max(repeat, int(1.0 / max(seconds["raw"], 1e-6))))
    overhead = paired_ratio(runners["shardwise"], runners["raw"], pairs) - 1
    flop_time = w.flops / (machine["sgemm_gflops"] * 1e9)
    best = max(w.nbytes / (machine["memory_gbps"] * 1e9), flop_time)
    roofline = max(w.nbytes / (window_gbps * 1e9), flop_time) if window_gbps else best
    peer_times = {p: seconds[p] for p in runners if p in PEERS}
    return {
        "name": w.name,
        "title": w.title,
        "shardwise_seconds": ours,
        "raw_jax_seconds": seconds["raw"],
        "layer_overhead": overhead,
        "bytes": w.nbytes,
        "flops": w.flops,
        "roofline_seconds": roofline,
        "roofline_fraction": roofline / ours,
        "memory_gbps_window": window_gbps,
        "roofline_fraction_machine": best / ours,
        "gflops": w.flops / ours / 1e9,
        "peers": peer_times,
        "ratios": {p: t / ours for p, t in peer_times.items()},
        "correct": {name: ok for name, (ok, _) in checks.items()},
        "max_abs_error": {name: err for name, (_, err) in checks.items()},
    }


def w1_curve(sizes: Sequence[int], repeat: int) -> list[dict[str, Any]]:
    """W1's time against N for shardwise and NumPy (how cost grows with work)."""
    from shardwise.bench.workloads import batched_dot

    points = []
    for n in sizes:
        n -= n % 8
        w = batched_dot("W1", "", n, 3, "devices=8", "devices", "devices", (n // 8, 3))
        seconds = alternate({"shardwise": w.shardwise(), "numpy": w.peers["numpy"]()}, repeat)
        points.append(
            {"n": n, "bytes": w.nbytes, **{f"{k}_seconds": v for k, v in seconds.items()}}
        )
        del w
        gc.collect()
    return points


def run_bench(
    suite: str = "seed",
    peers: Sequence[str] = PEERS,
    repeat: int = 7,
    curve: bool | None = None,
    on_step: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The ``shardwise bench --json`` document."""
    import jax

    from shardwise.bench.machine import bandwidth_probe, host, measure_machine

    def step(what: str) -> None:
        if on_step is not None:
            on_step(what)

    x64 = bool(jax.config.read("jax_enable_x64"))
    jax.config.update("jax_enable_x64", True)  # W4 is float64, as in the tutorial
    try:
        step("measuring the machine's memory bandwidth and sgemm")
        tiny = suite == "tiny"
        machine = measure_machine(
            nbytes=8 * 10**6 if tiny else 320 * 10**6,
            gemm=128 if tiny else 2048,
            repeat=3 if tiny else 5,
        )
        probe = bandwidth_probe(8 * 10**6 if tiny else 320 * 10**6)
        results = []
        for build in seed_workloads(suite):
            w = build()
            step(f"{w.name}: {w.title}")
            results.append(run_workload(w, peers, repeat, machine, probe))
            del w
            gc.collect()
        doc: dict[str, Any] = {
            "suite": suite,
            "repeat": repeat,
            "devices": {"platform": jax.devices()[0].platform, "count": len(jax.devices())},
            "machine": machine,
            "host": host(peers),
            "workloads": results,
        }
        if curve if curve is not None else suite == "full":
            step("W1 against N")
            doc["w1_curve"] = w1_curve(CURVE["tiny" if tiny else "seed"], max(3, repeat // 2))
        return doc
    finally:
        jax.config.update("jax_enable_x64", x64)
