"""The cost model: pure functions from a strategy to memory, FLOPs, collectives and time.

Time is a roofline term plus an alpha-beta term per collective:

- roofline: ``max(flops / peak FLOP/s, bytes accessed / memory bandwidth)`` per device;
- a ring collective over ``p`` devices along one mesh axis moving ``n`` bytes per device:
  all-reduce ``2(p-1)·α + 2(p-1)/p · n/β``; all-gather and reduce-scatter
  ``(p-1)·α + (p-1)/p · n/β`` (the standard ring factors; Thakur, Rabenseifner and Gropp,
  "Optimization of Collective Communication Operations in MPICH", 2005). A collective over
  several axes is costed as one ring per axis, one after the other.
- on a built-in TPU or GPU profile, a mesh axis is not one flat ring but rings along the
  physical dimensions it spans (:mod:`shardwise._model.placement`), all at once, and a
  step over the network past the slice or node where it leaves it (the scaling book's
  ``tpus.md`` and ``gpus.md``; :func:`ring_seconds`). A calibrated link is a measurement
  and takes precedence.

Where XLA on a platform does something other than the textbook, the model predicts what XLA
does: on CPU a scattered partial sum is an all-reduce (followed by a local slice), not a
reduce-scatter. An equation of three or more operands is contracted as ``jnp.einsum`` does
it, pairwise, and XLA partitions each of those steps on its own; which collectives that
brings is read off the step that makes each partial sum (:mod:`shardwise._model.scatter`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import jax.numpy as jnp

from shardwise._caches import cached
from shardwise._model.collective import Collective, wire_bytes, wire_itemsize
from shardwise._model.mesh import MeshSpec
from shardwise._model.op import Op
from shardwise._model.placement import placement
from shardwise._model.profile import Profile
from shardwise._model.scatter import Hop, scatter_hops
from shardwise._model.spec import Layout
from shardwise._model.strategy import Strategy, summed_axes
from shardwise._model.topology import TOPOLOGIES


@dataclass(frozen=True, slots=True)
class PredictedCollective(Collective):
    """A collective a strategy or a plan implies: what it moves, and its predicted
    ``seconds`` per run. In a program plan it also names the op and the user's line it
    belongs to (:attr:`op_name`, :attr:`source`), how many times it runs (``repeat``: a
    scan's length), the step of the program graph that causes it, and why, in words;
    ``operand_source``: where it moves an array before its step, the user's line where the
    plan's program last laid that array out (``""``: an argument, or a collective after its
    step; :func:`~shardwise._program.explain.laid_out_at`)."""

    seconds: float = 0.0
    repeat: int = field(default=1, kw_only=True)
    step: int = field(default=-1, kw_only=True)
    why: str = field(default="", kw_only=True)
    operand_source: str = field(default="", kw_only=True)

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "kind": self.kind,
            "mesh_axes": list(self.mesh_axes),
            "bytes": self.bytes,
            "seconds": self.seconds,
        }
        if self.op_name:
            out |= {"op": self.op_name, "source": self.source, "repeat": self.repeat,
                    "step": self.step, "why": self.why}  # fmt: skip
        return out


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
    """Alpha-beta time of a ring collective over ``axes``, one ring per axis; on CPUs, one
    step over the group (``nbytes``: the block each device holds, after an all-gather).

    On a profile with a topology (the built-in TPUs and GPUs), an axis not calibrated is
    priced where it lies (:func:`placed_terms`); elsewhere as a flat ring of its devices:

    >>> from shardwise._model.profile import BUILTIN
    >>> t = ring_seconds("all-reduce", ["x"], 10**6, MeshSpec.parse("x=4"), BUILTIN["h100"])
    >>> round(t * 1e6, 2)  # 6 × 10 µs + 1.5 × 1 MB / 450 GB/s
    63.33

    A 2240-way FSDP axis beside 4-way tensor parallelism on a full v5p pod (16x20x28) spans
    4 chips of the first torus axis (no wrap-around: 90 GB/s) and the whole of the other two
    (wrapped: W_ici = 180 GB/s each), so an all-gather of 1 GB takes about ``B / (2.5 W_ici)``
    rather than the book's ``B / (3 W_ici)`` for three wrapped axes, and 27 steps of 5 µs,
    not 2239:

    >>> v5p, W = BUILTIN["tpu-v5p"], 180e9
    >>> t = ring_seconds("all-gather", ["fsdp"], 10**9, MeshSpec.parse("fsdp=2240,tensor=4"), v5p)
    >>> round(t * 1e3, 2), round(1e9 / (3 * W) * 1e3, 2)  # ms: predicted; B / (3 W_ici)
    (2.36, 1.85)

    On an H100, 8-way tensor parallelism stays on the node's NVLink; 16 ways cross
    InfiniBand, whose step (each GPU sends its 1/8 of the block at 50 GB/s) adds to it:

    >>> h100, n = BUILTIN["h100"], 10**8
    >>> [round(ring_seconds("all-gather", ["tp"], n, MeshSpec.parse(f"tp={p}"), h100) * 1e6, 1)
    ...  for p in (8, 16)]  # µs: 7 × 10 µs + 7/8 · n / 450 GB/s; + 10 µs + 1/2 · n/8 / 50 GB/s
    [264.4, 399.4]
    """
    axes = [a for a in axes if mesh.shape[a] > 1]  # an axis of size 1 moves nothing
    if not axes:
        return 0.0
    if profile.platform == "cpu":
        # shared memory, no ring: one step over the whole group whatever its size, at the
        # slowest axis's rate (measured: an all-reduce of 1 MB over 2, 4 or 8 devices alike
        # 1.7-1.9 ms; an all-gather in proportion to the bytes it makes)
        links = [profile.link_for(axis, kind) for axis in axes]
        return max(lk.latency_s for lk in links) + nbytes / min(lk.bandwidth_Bps for lk in links)
    total = 0.0
    factor = 2.0 if kind == "all-reduce" else 1.0
    wired = profile.name in TOPOLOGIES
    inside = _inside(axes, mesh, profile) if wired and kind in _HIERARCHICAL else {}
    for axis in axes:
        others = math.prod(n for a, n in inside.items() if a != axis)
        terms = placed_terms(kind, axis, mesh, profile, others) if wired else None
        if terms is not None:
            total += factor * (terms[0] + terms[1] * nbytes)
            continue
        p = mesh.shape[axis]
        link = profile.link_for(axis, kind)
        total += factor * ((p - 1) * link.latency_s + (p - 1) / p * nbytes / link.bandwidth_Bps)
    return total


_HIERARCHICAL = ("all-reduce", "all-gather", "reduce-scatter")
"""Kinds whose part over the network is run on what is left after (or before) their part
within the slice: the block there is ``1 / p_ici`` of the whole."""


def _inside(axes: Sequence[str], mesh: MeshSpec, profile: Profile) -> dict[str, int]:
    """Each of ``axes``'s devices within one slice or node (the product of its segments off
    the network), where it lies on the profile's topology; empty where it is not placed."""
    placed = placement(mesh, profile)
    if placed is None:
        return {}
    return {a: math.prod(s.devices for s in placed.segments(a) if not s.over_dcn) for a in axes}


