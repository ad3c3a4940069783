"""Check a result against a float64 NumPy reference, with a rigorous rounding bound."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardwise._op import Op


@dataclass(frozen=True, slots=True)
class Check:
    """How far a result is from the float64 reference, and whether that is within rounding."""

    max_abs_error: float
    tolerance: float
    ok: bool


def check_einsum(op: Op, arrays: Sequence[Any], result: Any) -> Check:
    """Compare ``result`` with ``np.einsum`` in float64.

    The bound is the classic one for a sum of ``K`` products computed in working precision:
    ``|error| <= (K + 2) * eps * sum(|a| * |b| ...)``, elementwise, with ``K`` the number of
    terms summed into each output element.
    """
    exact = [np.asarray(a, dtype=np.float64) for a in arrays]
    reference = np.einsum(op.equation, *exact)
    magnitude = np.einsum(op.equation, *(np.abs(a) for a in exact))
    sizes = op.sizes([a.shape for a in exact])
    terms = int(np.prod([sizes[i] for i in op.contracted], dtype=np.int64))
    eps = float(np.finfo(np.asarray(result).dtype).eps)
    error = np.abs(np.asarray(result, dtype=np.float64) - reference)
    bound = (terms + 2) * eps * magnitude + np.finfo(np.float64).tiny
    return Check(
        max_abs_error=float(error.max()) if error.size else 0.0,
        tolerance=float(bound.max()) if bound.size else 0.0,
        ok=bool(np.all(error <= bound)),
    )
