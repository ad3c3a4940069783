"""One record for a collective, predicted or compiled: its HLO kind, the mesh axes its device
groups span, the bytes of its result on one device, and where known the op and the user's
``file:line`` behind it. :class:`~shardwise._model.cost.PredictedCollective` adds what the
cost model says of it; :class:`~shardwise._xla.hlo.Collective` what the compiled HLO says."""

from __future__ import annotations

from dataclasses import dataclass, field

import jax.numpy as jnp


@dataclass(frozen=True, slots=True)
class Collective:
    """A collective.

    Attributes:
        kind: its HLO kind (``all-reduce``, ``all-gather``, ``reduce-scatter``,
            ``all-to-all``, ``collective-permute``).
        mesh_axes: the mesh axes its device groups span.
        bytes: the size of its result on one device.
        op_name: the op behind it (a program's ``dot_general``; the HLO metadata's
            ``jit(f)/dot_general``), ``""`` where none is known.
        source: the user's ``file:line`` behind it, ``""`` where none is known.
    """

    kind: str
    mesh_axes: tuple[str, ...]
    bytes: int
    op_name: str = field(default="", kw_only=True)
    source: str = field(default="", kw_only=True)

    @property
    def group(self) -> tuple[str, tuple[str, ...]]:
        """Its kind and mesh axes: what two collectives are compared by."""
        return self.kind, self.mesh_axes

    def to_json(self) -> dict[str, object]:
        """The contract's form: ``{"kind", "mesh_axes", "bytes"}``."""
        return {"kind": self.kind, "mesh_axes": list(self.mesh_axes), "bytes": self.bytes}


def wire_itemsize(dtype: str, platform: str) -> int:
    """Bytes per element that a collective of ``dtype`` moves on ``platform``'s devices: XLA's
    CPU backend computes bfloat16 in float32 and so gathers, sums and exchanges it as float32
    (seen in the compiled HLO: ``f32`` all-gathers and all-reduces between converts);
    elsewhere, and for every other dtype, the dtype's own width.

    >>> wire_itemsize("bfloat16", "cpu"), wire_itemsize("bfloat16", "gpu")
    (4, 2)
    """
    return 4 if platform == "cpu" and str(dtype) == "bfloat16" else int(jnp.dtype(dtype).itemsize)


def wire_bytes(nbytes: int, dtype: str, platform: str) -> int:
    """``nbytes`` of ``dtype`` as a collective on ``platform``'s devices moves them
    (:func:`wire_itemsize`).

    >>> wire_bytes(1024, "bfloat16", "cpu"), wire_bytes(1024, "float32", "cpu")
    (2048, 1024)
    """
    return nbytes // int(jnp.dtype(dtype).itemsize) * wire_itemsize(dtype, platform)