_GATHERS = ("all-gather", "all-to-all")
"""Kinds :meth:`Profile.link_for` prices with a profile's gather links where it has them."""


@cached(maxsize=1 << 12)
def placed_terms(
    kind: str, axis: str, mesh: MeshSpec, profile: Profile, others: int = 1
) -> tuple[float, float] | None:
    """``(seconds, seconds per byte)`` of one pass of a ``kind`` collective over mesh axis
    ``axis`` where it lies on the profile's topology, or ``None`` where the flat ring applies:
    no topology, or a link calibrated for the axis (a measurement wins over the data sheet).

    After the scaling book (``sharding.md``, "What happens when we AllGather over multiple
    axes?", and ``tpus.md`` on wrap-around): an axis spanning several torus axes runs over all
    of them at once, ``bytes / Σ W``, each ``W`` both directions of a link (``2 × link_Bps``,
    the book's ``W_ici``) on a ring that wraps around, one direction (``link_Bps``) on one
    that does not (its v5e quiz: "3 * 8.4e6 / 4.5e10 = 560us" on an axis of 4 with no
    wrap-around); a wrapped, bidirectional ring of ``g`` chips takes ``g // 2`` steps (the
    book's ``Σ |X_i| / 2``), an open one ``g - 1``. On a GPU
    node (``gpus.md``) every device sends at its egress into the switch, ``link_Bps``, in
    ``g - 1`` steps (NCCL's ring). Past the slice or node, the book's hierarchical reduction:
    within the slice first, so each device sends ``1 / p_ici`` of the block over the network,
    ``(g_d - 1) / g_d · n / p_ici / dcn_Bps`` in ``g_d - 1`` steps of
    :attr:`~shardwise._model.topology.Topology.dcn_latency_s` (assumed 10 µs); a GPU
    all-reduce across nodes in ``⌊log2 g_d⌋`` (NCCL's tuning model, ``src/graph/tuning.cc``:
    a tree across nodes, whose bandwidth is the ring's, for all-reduce only; all-gathers and
    reduce-scatters run on rings, ``nNodes - 1`` steps across the network). The same
    across axes: ``others`` is how many devices the collective's other axes span within the
    slice (an all-reduce, all-gather or reduce-scatter over ``data`` across slices and
    ``fsdp`` within them sends ``1 / fsdp`` of the block over the network, as MaxText's
    gradient reduction across slices does), so the network's part is divided by it too.

    >>> from shardwise._model.profile import BUILTIN
    >>> lat, per_byte = placed_terms("all-gather", "x", MeshSpec.parse("x=8960"),
    ...                              BUILTIN["tpu-v5p"])
    >>> round(lat * 1e6), round(1 / per_byte / 1e9)  # 8 + 10 + 14 steps of 5 µs; 3 × 180 GB/s
    (160, 540)
    """
    if axis in profile.axis_links or (kind in _GATHERS and axis in profile.gather_links):
        return None
    placed = placement(mesh, profile)
    if placed is None:
        return None
    topo = TOPOLOGIES[profile.name]
    segments = placed.segments(axis)
    ici = [s for s in segments if not s.over_dcn]
    p_ici = math.prod(s.devices for s in ici)
    latency = per_byte = 0.0
    if p_ici > 1:
        torus = topo.fabric == "torus"
        both = [torus and s.wraps for s in ici]
        bandwidth = sum(topo.link_Bps * (2 if w else 1) for w in both)
        latency += profile.link_for(axis, kind).latency_s * sum(
            s.devices // 2 if w else s.devices - 1 for s, w in zip(ici, both, strict=True)
        )
        per_byte += (p_ici - 1) / p_ici / bandwidth
    for s in segments:
        if s.over_dcn:  # (NCCL all-reduces across nodes on a tree: log2 steps, not a ring's)
            tree = kind == "all-reduce" and topo.fabric == "switched"
            steps = s.devices.bit_length() - 1 if tree else s.devices - 1  # (log2i: floor)
            latency += steps * topo.dcn_latency_s
            per_byte += (s.devices - 1) / s.devices / (p_ici * others) / topo.dcn_Bps
    return latency, per_byte


