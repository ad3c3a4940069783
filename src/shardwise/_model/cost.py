"""The cost model: pure functions from a strategy to memory, FLOPs, collectives and time.

Time is a roofline term plus an alpha-beta term per collective:

- roofline: ``max(flops / peak FLOP/s, bytes accessed / memory bandwidth)`` per device;
- a ring collective over ``p`` devices along one mesh axis moving ``n`` bytes per device:
  all-reduce ``2(p-1)·α + 2(p-1)/p · n/β``; all-gather and reduce-scatter
  ``(p-1)·α + (p-1)/p · n/β`` (the standard ring factors; Thakur, Rabenseifner and Gropp,
  "Optimization of Collective Communication Operations in MPICH", 2005). A collective over
  several axes is costed as one ring per axis, one after the other.

Where XLA on a platform does something other than the textbook, the model predicts what XLA
does: on CPU a scattered partial sum is an all-reduce (followed by a local slice), not a
reduce-scatter. An equation of three or more operands is contracted as ``jnp.einsum`` does it,
pairwise along opt_einsum's path (:func:`contraction_steps`), and XLA partitions each of those
steps on its own; which collectives that brings is read off the step that makes each partial
sum (:func:`_scatter_hops`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np
import opt_einsum  # type: ignore[import-untyped]  # (a dependency of JAX, untyped)

from shardwise._model.mesh import MeshSpec
from shardwise._model.op import Op
from shardwise._model.profile import Profile
from shardwise._model.spec import Entry, Layout
from shardwise._model.strategy import Strategy, reduce_axes

Step = tuple[tuple[int, ...], tuple[str, ...], str]
"""One step of an einsum: the places of its operands in the list of arrays left (each step
takes them out and puts its result at the end), their index strings, and its result's."""


@dataclass(frozen=True, slots=True)
class PredictedCollective:
    """A collective the strategy implies: kind, mesh axes, bytes of its result per device."""

    kind: str
    mesh_axes: tuple[str, ...]
    bytes: int
    seconds: float

    def to_json(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "mesh_axes": list(self.mesh_axes),
            "bytes": self.bytes,
            "seconds": self.seconds,
        }


@dataclass(frozen=True, slots=True)
class Prediction:
    """What one strategy costs on one device.

    Attributes:
        seconds: predicted time: roofline plus collectives.
        compute_seconds: FLOPs / peak FLOP/s.
        memory_seconds: bytes accessed / memory bandwidth.
        comm_seconds: the collectives' alpha-beta time.
        memory_bytes: operands' shards + output shard + temporaries (the partial result).
        flops: FLOPs of the local einsum.
        bytes_accessed: bytes the local einsum reads and writes.
        collectives: what the strategy implies, as XLA emits it on the profile's platform.
    """

    seconds: float
    compute_seconds: float
    memory_seconds: float
    comm_seconds: float
    memory_bytes: int
    flops: float
    bytes_accessed: int
    collectives: tuple[PredictedCollective, ...]

    @property
    def bound(self) -> str:
        """What limits it: ``compute``, ``memory`` or ``communication``."""
        roof = max(self.compute_seconds, self.memory_seconds)
        if self.comm_seconds > roof:
            return "communication"
        return "compute" if self.compute_seconds >= self.memory_seconds else "memory"

    def to_json(self) -> dict[str, object]:
        return {
            "seconds": self.seconds,
            "compute_seconds": self.compute_seconds,
            "memory_seconds": self.memory_seconds,
            "comm_seconds": self.comm_seconds,
            "memory_bytes": self.memory_bytes,
            "flops": self.flops,
            "bytes_accessed": self.bytes_accessed,
            "bound": self.bound,
            "collectives": [c.to_json() for c in self.collectives],
        }


def ring_seconds(
    kind: str, axes: Sequence[str], nbytes: int, mesh: MeshSpec, profile: Profile
) -> float:
    """Alpha-beta time of a ring collective over ``axes``, one ring per axis.

    >>> from shardwise._model.profile import BUILTIN
    >>> t = ring_seconds("all-reduce", ["x"], 10**6, MeshSpec.parse("x=4"), BUILTIN["h100"])
    >>> round(t * 1e6, 2)  # 6 × 10 µs + 1.5 × 1 MB / 450 GB/s
    63.33
    """
    total = 0.0
    factor = 2.0 if kind == "all-reduce" else 1.0
    for axis in axes:
        p = mesh.shape[axis]
        link = profile.link_for(axis)
        total += factor * ((p - 1) * link.latency_s + (p - 1) / p * nbytes / link.bandwidth_Bps)
    return total


