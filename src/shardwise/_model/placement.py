"""Where a mesh's axes lie on a platform's devices: the physical slice, and each axis's rings.

A mesh of ``N`` devices on a TPU runs on a slice of the pod's torus: ``N`` chips as a block
of the pod's dimensions (a v5p pod is 16x20x28), wrapping around on an axis when the
slice's shape allows it (:meth:`~shardwise._model.topology.Topology.wraps`), or, past one pod,
several such slices joined by the data-centre network (DCN). On GPUs the fast domain is a
node of 8 joined by NVLink's switch; past it, nodes are joined by InfiniBand.

The mesh's axes are laid onto that slice from the last to the first, as
``jax.experimental.mesh_utils.create_device_mesh`` lays the last axis on the nearest devices:
each takes factors of the physical dimensions in order, and what does not fit in the slice
goes over DCN. A mesh axis is then a set of :class:`Segment` s, rings along one physical
dimension each (a collective runs over all of them at once, as the scaling book's
``sharding.md`` prices an axis spanning several torus axes) and perhaps one over DCN.

This is a model of the placement, not JAX's own algorithm: ``create_device_mesh`` may pick
other physical axes for a logical one; what it keeps is the order (inner axes nearest).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from shardwise._caches import cached
from shardwise._model.mesh import MeshSpec
from shardwise._model.profile import Profile
from shardwise._model.topology import TOPOLOGIES, Topology

DCN = -1
"""The :attr:`Segment.dim` of a segment over the network between slices (or GPU nodes)."""


@dataclass(frozen=True, slots=True)
class Segment:
    """The part of one mesh axis that lies along one physical dimension of the slice, or over
    the network between slices.

    Attributes:
        devices: how many devices of the axis's groups it holds (the ring's length).
        dim: which dimension of the slice, from 0, or :data:`DCN`.
        wraps: whether the ring closes with a wrap-around link: only when it spans the
            whole dimension and the slice wraps there. On a switch (GPU) every ring closes
            through the switch; the cost model prices those alike, whole node or not.
    """

    devices: int
    dim: int
    wraps: bool = False

    @property
    def over_dcn(self) -> bool:
        """Whether the segment crosses the network between slices."""
        return self.dim == DCN


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a mesh lies on a topology.

    Attributes:
        shape: the slice's devices along each physical dimension (a node of GPUs: one).
        slices: how many slices the mesh spans, joined by DCN (1: within one slice).
        wraps: which dimensions of the slice wrap around.
        axes: each mesh axis's segments, in the mesh's order.
    """

    shape: tuple[int, ...]
    slices: int
    wraps: tuple[bool, ...]
    axes: tuple[tuple[str, tuple[Segment, ...]], ...]

    def segments(self, axis: str) -> tuple[Segment, ...]:
        """The segments of mesh axis ``axis``.

        >>> from shardwise._model.topology import topology
        >>> p = place(MeshSpec.parse("data=2,model=4"), topology("tpu-v5p"))
        >>> p.segments("model")
        (Segment(devices=2, dim=0, wraps=False), Segment(devices=2, dim=1, wraps=False))
        """
        return dict(self.axes)[axis]