def local_sizes(sizes: Mapping[str, int], layout: Layout, mesh: MeshSpec) -> dict[str, int]:
    """Each index's size on one device under ``layout``."""
    return {i: n // math.prod(mesh.shape[a] for a in layout.axes_of(i)) for i, n in sizes.items()}


def _hop_collectives(
    hops: Sequence[Hop], sizes: Mapping[str, int], width: int, mesh: MeshSpec, profile: Profile
) -> list[PredictedCollective]:
    """The collectives of the two-way scatters :func:`scatter_hops` found: the half each
    device keeps of a step's result, all-reduced and then permuted across the idle axis."""
    out = []
    for hop in hops:
        kept = width * math.prod(
            sizes[i] // math.prod(mesh.shape[a] for a in hop.held[i]) for i in hop.result
        )
        seconds = ring_seconds("all-reduce", (hop.axis,), kept, mesh, profile)
        out.append(PredictedCollective("all-reduce", (hop.axis,), kept, seconds))
        link = profile.link_for(hop.idle)
        permute = link.latency_s + kept / link.bandwidth_Bps
        out.append(PredictedCollective("collective-permute", hop.hop, kept, permute))
    return out


def is_matmul(op: Op) -> bool:
    """Whether ``op`` is a matrix product: two operands that share a summed index and each
    have an index the other lacks (a weight multiplied into rows), as opposed to a batched dot
    or a reduction that reads each element once.

    >>> is_matmul(Op.parse("mk,kn->mn")), is_matmul(Op.parse("nd,nd->n"))
    (True, False)
    """
    if len(op.inputs) != 2 or not op.contracted:
        return False
    a, b = (set(t) for t in op.inputs)
    return bool(a - b) and bool(b - a)


def sum_groups(op: Op, layout: Layout, axes: Sequence[str]) -> list[tuple[str, ...]]:
    """The all-reduces XLA adds a partial sum over ``axes`` with: one per contracted index
    split on some of them, over that index's axes, the last index first; one where a single
    index is split on all (seen in compiled HLO: ``abc,abd->cd`` with ``a`` on ``data`` and
    ``b`` on ``model`` is summed over ``model``, then over ``data``).

    >>> sum_groups(Op.parse("abc,abd->cd"), Layout.parse("a=x,b=y"), ("x", "y"))
    [('y',), ('x',)]
    >>> sum_groups(Op.parse("ab,bc->ac"), Layout.parse("b=(x,y)"), ("x", "y"))
    [('x', 'y')]
    """
    groups = []
    for index in reversed(op.contracted):
        group = tuple(a for a in axes if a in layout.axes_of(index))
        if group:
            groups.append(group)
    return groups


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
    # an axis of size 1 holds the whole sum; an empty output none, nor an axis on a contracted
    # index of size 0 (XLA sums nothing: "li,lk->", i empty on x, k on y: over y)
    axes = summed_axes(op, strategy.layout, mesh, sizes) if partial_bytes > 0 else ()
    collectives: list[PredictedCollective] = []
    temp = 0
    wire = wire_itemsize(dtype, profile.platform)  # (a CPU sums bfloat16 as float32)
    summed_bytes = wire_bytes(partial_bytes, dtype, profile.platform)
    if axes:
        temp, summed = partial_bytes, axes[:0]  # nothing summed by all-reduce yet
        scattered = set(axes) <= set(strategy.out_spec.axes)
        hops = (
            scatter_hops(op, tuple(tuple(s) for s in shapes), mesh, strategy)
            if profile.platform == "cpu"
            else ()
        )
        if scattered and profile.platform != "cpu":
            seconds = ring_seconds("reduce-scatter", axes, partial_bytes, mesh, profile)
            collectives.append(PredictedCollective("reduce-scatter", axes, out_bytes, seconds))
        elif hops:
            collectives.extend(_hop_collectives(hops, sizes, wire, mesh, profile))
            for hop in hops:
                if hop.whole and partial_bytes:
                    # ... and it computes only the half of the product that each device keeps
                    flops = flops * out_bytes // partial_bytes
            summed = tuple(a for a in axes if all(a != hop.axis for hop in hops))
        else:
            summed = axes
        for group in sum_groups(op, strategy.layout, summed):
            seconds = ring_seconds("all-reduce", group, summed_bytes, mesh, profile)
            collectives.append(PredictedCollective("all-reduce", group, summed_bytes, seconds))
    # summing partial results costs one add per element reduced (as XLA counts it)
    flops += sum(c.bytes // wire for c in collectives if c.kind in ("all-reduce", "reduce-scatter"))
    compute_s, matmul = flops / profile.flops(dtype), is_matmul(op)
    memory_s = bytes_accessed / (profile.gemm_Bps if matmul else profile.memory_Bps)
    comm_s = sum(c.seconds for c in collectives)
    # a CPU packs a matmul's operands, then multiplies: the times add (within 10-20% over ten
    # shapes of 32 to 2048 rows); elsewhere the slower of the two bounds the time
    add = matmul and profile.platform == "cpu"
    return Prediction(
        seconds=(compute_s + memory_s if add else max(compute_s, memory_s)) + comm_s,
        compute_seconds=compute_s,
        memory_seconds=memory_s,
        comm_seconds=comm_s,
        memory_bytes=operand_bytes + out_bytes + temp,
        flops=flops,
        bytes_accessed=bytes_accessed,
        collectives=tuple(collectives),
    )
