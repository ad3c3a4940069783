"""Where a mesh's axes lie on a TPU pod's torus or on GPU nodes, and the collective times the
cost model takes from it: the scaling book's figures (jax-ml/scaling-book, ``tpus.md`` and
``gpus.md``) reproduced through ``ring_seconds``, each expectation derived from the topology's
own figures."""

from __future__ import annotations

import dataclasses

import pytest

from shardwise import clear_caches
from shardwise._model.cost import ring_seconds
from shardwise._model.mesh import MeshSpec
from shardwise._model.placement import DCN, Segment, physical_slice, place, placement
from shardwise._model.profile import BUILTIN, Link
from shardwise._model.topology import topology

V5P, H100, CPU = BUILTIN["tpu-v5p"], BUILTIN["h100"], BUILTIN["cpu-2core"]
W_ICI = topology("tpu-v5p").w_ici_Bps  # 1.8e11: both directions of a wrapped axis
LINK = topology("tpu-v5p").link_Bps  # 9e10: one direction, an axis that does not wrap
NVLINK, IB = topology("h100").link_Bps, topology("h100").dcn_Bps  # per GPU, 450 and 50 GB/s
DCN_STEP = topology("h100").dcn_latency_s
B = 10**10  # bytes: large enough that the steps' latency is under 1% of the time


def flat(kind: str, p: int, n: int, link: Link) -> float:
    """The flat ring of ``p`` devices: what a profile without a topology, or a calibrated
    axis, is charged."""
    factor = 2 if kind == "all-reduce" else 1
    return factor * ((p - 1) * link.latency_s + (p - 1) / p * n / link.bandwidth_Bps)


# --- slices -----------------------------------------------------------------------------------


def test_a_full_v5p_pod_is_its_16x20x28_torus_with_wrap_around():
    v5p = topology("tpu-v5p")
    assert physical_slice(v5p, 8960) == ((16, 20, 28), 1)
    assert v5p.wraps((16, 20, 28)) == (True, True, True)


def test_a_slice_of_whole_cubes_wraps_and_a_smaller_one_does_not():
    # tpus.md: "Any multiple of a full cube (e.g. 4x4x4 or 4x4x8) will have wraparounds"
    v5p = topology("tpu-v5p")
    shape, slices = physical_slice(v5p, 256)
    assert (shape, slices) == ((4, 8, 8), 1) and all(v5p.wraps(shape))
    assert physical_slice(v5p, 64) == ((4, 4, 4), 1)
    shape, _ = physical_slice(v5p, 8)
    assert shape == (2, 2, 2) and not any(v5p.wraps(shape))


def test_past_a_pod_or_a_node_whole_ones_are_joined_by_the_network():
    assert physical_slice(topology("tpu-v5p"), 3 * 8960) == ((16, 20, 28), 3)
    assert physical_slice(topology("h100"), 64) == ((8,), 8)
    assert physical_slice(topology("h100"), 4) == ((4,), 1)
    # a 2-D v5e slice of 128 chips is 8x16: it wraps on its axis of 16 only (tpus.md)
    v5e = topology("tpu-v5e")
    assert physical_slice(v5e, 128) == ((8, 16), 1)
    assert v5e.wraps((8, 16)) == (False, True)


# --- axes on the slice ------------------------------------------------------------------------


def test_the_last_mesh_axis_takes_the_first_physical_dimensions():
    p = place(MeshSpec.parse("fsdp=2240,tensor=4"), topology("tpu-v5p"))
    assert p.segments("tensor") == (Segment(4, 0, False),)  # 4 of 16: no wrap-around
    assert p.segments("fsdp") == (Segment(4, 0, False), Segment(20, 1, True), Segment(28, 2, True))


def test_an_axis_on_a_256_chip_slice_spans_parts_of_two_dimensions():
    p = place(MeshSpec.parse("data=16,model=16"), topology("tpu-v5p"))  # on 4x8x8
    assert p.segments("model") == (Segment(4, 0, True), Segment(4, 1, False))
    assert p.segments("data") == (Segment(2, 1, False), Segment(8, 2, True))


