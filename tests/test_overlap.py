"""The step time with collectives overlapping compute (GPUs and TPUs): never more than the
serial time nor less than either stream's own, equal to it where nothing can overlap, and
what the mesh search ranks by."""

import jax
import jax.numpy as jnp
import pytest

import shardwise
from shardwise._model.profile import BUILTIN
from shardwise._model.profile_files import load_profile
from shardwise._program.graph import read_jaxpr
from shardwise._program.mesh_search import choose_mesh
from shardwise._program.overlap import _owners

TPU = load_profile("tpu-v5p")
CPU = BUILTIN["cpu-2core"]


def _streams(predicted):
    """The plan's links time and its compute time (elementwise ops included)."""
    links = sum(c.seconds * c.repeat for c in predicted.collectives)
    return links, predicted.seconds - links


@pytest.fixture(scope="module")
def scanned():
    """A 4-layer transformer's training step (layers under ``lax.scan``) on data × fsdp."""
    loss, args = shardwise.model("transformer", batch=64, seq=512, hidden=2048, ffn=8192,
                                 heads=16, layers=4, train=True, dtype="bfloat16")  # fmt: skip
    return loss, args


def test_overlapped_time_lies_between_the_streams_and_the_serial_time(scanned):
    """For every plan (the search's and each baseline's): at most the serial time, at least
    the compute's and the links' own times; FSDP's weight gathers in the scan over layers are
    prefetched, so its step is shorter by most of its links' time."""
    plan = shardwise.plan(*scanned[:1], *scanned[1], mesh="data=2,fsdp=4", profile=TPU,
                          train=True, top=1)  # fmt: skip
    for p in plan.plans:
        pred = p.predicted
        links, compute = _streams(pred)
        assert links > 0, p.name
        assert max(links, compute) * (1 - 1e-9) <= pred.overlapped_seconds, p.name
        assert pred.overlapped_seconds <= pred.seconds * (1 + 1e-9), p.name
    fsdp = plan.get("fsdp").predicted
    links, compute = _streams(fsdp)
    assert fsdp.overlapped_seconds < compute + 0.2 * links, (fsdp.overlapped_seconds, compute)
    assert plan.to_json()["plans"][0]["predicted"]["overlapped_seconds"] > 0


def test_nothing_overlaps_on_a_cpu(scanned):
    """XLA runs a CPU's collectives one after the other with its compute (the CPU profile's
    prediction is the serial one, while the same plans on a TPU overlap)."""
    plan = shardwise.plan(*scanned[:1], *scanned[1], mesh="data=2,fsdp=4", profile=CPU,
                          train=True, top=1)  # fmt: skip
    for p in plan.plans:
        assert p.predicted.overlapped_seconds == p.predicted.seconds
    assert not CPU.overlaps_collectives and TPU.overlaps_collectives


def test_a_result_read_at_once_is_waited_for():
    """Megatron's MLP: its one collective sums the partial products the result is read from,
    after the last dot, so nothing can hide it."""
    fn, args = shardwise.model("mlp", batch=64, hidden=4096, ffn=16384)
    plan = shardwise.plan(fn, *args, mesh="model=8", profile=TPU, top=1)
    pred = plan.get("megatron").predicted
    assert len(pred.collectives) == 1
    assert pred.overlapped_seconds == pytest.approx(pred.seconds, rel=1e-12)


def test_the_mesh_search_ranks_by_the_overlapped_time():
    """Each candidate's time is its best plan's time with collectives overlapped, and the
    plan's table shows that time beside the serial one."""
    loss, args = shardwise.model("transformer", batch=64, seq=512, hidden=2048, ffn=8192,
                                 heads=16, layers=2, train=True, dtype="bfloat16")  # fmt: skip
    choice = choose_mesh(loss, args, 8, TPU, train=True, roles=("fsdp", "tensor"), top=2)
    best = choice.candidates[0]
    assert best.seconds == pytest.approx(choice.best.chosen.predicted.overlapped_seconds)
    assert best.seconds < choice.best.chosen.predicted.seconds
    assert "overlapped" in str(choice.best)


def test_the_graph_records_each_scan_and_its_carries(scanned):
    graph = shardwise.plan(*scanned[:1], *scanned[1], mesh="data=2,fsdp=4", profile=CPU,
                           train=True, top=1).graph  # fmt: skip
    assert [loop.length for loop in graph.loops] == [4, 4]  # the forward and backward scans
    for loop in graph.loops:
        assert loop.start < loop.end and loop.carried
        assert all(graph.born[a] <= loop.start for a in loop.carried)
        first, stop = loop.steps
        assert all(first <= k < stop for k, s in enumerate(graph.steps)
                   if loop.start < graph.born[s.output] < loop.end)  # fmt: skip


def test_scans_back_to_back_and_nested_each_take_their_own_steps():
    """Two scans one after the other (the second's slices are made where the first ends),
    and a scan whose body is only another scan: each step belongs to its outermost scan."""

    def f(ws, x):
        def layer(h, w):
            return jnp.tanh(h @ w), None

        def twice(h, w2):
            return jax.lax.scan(layer, h, w2)[0], None

        h = jax.lax.scan(layer, x, ws)[0]
        h = jax.lax.scan(layer, h, ws)[0]
        return jax.lax.scan(twice, h, ws.reshape(2, 2, 8, 8))[0]

    S = jax.ShapeDtypeStruct
    graph = read_jaxpr(jax.make_jaxpr(f)(S((4, 8, 8), "float32"), S((2, 8), "float32")))
    owners = _owners(graph)
    outer = [loop for loop in graph.loops if loop.length in (4, 2)]
    assert [loop.length for loop in outer] == [4, 4, 2, 2]  # the last two: nested, outer last
    first, second, nested = outer[0], outer[1], outer[3]
    for loop in (first, second, nested):
        a, b = loop.steps
        assert {id(owners[k]) for k in range(a, b)} == {id(loop)}
    slices = [k for k, s in enumerate(graph.steps) if s.role == "scan slice"]
    assert owners[slices[1]] is second  # made at the point where the first scan ends


def test_nested_scans_on_a_tpu_stay_between_the_bounds():
    """Gradient accumulation: the layers' scans inside the microbatches' scan."""
    step, args = shardwise.model("llama", batch=16, seq=64, train=True, optimizer="adamw",
                                 microbatches=4, hidden=256, layers=2, heads=4, kv_heads=2,
                                 ffn=1024, vocab=256, dtype="bfloat16")  # fmt: skip
    plan = shardwise.plan(step, *args, mesh="data=2,fsdp=4", profile=TPU, top=1)
    for p in plan.plans:
        pred = p.predicted
        links, compute = _streams(pred)
        assert max(links, compute) * (1 - 1e-9) <= pred.overlapped_seconds, p.name
        assert pred.overlapped_seconds <= pred.seconds * (1 + 1e-9), p.name
