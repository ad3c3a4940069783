"""Checks shared by the tests: every shard against its NumPy slice."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from shardwise import Spec
from shardwise._program.problem import Problem, total


def tolerance(dtype: Any, terms: int) -> dict[str, float]:
    """rtol/atol for a float result summing ``terms`` products."""
    eps = float(np.finfo(dtype).eps)
    return {"rtol": 4 * eps * max(terms, 1), "atol": 4 * eps * max(terms, 1)}


def assert_shards(result: jax.Array, expected: np.ndarray, mesh: Mesh, spec: Spec, **tol: float):
    """The result has the requested sharding and every device's shard equals the NumPy slice."""
    assert result.shape == expected.shape
    want = NamedSharding(mesh, spec.to_partition_spec())
    assert result.sharding.is_equivalent_to(want, expected.ndim), (result.sharding, want)
    shards = result.addressable_shards
    assert len(shards) == mesh.size
    for shard in shards:
        np.testing.assert_allclose(np.asarray(shard.data), expected[shard.index], **tol)


def brute_force(problem: Problem) -> tuple[tuple[int, ...], float]:
    """Every combination of choices, for tests on small problems."""
    best = min(
        itertools.product(*(range(len(c)) for c in problem.choices)),
        key=lambda c: total(problem, c),
    )
    return best, total(problem, best)


def alike_layers(seed: int, count: int, alike: bool) -> Problem:
    """A stack of ``count`` layers that do not fold (each joined to the next through a
    variable of its own): an activation ``h`` (4 choices), a weight ``w`` (3) and a dot ``f``
    (6) per layer, the dot joined to both and to the next activation, and each activation to
    the next by a skip edge too (a residual: the problem has cycles). ``alike``: every layer
    has the same costs (the same arrays); else each its own. Some choices cost far more than
    others (those dominated)."""
    rng = np.random.default_rng(seed)

    def layer() -> tuple[list[np.ndarray], list[np.ndarray]]:
        unary = [rng.uniform(0, 1, n) for n in (4, 3, 6)]
        unary[2][rng.integers(0, 6, 2)] += 10.0  # (two dot choices far worse)
        unary[0][rng.integers(0, 4)] += 10.0
        mats = [rng.uniform(0, 0.1, shape) for shape in ((4, 6), (3, 6), (6, 4), (4, 4))]
        return unary, mats

    shared = layer()
    choices, unary, edges = [], [], {}
    for k in range(count):
        costs, mats = shared if alike else layer()
        h, w, f, nxt = 3 * k, 3 * k + 1, 3 * k + 2, 3 * k + 3
        for n, u in zip((4, 3, 6), costs, strict=True):
            choices.append(tuple(range(n)))
            unary.append(u)
        edges[(h, f)], edges[(w, f)], edges[(f, nxt)] = mats[0], mats[1], mats[2]
        if k + 1 < count:
            edges[(h, nxt)] = mats[3]  # (the skip edge: a residual)
    choices.append(tuple(range(4)))  # (the last activation)
    unary.append(rng.uniform(0, 1, 4))
    return Problem.of(choices, unary, edges)


@contextlib.contextmanager
def persistent_cache(path: Path | None) -> Iterator[Path | None]:
    """JAX's persistent compilation cache on in ``path``, every program kept, or off where
    ``path`` is ``None`` (JAX sets the cache up once per process: it is reset on the way in
    and out, and whatever cache the process had is back after)."""
    from jax._src import compilation_cache

    before = (
        jax.config.jax_compilation_cache_dir,
        jax.config.jax_persistent_cache_min_compile_time_secs,
    )
    jax.config.update("jax_compilation_cache_dir", None if path is None else str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    compilation_cache.reset_cache()
    try:
        yield path
    finally:
        jax.config.update("jax_compilation_cache_dir", before[0])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", before[1])
        compilation_cache.reset_cache()


ANOTHER_MACHINE = {
    "name": "local-cpu-8", "platform": "cpu", "memory_bytes": None, "mesh": "data=2,model=4",
    "flops_per_s": {"float32": 2.155e10, "bfloat16": 2.996e10},
    "memory_Bps": 3.857e9, "matmul_Bps": 2.644e9, "conv_tap_s": 3.497e-08,
    "link": {"latency_s": 2.657e-4, "bandwidth_Bps": 1.374e9},
    "axis_links": {"data": {"latency_s": 2.333e-4, "bandwidth_Bps": 1.29e9},
                   "model": {"latency_s": 2.982e-4, "bandwidth_Bps": 1.457e9}},
    "gather": {"latency_s": 2.532e-4, "bandwidth_Bps": 1.93e9},
    "gather_links": {"data": {"latency_s": 2.204e-4, "bandwidth_Bps": 1.639e9},
                     "model": {"latency_s": 2.86e-4, "bandwidth_Bps": 2.22e9}},
}  # fmt: skip
"""A profile ``shardwise calibrate`` measured on a 2-core x86 machine with 24 GiB while it
was busy (collectives starting in 220–300 µs, a matmul moving 2.6 GB/s): its plans are
other plans than ``cpu-2core``'s, and they showed what the memory model missed (each case of
``test_library_models.test_the_plans_of_another_machines_profile`` had a plan outside 20% of
XLA's memory): a convolution made with its batch split and gathered whole before the bias
and the pooling (the ``replicated`` baseline's, 1.38×), a bias split on ``data`` broadcast
along a batch split on ``(data, model)`` (1.30×), and checkpointed layers recomputed as the
forward pass laid them out, which XLA merges with the forward pass (six plans at 0.79×)."""

A_RANDOM_PROFILE = {
    "name": "random-0", "platform": "cpu", "memory_bytes": None,
    "flops_per_s": {"float32": 6.498e9}, "memory_Bps": 9.906e9, "matmul_Bps": 3.770e8,
    "link": {"latency_s": 3.369e-4, "bandwidth_Bps": 1.942e8}, "conv_tap_s": 5.5e-8,
    "gather": {"latency_s": 7.925e-5, "bandwidth_Bps": 1.809e9},
}  # fmt: skip
"""The first profile ``benchmarks/library_random_profiles.py`` draws (seed 1), its figures
rounded to four digits: ``cpu-2core`` with slow links and slow matmuls. The Linen CNN step's
FSDP plan under it makes the convolution with its batch split on ``(data, model)`` and keeps
it with its channels split so, a move XLA makes through the whole gathered on ``model`` (it
had been predicted at 1.65× XLA's memory)."""