def test_what_does_not_fit_in_the_slice_goes_over_the_network():
    p = place(MeshSpec.parse("data=2,fsdp=8960"), topology("tpu-v5p"))
    assert p.slices == 2 and p.segments("data") == (Segment(2, DCN, False),)
    assert [s.devices for s in p.segments("fsdp")] == [16, 20, 28]
    p = place(MeshSpec.parse("data=4,tp=16"), topology("h100"))
    assert p.segments("tp") == (Segment(8, 0, True), Segment(2, DCN, False))
    assert p.segments("data") == (Segment(4, DCN, False),)


def test_the_placement_is_cached_per_mesh_and_profile_and_cleared_with_the_rest():
    mesh = MeshSpec.parse("x=8")
    assert placement(mesh, V5P) is placement(mesh, V5P)
    assert placement(mesh, CPU) is None
    assert placement.cache_info().currsize > 0
    clear_caches()
    assert placement.cache_info().currsize == 0


# --- the book's figures through ring_seconds --------------------------------------------------


@pytest.mark.parametrize("kind", ["all-gather", "reduce-scatter"])
def test_v5p_an_axis_over_three_wrapped_torus_axes_moves_at_three_w_ici(kind):
    # tpus.md: an AllGather over an axis spanning k torus axes with wrap-around takes
    # bytes / (k · W_ici); the whole pod's axis spans all three
    t = ring_seconds(kind, ["x"], B, MeshSpec.parse("x=8960"), V5P)
    assert t == pytest.approx(B / (3 * W_ICI), rel=0.02)


def test_v5p_one_two_or_three_wrapped_torus_axes():
    mesh = MeshSpec.parse("a=16,b=4")  # 64 chips: a 4x4x4 cube, b on one axis, a on two
    for axis, k, p in (("b", 1, 4), ("a", 2, 16)):
        t = ring_seconds("all-gather", [axis], B, mesh, V5P)
        steps = k * 4 // 2 * V5P.link.latency_s  # 2 steps a wrapped ring of 4, both ways
        assert t == pytest.approx((p - 1) / p * B / (k * W_ICI) + steps, rel=1e-9)


def test_v5e_the_books_all_gather_on_an_axis_of_4_with_no_wrap_around():
    # sharding.md, Pop Quiz 2: AllGather_Y([E_Y, F]) on a v5e mesh {'X': 8, 'Y': 4}, E = 2048,
    # F = 8192 in bfloat16: "TPU v5e only has a wraparound connection when one axis has size
    # 16 ... more like 3 * 8.4e6 / 4.5e10 = 560us" (the book's hops take 1 µs, the profile's 5)
    v5e = BUILTIN["tpu-v5e"]
    t = ring_seconds("all-gather", ["Y"], 2048 * 8192 * 2, MeshSpec.parse("X=8,Y=4"), v5e)
    assert t == pytest.approx(560e-6, rel=0.05)


def test_v5p_without_wrap_around_an_all_gather_takes_about_twice_as_long():
    # tpus.md: smaller slices with no wraparound "typically double the time"
    wrapped = ring_seconds("all-gather", ["x"], B, MeshSpec.parse("x=64"), V5P)  # 4x4x4
    open_ = ring_seconds("all-gather", ["x"], B, MeshSpec.parse("x=32"), V5P)  # 2x4x4
    assert open_ / wrapped == pytest.approx(2 * (31 / 32) / (63 / 64), rel=0.02)


def test_an_all_reduce_is_twice_an_all_gather():
    mesh = MeshSpec.parse("fsdp=2240,tensor=4")
    gather = ring_seconds("all-gather", ["fsdp"], B, mesh, V5P)
    assert ring_seconds("all-reduce", ["fsdp"], B, mesh, V5P) == pytest.approx(2 * gather)
    # 4 of 16 chips (one way) and two whole wrapped axes: 2.5 W_ici; 3 + 10 + 14 steps
    expected = 2239 / 2240 * B / (LINK + 2 * W_ICI) + 27 * V5P.link.latency_s
    assert gather == pytest.approx(expected, rel=1e-9)