def local_sizes(sizes: Mapping[str, int], layout: Layout, mesh: MeshSpec) -> dict[str, int]:
    """Each index's size on one device under ``layout``."""
    return {i: n // math.prod(mesh.shape[a] for a in layout.axes_of(i)) for i, n in sizes.items()}


@functools.lru_cache(maxsize=512)
def contraction_steps(op: Op, shapes: tuple[tuple[int, ...], ...]) -> tuple[Step, ...]:
    """The steps ``jnp.einsum`` computes ``op`` in: one for one or two operands, else one per
    pair along the path opt_einsum's ``"auto"`` optimizer picks for these (global) shapes, as
    JAX 0.10.2 calls it.

    >>> contraction_steps(Op.parse("ij,jk,kl->il"), ((4, 4), (4, 4), (4, 4)))
    (((1, 0), ('jk', 'ij'), 'ki'), ((1, 0), ('ki', 'kl'), 'il'))
    >>> contraction_steps(Op.parse("ab,ab,c->c"), ((2, 2), (2, 2), (4,)))
    (((1, 0), ('ab', 'ab'), ''), ((1, 0), ('', 'c'), 'c'))
    """
    if len(op.inputs) <= 2:
        return ((tuple(reversed(range(len(op.inputs)))), op.inputs[::-1], op.output),)
    _, contractions = opt_einsum.contract_path(
        op.equation, *shapes, shapes=True, einsum_call=True, use_blas=True, optimize="auto"
    )
    steps: list[Step] = []
    for contraction in contractions:
        inputs, _, result = str(contraction[2]).partition("->")
        places = tuple(int(k) for k in contraction[0])
        steps.append((places, tuple(inputs.split(",")), result))
    return tuple(steps)


@dataclass(frozen=True, slots=True)
class _Hop:
    """A partial sum XLA's CPU partitioner scatters with a permute (see :func:`_scatter_hops`).

    Attributes:
        axis: the mesh axis (of two devices) the step's own partial sum is over.
        idle: the mesh axis that held only replicas, whose major half splits the step's result.
        hop: the mesh axes the permute spans.
        result: the step's result indices.
        held: how the step's result is laid out: index → mesh axes.
        whole: whether the step is the whole einsum (one or two operands).
    """

    axis: str
    idle: str
    hop: tuple[str, ...]
    result: str
    held: Mapping[str, Entry]
    whole: bool


def _scatter_hops(
    op: Op, shapes: tuple[tuple[int, ...], ...], mesh: MeshSpec, strategy: Strategy
) -> tuple[_Hop, ...]:
    """The steps where XLA's CPU partitioner (jax 0.10.2) scatters a partial sum as an
    all-reduce of the half each device keeps and a permute that puts each half on its owner.

    It does so for a ``dot_general`` (an index contracted between its two operands, not a
    reduce of an index only one of them has) whose own partial sum is over one mesh axis of two
    devices, when its result is laid out with that axis on one of its dimensions and some
    other mesh axis holds only replicas across that step: it computes the half on that idle
    axis instead, and swaps halves (measured). The result of a step is laid out as the output
    is (the final step is the output), as far as that leaves the mesh axes of an index
    contracted later (which keeps its layout) alone: a dimension keeps the major axes of its
    output entry up to the first such axis.
    """
    layout = strategy.layout
    out_entries = dict(zip(op.output, strategy.out_spec.padded(len(op.output)), strict=True))
    steps = contraction_steps(op, shapes)
    arrays = [{i: layout.axes_of(i) for i in term} for term in op.inputs]
    hops: list[_Hop] = []
    for places, inputs, result in steps:
        taken = [arrays.pop(k) for k in places]
        have: dict[str, Entry] = {}  # how the operands split each index (an intermediate's way)
        for array in taken:
            for i, e in array.items():
                if i not in have or e != layout.axes_of(i):
                    have[i] = e
        later = {a for i in result if i not in out_entries for a in layout.axes_of(i)}
        held: dict[str, Entry] = {}
        for i in result:
            entry = out_entries.get(i, layout.axes_of(i))
            cut = next(
                (k for k, a in enumerate(entry) if a in later and i in out_entries), len(entry)
            )
            held[i] = entry[:cut]
        arrays.append(held)
        if len(inputs) != 2:
            continue
        lhs, rhs = inputs
        summed = {i for i in (*lhs, *rhs) if i not in result}
        dotted = [i for i in summed if i in lhs and i in rhs]
        partial = {a for i in summed for a in layout.axes_of(i) if mesh.shape[a] > 1}
        dot_axes = {a for i in dotted for a in layout.axes_of(i) if mesh.shape[a] > 1}
        if len(partial) != 1 or partial != dot_axes:
            continue
        (axis,) = partial
        placed = {a for e in held.values() for a in e}
        if mesh.shape[axis] != 2 or axis not in placed:
            continue
        used = placed | {a for e in have.values() for a in e}
        idle = [a for a in mesh.names if a not in used and mesh.shape[a] % 2 == 0]
        if not idle:
            continue
        # the dot's own layout of the result: on each dimension the axes its operands split it
        # with, then the rest of its entry in mesh order, with the idle axis's half for ``axis``
        own: list[Entry] = []
        for i in result:
            kept = tuple(a for a in held[i] if a in have.get(i, ()))
            rest = [idle[0] if a == axis else a for a in held[i] if a not in kept]
            own.append(kept + tuple(sorted(rest, key=mesh.names.index)))
        # where ``axis`` goes to a batch dimension, the dot splits the other split batch
        # dimensions' axes first and the half last, in their order (measured on a 2×2×2 mesh)
        batch = [k for k, i in enumerate(result) if i in lhs and i in rhs and held[i]]
        scattered = next((k for k in batch if axis in held[result[k]]), None)
        if scattered is not None:
            group = [own[k] for k in batch if k != scattered] + [own[scattered]]
            if len({math.prod(mesh.shape[a] for a in e) for e in group}) == 1:
                for k, e in zip(batch, group, strict=True):
                    own[k] = e
        target = [held[i] for i in result]
        hops.append(
            _Hop(
                axis,
                idle[0],
                _permuted_axes(mesh, own, target, idle[0]),
                result,
                held,
                len(steps) == 1,
            )
        )
    return tuple(hops)


def _permuted_axes(
    mesh: MeshSpec, source: Sequence[Entry], target: Sequence[Entry], idle: str
) -> tuple[str, ...]:
    """The mesh axes a permute spans that moves an array laid out as ``source`` (where ``idle``
    stands for its major half, two devices) to ``target``, the other devices holding replicas
    in mesh order in both: the device at each place of the one tiling sends to the device at
    that place of the other.

    >>> _permuted_axes(MeshSpec.parse("x=2,y=2,z=2"), [("x",), ()], [("z",), ()], "x")
    ('x', 'y', 'z')
    >>> _permuted_axes(MeshSpec.parse("x=2,y=2,z=2"), [("y", "z")], [("y", "x")], "z")
    ('x', 'z')
    >>> _permuted_axes(MeshSpec.parse("x=2,y=4"), [("y",)], [("x",)], "y")
    ('x', 'y')
    """
    # every mesh axis as factors, in mesh order; the idle one split into its major half and rest
    factors: list[tuple[str, int]] = []
    for a in mesh.names:
        n = mesh.shape[a]
        factors += [(a, 2), (a, n // 2)] if a == idle and n > 2 else [(a, n)]
    places = {a: [k for k, (b, _) in enumerate(factors) if b == a] for a in mesh.names}

    def order(entries: Sequence[Entry], half: bool) -> list[int]:
        tiled = [
            k
            for e in entries
            for a in e
            for k in (places[a][:1] if half and a == idle else places[a])
        ]
        return tiled + [k for k in range(len(factors)) if k not in tiled]

    iota = np.arange(mesh.size).reshape([n for _, n in factors])
    source_ids = iota.transpose(order(source, True)).reshape(-1)
    target_ids = iota.transpose(order(target, False)).reshape(-1)
    sizes = [mesh.shape[a] for a in mesh.names]
    src, dst = np.unravel_index(source_ids, sizes), np.unravel_index(target_ids, sizes)
    return tuple(a for a, u, v in zip(mesh.names, src, dst, strict=True) if (u != v).any())


def predict(
    op: Op,
    shapes: Sequence[Sequence[int]],
    dtype: str,
    mesh: MeshSpec,
    strategy: Strategy,
    profile: Profile,
) -> Prediction:
    """Predict memory, FLOPs, collectives and time per device for one strategy.

    >>> from shardwise._model.profile import BUILTIN
    >>> from shardwise._model.spec import Layout, Spec
    >>> op = Op.parse("nd,nd->n")
    >>> s = Strategy(Layout.parse("n=x,d=y"), Spec.parse("x"))
    >>> p = predict(op, [(4000, 10000)] * 2, "float32", MeshSpec.parse("x=2,y=4"), s,
    ...             BUILTIN["h100"])
    >>> [c.kind for c in p.collectives], p.collectives[0].bytes, p.flops
    (['all-reduce'], 8000, 10002000)
    """
    sizes = op.sizes(shapes)
    width = jnp.dtype(dtype).itemsize
    local = local_sizes(sizes, strategy.layout, mesh)
    operand_bytes = sum(math.prod(local[i] for i in t) * width for t in op.inputs)
    partial_bytes = math.prod(local[i] for i in op.output) * width
    out_local = {
        i: sizes[i] // math.prod(mesh.shape[a] for a in e)
        for i, e in zip(op.output, strategy.out_spec.padded(len(op.output)), strict=True)
    }
    out_bytes = math.prod(out_local.values()) * width
    ops_per_term = (len(op.inputs) - 1) + (1 if op.contracted else 0)
    flops = math.prod(local.values()) * ops_per_term
    bytes_accessed = operand_bytes + partial_bytes
    # an axis of size 1 holds the whole sum already: nothing to communicate
    axes = tuple(a for a in reduce_axes(op, strategy.layout, mesh) if mesh.shape[a] > 1)
    collectives: list[PredictedCollective] = []
    temp = 0
    if axes:
        temp = partial_bytes
        scattered = set(axes) <= set(strategy.out_spec.axes)
        hops = (
            _scatter_hops(op, tuple(tuple(s) for s in shapes), mesh, strategy)
            if profile.platform == "cpu"
            else ()
        )
        if scattered and profile.platform != "cpu":
            seconds = ring_seconds("reduce-scatter", axes, partial_bytes, mesh, profile)
            collectives.append(PredictedCollective("reduce-scatter", axes, out_bytes, seconds))
        elif hops:
            for hop in hops:
                # the half each device keeps of the step's result, all-reduced and then permuted
                kept = width * math.prod(
                    sizes[i] // math.prod(mesh.shape[a] for a in hop.held[i]) for i in hop.result
                )
                if hop.whole and partial_bytes:
                    # ... and it computes only the half of the product that each device keeps
                    flops = flops * out_bytes // partial_bytes
                seconds = ring_seconds("all-reduce", (hop.axis,), kept, mesh, profile)
                collectives.append(PredictedCollective("all-reduce", (hop.axis,), kept, seconds))
                link = profile.link_for(hop.idle)  # the halves cross the idle axis
                permute = link.latency_s + kept / link.bandwidth_Bps
                collectives.append(
                    PredictedCollective("collective-permute", hop.hop, kept, permute)
                )
            rest = tuple(a for a in axes if all(a != hop.axis for hop in hops))
            if rest:
                seconds = ring_seconds("all-reduce", rest, partial_bytes, mesh, profile)
                collectives.append(PredictedCollective("all-reduce", rest, partial_bytes, seconds))
        else:
            seconds = ring_seconds("all-reduce", axes, partial_bytes, mesh, profile)
            collectives.append(PredictedCollective("all-reduce", axes, partial_bytes, seconds))
    # summing partial results costs one add per element reduced (as XLA counts it)
    flops += sum(
        c.bytes // width for c in collectives if c.kind in ("all-reduce", "reduce-scatter")
    )
    compute_s = flops / profile.flops(dtype)
    memory_s = bytes_accessed / profile.memory_Bps
    comm_s = sum(c.seconds for c in collectives)
    return Prediction(
        seconds=max(compute_s, memory_s) + comm_s,
        compute_seconds=compute_s,
        memory_seconds=memory_s,
        comm_seconds=comm_s,
        memory_bytes=operand_bytes + out_bytes + temp,
        flops=flops,
        bytes_accessed=bytes_accessed,
        collectives=tuple(collectives),
    )
