"""The ways to split a number of devices over named roles, and which a model can take.

A split is one size per role (``fsdp=64,tensor=4``), its product the devices. A model bounds
the roles: the batch roles together must divide the batch's rows, the sequence roles the
sequence length, ``tensor`` the heads and :data:`MAX_TENSOR`. Where no split of a device
count divides the model, :func:`most_usable` finds the most devices some split can use.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence

ROLES = ("data", "fsdp", "fsdp_transpose", "sequence", "context", "tensor", "expert")
"""The roles a mesh axis can take: MaxText's ``ici_<role>_parallelism`` settings."""
BATCH_ROLES = ("data", "fsdp", "fsdp_transpose")
"""Roles whose sizes together must divide the batch (each splits the batch's rows)."""
SEQUENCE_ROLES = ("sequence", "context")
"""Roles whose size must divide the sequence length."""
MAX_TENSOR = 16
"""Most ways of tensor parallelism tried by default: past 16 ways the book finds it
communication-bound on every accelerator profiled (training.md, ``Y < n_axes · F / 2550``)."""


def factorisations(n: int, parts: int) -> Iterator[tuple[int, ...]]:
    """Every ordered way of writing ``n`` as a product of ``parts`` whole numbers ≥ 1.

    >>> sorted(factorisations(4, 2))
    [(1, 4), (2, 2), (4, 1)]
    """
    if parts == 1:
        yield (n,)
        return
    for d in divisors(n):
        for rest in factorisations(n // d, parts - 1):
            yield (d, *rest)


def divisors(n: int) -> list[int]:
    """The divisors of ``n``, ascending.

    >>> divisors(12)
    [1, 2, 3, 4, 6, 12]
    """
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def mesh_text(roles: Sequence[str], sizes: Sequence[int]) -> str:
    """The mesh text of a split, roles of size 1 left out (all of size 1: the first role).

    >>> mesh_text(("data", "fsdp", "tensor"), (1, 4, 2))
    'fsdp=4,tensor=2'
    """
    kept = [f"{r}={n}" for r, n in zip(roles, sizes, strict=True) if n > 1]
    return ",".join(kept) or f"{roles[0]}=1"


def why_not(
    split: dict[str, int], max_tensor: int, batch: int | None, seq: int | None,
    heads: int | None,
) -> str | None:  # fmt: skip
    """Why a split is pruned before planning, or ``None``."""
    tensor = split.get("tensor", 1)
    if tensor > max_tensor:
        return f"tensor={tensor} is over {max_tensor} ways (max_tensor)"
    if heads is not None and heads % tensor:
        return f"tensor={tensor} does not divide the {heads} heads"
    ways = math.prod(split.get(r, 1) for r in BATCH_ROLES)
    if batch is not None and batch % ways:
        named = "×".join(f"{r}" for r in BATCH_ROLES if split.get(r, 1) > 1)
        return f"{named}={ways} does not divide the batch {batch}"
    cut = math.prod(split.get(r, 1) for r in SEQUENCE_ROLES)
    if seq is not None and seq % cut:
        return f"sequence ways {cut} do not divide the sequence length {seq}"
    return None


def most_usable(
    devices: int, roles: Sequence[str], max_tensor: int, batch: int | None, seq: int | None,
    heads: int | None,
) -> int | None:  # fmt: skip
    """The most devices, fewer than ``devices``, that some split over ``roles`` can use where
    every role is bounded by the model (a batch role by the batch, a sequence role by the
    sequence length, ``tensor`` by ``max_tensor``); ``None`` where none is (a role bounded by
    nothing splits any count) or no split can use any.

    >>> most_usable(8960, ("fsdp", "tensor"), 16, 2048, 2048, 64)
    8192
    """
    options: list[list[int]] = []
    for r in roles:
        if r in BATCH_ROLES and batch is not None:
            options.append(divisors(batch))
        elif r in SEQUENCE_ROLES and seq is not None:
            options.append(divisors(seq))
        elif r == "tensor":
            options.append(list(range(1, max_tensor + 1)))
        else:
            return None
    best = 0
    for sizes in itertools.product(*options):
        n = math.prod(sizes)
        if best < n < devices:
            split = dict(zip(roles, sizes, strict=True))
            if why_not(split, max_tensor, batch, seq, heads) is None:
                best = n
    return best or None


def idle(
    devices: int, used: int, roles: Sequence[str], max_tensor: int, batch: int | None,
    seq: int | None, heads: int | None,
) -> str:  # fmt: skip
    """Why only ``used`` of ``devices`` are split, in words.

    >>> print(idle(8960, 8192, ("fsdp", "tensor"), 16, 2048, None, 64))  # doctest: +ELLIPSIS
    no split of 8960 devices ... (the batch 2048, 64 heads, ...): 8192 of them are used, 768 idle
    """
    bounds = [f"the batch {batch}" if batch is not None else "",
              f"the sequence length {seq}" if seq is not None else "",
              f"{heads} heads" if heads is not None else "",
              f"at most {max_tensor} ways of tensor" if "tensor" in roles else ""]  # fmt: skip
    return (
        f"no split of {devices} devices over {', '.join(roles)} divides the model "
        f"({', '.join(b for b in bounds if b)}): {used} of them are used, {devices - used} idle"
    )