def test_a_2240_way_axis_costs_steps_along_the_torus_not_along_the_ring():
    # the flat ring charged 2239 steps of 5 µs for every collective: 11 ms of latency alone
    t = ring_seconds("all-gather", ["fsdp"], 1, MeshSpec.parse("fsdp=2240,tensor=4"), V5P)
    assert t == pytest.approx(27 * 5e-6, rel=1e-6)
    assert t < flat("all-gather", 2240, 1, V5P.link) / 50


def test_between_v5p_pods_each_chip_sends_its_share_over_dcn():
    # 2 pods: within each pod first (3 wrapped axes), then 1/8960 of the block between pods
    dcn = topology("tpu-v5p").dcn_Bps
    t = ring_seconds("all-gather", ["x"], B, MeshSpec.parse("x=17920"), V5P)
    ici = 8959 / 8960 * B / (3 * W_ICI) + (8 + 10 + 14) * V5P.link.latency_s
    over = 1 / 2 * B / 8960 / dcn + topology("tpu-v5p").dcn_latency_s
    assert t == pytest.approx(ici + over, rel=1e-9)
    # an axis with nothing within the pod sends all of its block over DCN (6.25 GB/s a chip)
    t = ring_seconds("all-gather", ["data"], B, MeshSpec.parse("data=2,fsdp=8960"), V5P)
    assert t == pytest.approx(1 / 2 * B / dcn + topology("tpu-v5p").dcn_latency_s, rel=1e-9)


@pytest.mark.parametrize("kind", ["all-reduce", "all-gather", "reduce-scatter"])
def test_across_slices_and_an_axis_within_them_the_network_carries_the_slices_share(kind):
    # MaxText's gradient reduction over data (2 v5e slices) and fsdp (256 chips a slice): the
    # slice's part first, then 1/256 of the block over DCN (it was priced with all of it, and
    # MaxText's 2-slice runs were predicted at half their published MFU)
    v5e, mesh = BUILTIN["tpu-v5e"], MeshSpec.parse("data=2,fsdp=256")
    dcn, factor = topology("tpu-v5e").dcn_Bps, 2 if kind == "all-reduce" else 1
    within = ring_seconds(kind, ["fsdp"], B, mesh, v5e)
    both = ring_seconds(kind, ["data", "fsdp"], B, mesh, v5e)
    over = factor * (1 / 2 * B / 256 / dcn + topology("tpu-v5e").dcn_latency_s)
    assert both == pytest.approx(within + over, rel=1e-9)
    alone = factor * (1 / 2 * B / dcn + topology("tpu-v5e").dcn_latency_s)  # all of it
    assert ring_seconds(kind, ["data"], B, mesh, v5e) == pytest.approx(alone, rel=1e-9)
    # an all-to-all is not reduced in the slice first: half its block crosses the network
    alone = ring_seconds("all-to-all", ["data"], B, mesh, v5e)
    assert ring_seconds("all-to-all", ["data", "fsdp"], B, mesh, v5e) == pytest.approx(
        alone + ring_seconds("all-to-all", ["fsdp"], B, mesh, v5e), rel=1e-9
    )


def test_h100_tensor_parallelism_of_8_stays_on_nvlink_and_16_crosses_infiniband():
    # gpus.md: 8 GPUs a node at 450 GB/s each into the NVSwitch; past it, 400 GB/s a node
    n = 10**9
    tp8 = ring_seconds("all-gather", ["tp"], n, MeshSpec.parse("tp=8"), H100)
    assert tp8 == pytest.approx(flat("all-gather", 8, n, H100.link))  # NCCL's ring in the node
    assert H100.link.bandwidth_Bps == NVLINK
    tp16 = ring_seconds("all-gather", ["tp"], n, MeshSpec.parse("tp=16"), H100)
    # the node's ring, then each GPU sends its 1/8 of the block to the other node
    assert tp16 == pytest.approx(tp8 + 1 / 2 * n / 8 / IB + DCN_STEP, rel=1e-9)
    assert tp16 > 1.5 * tp8
    # the flat ring priced all 16 on NVLink, within 15% of 8's time
    assert flat("all-gather", 16, n, H100.link) < 1.15 * tp8


