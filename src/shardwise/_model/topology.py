"""How a platform's devices are wired: the shape of the fast domain and the slower network past it.

A :class:`Topology` is data about a built-in profile (looked up by the profile's name with
:func:`topology`): a TPU pod's ICI torus (v4 and v5p: 3-D, wrap-around links on every axis of
a slice made of whole 4x4x4 cubes; v5e and v6e: a 16x16 2-D torus, wrapping on an axis of
16), or a GPU node of 8 whose NVLink switch joins every pair, with the InfiniBand network past
it; and the data-centre network (DCN) between slices. Figures are bytes per second, each with
its source: Google's Cloud TPU pages, NVIDIA's DGX reference architecture, and the scaling
book (jax-ml/scaling-book, ``tpus.md`` and ``gpus.md``), whose ``W_ici`` and ``W_collective``
the closed forms of :mod:`shardwise._model.scaling` take.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from shardwise._errors import ArgumentError

GB = 1e9

Fabric = Literal["torus", "switched"]
"""``"torus"``: each chip links to its neighbours along each axis (TPU ICI); ``"switched"``:
each device reaches every other of its node through a switch (GPU NVLink)."""


@dataclass(frozen=True, slots=True)
class Topology:
    """The wiring of one platform's devices.

    Attributes:
        name: the profile it belongs to (``"tpu-v5p"``, ``"h100"``, ...).
        fabric: ``"torus"`` or ``"switched"``.
        pod_shape: devices along each axis of the largest domain of the fast interconnect: a
            TPU pod's torus (``(16, 20, 28)`` for v5p), a GPU node (``(8,)``).
        link_Bps: bytes per second one way over one ICI link (torus), or out of one GPU into
            its node's switch (switched).
        dcn_Bps: bytes per second one device sends over the network past the fast domain (its
            share of its host's NICs): between TPU slices, or between GPU nodes.
        devices_per_host: chips per host (TPU); GPUs per node (GPU).
        dcn_latency_s: seconds per step of a ring over the network past the fast domain:
            assumed, 10 µs (none of the sources gives a figure; an InfiniBand or DCN round
            trip through a NIC and a switch or two).
        wrap_multiple: on a torus, an axis of a slice wraps around when its length is a
            multiple of this (and, with ``wrap_whole_slice``, only when every axis's is).
        wrap_whole_slice: wrap-around links come from the optical switches joining whole
            cubes, so a slice has them on every axis or none (v4, v5p).
        sources: where each figure comes from.
    """

    name: str
    fabric: Fabric
    pod_shape: tuple[int, ...]
    link_Bps: float
    dcn_Bps: float
    devices_per_host: int
    wrap_multiple: int = 0
    wrap_whole_slice: bool = False
    dcn_latency_s: float = 10e-6
    sources: Mapping[str, str] = field(default_factory=dict)

    @property
    def pod_devices(self) -> int:
        """Devices in the largest domain of the fast interconnect (8960 for a v5p pod)."""
        return math.prod(self.pod_shape)

    @property
    def w_ici_Bps(self) -> float:
        """The scaling book's ``W_ici`` (torus: bytes per second a chip moves along one axis
        that wraps, both directions of its ring, ``2 × link_Bps``) or ``W_collective`` within
        a GPU node (the GPU's egress into its switch, ``link_Bps``).

        >>> round(TOPOLOGIES["tpu-v5p"].w_ici_Bps / 1e9), round(TOPOLOGIES["h100"].w_ici_Bps / 1e9)
        (180, 450)
        """
        return 2 * self.link_Bps if self.fabric == "torus" else self.link_Bps

    @property
    def node_egress_Bps(self) -> float:
        """Bytes per second a host (TPU) or node (GPU) sends past the fast domain: the book's
        ``W_node`` (400 GB/s for an 8-GPU H100 node), 25 GB/s per TPU v5p host."""
        return self.dcn_Bps * self.devices_per_host

    def wraps(self, shape: tuple[int, ...]) -> tuple[bool, ...]:
        """Which axes of a slice of ``shape`` chips have wrap-around links (none on a switch:
        there every group of a node is a ring already).

        >>> TOPOLOGIES["tpu-v5p"].wraps((4, 4, 8)), TOPOLOGIES["tpu-v5p"].wraps((2, 2, 4))
        ((True, True, True), (False, False, False))
        >>> TOPOLOGIES["tpu-v5e"].wraps((8, 16))
        (False, True)
        """
        if self.fabric != "torus":
            return tuple(True for _ in shape)
        each = tuple(n % self.wrap_multiple == 0 for n in shape)
        return tuple(all(each) for _ in shape) if self.wrap_whole_slice else each

    def axis_Bps(self, shape: tuple[int, ...], axis: int) -> float:
        """Bytes per second a device moves along ``axis`` of a slice of ``shape`` in a ring
        collective: :attr:`w_ici_Bps` with wrap-around, half without (the book: a slice with
        no wrap-around "typically doubles the time of most communication")."""
        return self.w_ici_Bps if self.wraps(shape)[axis] else self.w_ici_Bps / 2


_BOOK_TPUS = "the scaling book (jax-ml/scaling-book, tpus.md), interconnect table"
_BOOK_DCN = (
    "the scaling book (tpus.md): DCN 'typically around 2.5e10 bytes / second per host'; per "
    "chip: that over the chips of a host"
)
_V5P_CUBES = (
    "Cloud TPU v5p docs and the scaling book (tpus.md): 3-D torus of reconfigurable 4x4x4 "
    "cubes joined by optical switches; a slice of whole cubes wraps on every axis, smaller "
    "ones (2x2x4) on none"
)
_NODE = (
    "the scaling book (gpus.md): 8 GPUs per node, GPU egress 450e9 B/s into the NVSwitches "
    "(NVLink 4: 900 GB/s bidirectional per GPU, NVIDIA datasheet), node egress 400e9 B/s"
)
_IB = (
    "NVIDIA DGX SuperPOD reference architecture (H100 and H200): one 400 Gb/s ConnectX-7 "
    "InfiniBand NDR NIC per GPU = 50 GB/s per GPU, 400 GB/s per node in a full-bisection fat "
    "tree (the scaling book's W_node, gpus.md)"
)

_DCN_LATENCY = (
    "assumed, 10 µs per step of a ring between slices or nodes: none of the sources above "
    "gives a latency for DCN or InfiniBand"
)

TOPOLOGIES: dict[str, Topology] = {
    "tpu-v4": Topology(
        name="tpu-v4",
        fabric="torus",
        pod_shape=(16, 16, 16),
        link_Bps=45 * GB,
        dcn_Bps=25 * GB / 4,
        devices_per_host=4,
        wrap_multiple=4,
        wrap_whole_slice=True,
        sources={
            "pod_shape": "the scaling book (tpus.md): v4 superpod 16x16x16, host 2x2x1, "
            "3-D torus of 4x4x4 cubes with optical wrap-around links",
            "link_Bps": f"{_BOOK_TPUS}: TPU v4p 4.5e10 B/s one way per link (9e10 both ways)",
            "dcn_Bps": _BOOK_DCN,
            "dcn_latency_s": _DCN_LATENCY,
        },
    ),
    "tpu-v5p": Topology(
        name="tpu-v5p",
        fabric="torus",
        pod_shape=(16, 20, 28),
        link_Bps=90 * GB,
        dcn_Bps=50e9 / 8,
        devices_per_host=4,
        wrap_multiple=4,
        wrap_whole_slice=True,
        sources={
            "pod_shape": "the scaling book (tpus.md, applied-training.md): a full v5p pod is "
            "16x20x28 = 8960 chips, host 2x2x1; Cloud TPU v5p docs: 8960 chips per pod",
            "wraps": _V5P_CUBES,
            "link_Bps": f"{_BOOK_TPUS}: TPU v5p 9e10 B/s one way per link, 1.8e11 both ways "
            "(W_ici); Cloud TPU v5p docs: ICI 1200 GBps bidirectional per chip over 6 links",
            "dcn_Bps": "Cloud TPU v5p docs: DCN 50 Gbps per chip = 6.25 GB/s (the scaling "
            "book's 2.5e10 B/s per host of 4 chips)",
            "dcn_latency_s": _DCN_LATENCY,
        },
    ),
    "tpu-v5e": Topology(
        name="tpu-v5e",
        fabric="torus",
        pod_shape=(16, 16),
        link_Bps=45 * GB,
        dcn_Bps=200e9 / 8 / 8,
        devices_per_host=8,
        wrap_multiple=16,
        sources={
            "pod_shape": "Cloud TPU v5e docs: 256 chips per pod in a 2D torus, 8 chips per "
            "host; the scaling book (tpus.md): 16x16, host 4x2, wrap-around only on an axis "
            "of 16",
            "link_Bps": f"{_BOOK_TPUS}: TPU v5e 4.5e10 B/s one way per link (9e10 both ways); "
            "Cloud TPU v5e docs: ICI 400 GBps bidirectional per chip over 4 ports",
            "dcn_Bps": "Cloud TPU v5e docs: 2 x 100 Gbps NICs per host of 8 chips (6.4 Tbps "
            "per 256-chip pod) = 3.125 GB/s per chip",
            "dcn_latency_s": _DCN_LATENCY,
        },
    ),
    "tpu-v6e": Topology(
        name="tpu-v6e",
        fabric="torus",
        pod_shape=(16, 16),
        link_Bps=90 * GB,
        dcn_Bps=25 * GB / 8,
        devices_per_host=8,
        wrap_multiple=16,
        sources={
            "pod_shape": "Cloud TPU v6e docs: 256 chips per pod in a 2D torus, 8 chips per "
            "host, 4 ICI ports per chip; the scaling book (tpus.md): 16x16, host 4x2",
            "link_Bps": f"{_BOOK_TPUS}: TPU v6e 9e10 B/s one way per link (1.8e11 both "
            "ways); Cloud TPU v6e docs: ICI 800 GBps bidirectional per chip over 4 ports",
            "dcn_Bps": _BOOK_DCN,
            "dcn_latency_s": _DCN_LATENCY,
        },
    ),
    "h100": Topology(
        name="h100",
        fabric="switched",
        pod_shape=(8,),
        link_Bps=450 * GB,
        dcn_Bps=50 * GB,
        devices_per_host=8,
        sources={
            "pod_shape": _NODE,
            "link_Bps": _NODE,
            "dcn_Bps": _IB,
            "dcn_latency_s": _DCN_LATENCY,
        },
    ),
    "h200": Topology(
        name="h200",
        fabric="switched",
        pod_shape=(8,),
        link_Bps=450 * GB,
        dcn_Bps=50 * GB,
        devices_per_host=8,
        sources={
            "pod_shape": f"NVIDIA DGX H200: 8 H200 GPUs on NVLink 4, as the H100's; {_NODE}",
            "link_Bps": _NODE,
            "dcn_Bps": _IB,
            "dcn_latency_s": _DCN_LATENCY,
        },
    ),
}
"""The wiring of the built-in profiles, by profile name (``cpu-2core`` has none)."""


def topology(name: str) -> Topology:
    """The wiring of built-in profile ``name``.

    Raises:
        ArgumentError: for a profile with no topology here, listing those with one.

    >>> topology("tpu-v5p").pod_devices
    8960
    """
    found = TOPOLOGIES.get(name)
    if found is None:
        raise ArgumentError(
            f"no topology is known for profile {name!r}; the profiles with one are "
            f"{', '.join(TOPOLOGIES)}"
        )
    return found