def _fits(dims: tuple[int, ...], n: int) -> Iterator[tuple[int, ...]]:
    """Every ordered factorisation of ``n`` devices into ``len(dims)`` whole numbers, each
    within its dimension of ``dims``."""
    if len(dims) == 1:
        if n <= dims[0]:
            yield (n,)
        return
    for d in range(1, min(n, dims[0]) + 1):
        if n % d == 0:
            for rest in _fits(dims[1:], n // d):
                yield (d, *rest)


def _best_fit(topo: Topology, n: int) -> tuple[int, ...] | None:
    """The slice of ``n`` devices within one pod: every dimension a multiple of the
    topology's ``wrap_multiple`` where one is (so it wraps), then the most balanced (the
    smallest longest side, then the smallest perimeter), then the first in order; ``None``
    where no factorisation fits the pod."""

    def key(shape: tuple[int, ...]) -> tuple[object, ...]:
        whole = topo.wrap_multiple > 0 and all(d % topo.wrap_multiple == 0 for d in shape)
        return (not whole, max(shape), sum(shape), shape)

    return min(_fits(topo.pod_shape, n), key=key, default=None)


def physical_slice(topo: Topology, devices: int) -> tuple[tuple[int, ...], int]:
    """The slice ``devices`` chips run on, and how many such slices DCN joins: within one
    pod where a factorisation fits it, else the fewest slices that each fit (``devices`` a
    multiple of the pod's: whole pods).

    >>> from shardwise._model.topology import topology
    >>> physical_slice(topology("tpu-v5p"), 8960), physical_slice(topology("tpu-v5p"), 256)
    (((16, 20, 28), 1), ((4, 8, 8), 1))
    >>> physical_slice(topology("tpu-v5p"), 2 * 8960), physical_slice(topology("h100"), 64)
    (((16, 20, 28), 2), ((8,), 8))
    """
    for slices in range(1, devices + 1):
        if devices % slices == 0:
            shape = _best_fit(topo, devices // slices)
            if shape is not None:
                return shape, slices
    raise AssertionError("one device always fits")  # pragma: no cover


def _lay_axis(
    size: int, left: list[int], shape: tuple[int, ...], wraps: tuple[bool, ...]
) -> tuple[Segment, ...]:
    """The segments of an axis of ``size`` devices laid on the physical dimensions' ``left``
    devices (updated in place): from the first dimension with any left, the greatest common
    divisor of what the axis still needs and what the dimension has left; DCN for the rest."""
    out: list[Segment] = []
    need = size
    for dim, room in enumerate(left):
        if need == 1:
            break
        take = math.gcd(need, room)
        if take > 1:
            whole = take == shape[dim]
            out.append(Segment(take, dim, whole and wraps[dim]))
            left[dim] //= take
            need //= take
    if need > 1:
        out.append(Segment(need, DCN))
    return tuple(out)


def place(mesh: MeshSpec, topo: Topology) -> Placement:
    """Lay ``mesh``'s axes on the slice of ``topo`` its devices take, the last axis first.

    >>> from shardwise._model.topology import topology
    >>> p = place(MeshSpec.parse("fsdp=2240,tensor=4"), topology("tpu-v5p"))
    >>> p.shape, p.segments("tensor")
    ((16, 20, 28), (Segment(devices=4, dim=0, wraps=False),))
    >>> [(s.devices, s.wraps) for s in p.segments("fsdp")]
    [(4, False), (20, True), (28, True)]
    >>> gpus = place(MeshSpec.parse("tp=16"), topology("h100"))
    >>> [(s.devices, s.over_dcn) for s in gpus.segments("tp")]
    [(8, False), (2, True)]
    """
    shape, slices = physical_slice(topo, mesh.size)
    wraps = topo.wraps(shape)
    left = list(shape)
    laid = [(name, _lay_axis(size, left, shape, wraps)) for name, size in reversed(mesh.axes)]
    return Placement(shape, slices, wraps, tuple(reversed(laid)))


@cached(maxsize=1 << 10)
def placement(mesh: MeshSpec, profile: Profile) -> Placement | None:
    """:func:`place` on the topology of built-in profile ``profile`` (by its name), or
    ``None`` for a profile with none (``cpu-2core``, a calibrated one).

    >>> from shardwise._model.profile import BUILTIN
    >>> placement(MeshSpec.parse("x=8"), BUILTIN["h100"]).segments("x")
    (Segment(devices=8, dim=0, wraps=True),)
    >>> placement(MeshSpec.parse("x=8"), BUILTIN["cpu-2core"]) is None
    True
    """
    topo = TOPOLOGIES.get(profile.name)
    return None if topo is None else place(mesh, topo)