def test_zero3_across_h100_nodes_sends_each_block_over_infiniband():
    # with tp=8 on the node, the data axis has one GPU per node: its block all at 50 GB/s
    n = 10**9
    t = ring_seconds("all-gather", ["data"], n, MeshSpec.parse("data=64,tp=8"), H100)
    assert t == pytest.approx(63 / 64 * n / IB + 63 * DCN_STEP, rel=1e-9)


def test_an_h100_all_reduce_across_512_nodes_is_a_tree_and_gathers_stay_rings():
    # NCCL's tuning model (src/graph/tuning.cc): across nodes an all-reduce runs on a tree,
    # 2 log2(nodes) network steps; all-gathers and reduce-scatters on rings, nodes - 1 steps.
    # The ring's 2 x 511 steps had priced a 4096-GPU gradient all-reduce at 10.2 ms of latency
    mesh = MeshSpec.parse("data=512,tp=8")  # one GPU per node on data
    t = ring_seconds("all-reduce", ["data"], 0, mesh, H100)
    assert t == pytest.approx(2 * 9 * DCN_STEP, rel=1e-9)
    n = 10**9
    assert ring_seconds("all-reduce", ["data"], n, mesh, H100) == pytest.approx(
        t + 2 * 511 / 512 * n / IB, rel=1e-9
    )  # (the tree's bandwidth is the ring's)
    for kind in ("all-gather", "reduce-scatter"):
        assert ring_seconds(kind, ["data"], 0, mesh, H100) == pytest.approx(511 * DCN_STEP)
    # NCCL's log2i rounds down: 6 nodes take 2 steps each way, not 3
    six = ring_seconds("all-reduce", ["data"], 0, MeshSpec.parse("data=6,tp=8"), H100)
    assert six == pytest.approx(2 * 2 * DCN_STEP, rel=1e-9)


# --- what the topology does not override ------------------------------------------------------


def test_a_calibrated_axis_link_is_a_measurement_and_wins():
    measured = Link(latency_s=2e-6, bandwidth_Bps=30e9)
    prof = dataclasses.replace(V5P, axis_links={"x": measured})
    mesh = MeshSpec.parse("x=4,y=16")
    for kind in ("all-reduce", "all-gather"):
        assert ring_seconds(kind, ["x"], B, mesh, prof) == flat(kind, 4, B, measured)
        # the other axis is still priced on the torus
        assert ring_seconds(kind, ["y"], B, mesh, prof) == ring_seconds(kind, ["y"], B, mesh, V5P)
    gathers = dataclasses.replace(V5P, gather_links={"y": measured})
    assert ring_seconds("all-gather", ["y"], B, mesh, gathers) == flat(
        "all-gather", 16, B, measured
    )
    assert ring_seconds("all-reduce", ["y"], B, mesh, gathers) == ring_seconds(
        "all-reduce", ["y"], B, mesh, V5P
    )


def test_a_profile_with_no_topology_keeps_the_flat_ring():
    mine = dataclasses.replace(V5P, name="my-tpu")
    mesh = MeshSpec.parse("x=2240,y=4")
    assert ring_seconds("all-reduce", ["x"], B, mesh, mine) == flat(
        "all-reduce", 2240, B, mine.link
    )


def test_cpus_are_unchanged_one_step_over_the_group():
    mesh = MeshSpec.parse("x=2,y=4")
    t = ring_seconds("all-reduce", ["x", "y"], 10**6, mesh, CPU)
    assert t == CPU.link.latency_s + 10**6 / CPU.link.bandwidth_Bps
