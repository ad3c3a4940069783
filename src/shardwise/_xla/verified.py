"""What the devices at hand did with a plan, one record for both planners (:class:`Verified`),
and the one comparison of a prediction's collectives with a compiled program's
(:func:`collectives_match`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shardwise._model.collective import Collective


@dataclass(frozen=True, slots=True)
class Verified:
    """What the devices at hand did with one strategy or plan.

    Attributes:
        collectives_match: whether the compiled collectives are the predicted ones
            (:func:`collectives_match`).
        seconds: the measured time, taking turns with the others verified alike
            (:func:`~shardwise._runtime.timing.alternate`).
        collectives: the compiled program's collectives, each with the op and
            ``file:line`` its HLO metadata gives.
        memory_bytes: the compiled program's arguments, results and temporaries per device
            (``None`` where XLA does not say, or it was not asked).
        sources_match: for a program plan, whether each compiled collective belongs to the op
            and source line predicted for it (``None``: not asked).
    """

    collectives_match: bool
    seconds: float
    collectives: tuple[Collective, ...]
    memory_bytes: int | None = None
    sources_match: bool | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "collectives_match": self.collectives_match,
            "seconds": self.seconds,
            "collectives": [
                c.to_json() | {"op": c.op_name, "source": c.source} for c in self.collectives
            ],
        }
        if self.sources_match is not None:
            out["sources_match"] = self.sources_match
        if self.memory_bytes is not None:
            out["memory_bytes"] = self.memory_bytes
        return out


def by_kind(found: Sequence[Collective]) -> dict[tuple[str, tuple[str, ...]], int]:
    """Bytes per (kind, mesh axes): XLA may combine or split collectives of one kind."""
    out: dict[tuple[str, tuple[str, ...]], int] = {}
    for c in found:
        out[c.group] = out.get(c.group, 0) + c.bytes
    return out


def kinds(found: Sequence[Collective]) -> dict[str, set[str]]:
    """Kinds present, each with the union of its mesh axes (XLA may split one sum in two)."""
    out: dict[str, set[str]] = {}
    for c in found:
        out.setdefault(c.kind, set()).update(c.mesh_axes)
    return out


def collectives_match(
    predicted: Sequence[Collective], compiled: Sequence[Collective], by_bytes: bool
) -> bool:
    """Whether a compiled program's collectives are the predicted ones: the same kinds, over
    the same mesh axes (an einsum's strategy: XLA may sum over two axes at once or one after
    the other); with ``by_bytes`` (a program's plan, whose collectives are predicted one per
    axis), the same bytes for each kind and mesh axes.

    >>> ar = Collective("all-reduce", ("x",), 8)
    >>> collectives_match([ar], [ar, ar], by_bytes=False), collectives_match([ar], [ar, ar], True)
    (True, False)
    """
    if by_bytes:
        return by_kind(predicted) == by_kind(compiled)
    return kinds(predicted) == kinds(compiled)
