"""Checks shared by the tests: every shard against its NumPy slice."""

from __future__ import annotations

import itertools
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
