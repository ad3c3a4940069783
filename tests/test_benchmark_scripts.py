"""The benchmark scripts' own logic, on the smallest program (their runs are not tests)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

import shardwise

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def corpus_module(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import program_corpus

    return program_corpus


def test_corpus_repredicts_each_plan_as_its_own_profile_did(corpus_module) -> None:  # type: ignore[no-untyped-def]
    """Every plan is predicted under the reference profile: for the reference's own plans that
    is their own prediction, plans are distinct, and random profiles add plans of their own."""
    fn, args = shardwise.model("mlp", batch=64, hidden=128, ffn=256)
    reference, items = corpus_module.corpus(fn, args, False, "cpu-2core", 2, 1)
    own = [(label, item, p) for label, plan, item, p in items if plan is reference]
    assert [label for label, *_ in own] == [
        p.name for p in reference.plans if any(p is item for _, item, _ in own)
    ]
    for _, item, predicted in own:
        assert math.isclose(predicted, item.predicted.seconds, rel_tol=1e-9)
    labels = [label for label, *_ in items]
    assert len(labels) == len(set(labels))
    assert len(items) > len(own)
    seconds = corpus_module.measure(items[:2], repeat=1)
    assert set(seconds) == set(labels[:2]) and all(s > 0 for s in seconds.values())


def test_the_plan_snapshot_names_every_difference(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import plan_snapshot

    fn, args = shardwise.model("mlp", batch=64, hidden=128, ffn=256)
    before = [plan_snapshot.snapshot("mlp", fn, args, mesh="x=2")]
    assert plan_snapshot.compare(before, before) == []
    after = [dict(before[0], plans=[dict(p) for p in before[0]["plans"]])]
    after[0]["plans"][0]["seconds"] *= 2
    after[0]["plans"].pop()
    found = plan_snapshot.compare(before, after)
    assert any("seconds" in line for line in found) and any("gone" in line for line in found)


def test_maxtext_runs_count_model_flops_as_maxtext_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every published row: MaxText's count of a step's model FLOPs for the decoder its
    script builds today equals the count worked out when the rows were transcribed, the
    published TFLOP/s over MFU is the chip's peak, and the mesh covers every chip."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import maxtext_published
    import maxtext_runs

    assert len(maxtext_published.RUNS) == 46
    for run in maxtext_published.RUNS:
        tflops = maxtext_runs.maxtext_tflops(run, run.per_device_batch_size,
                                             run.max_target_length)  # fmt: skip
        assert math.isclose(tflops, run.head_model_tflops_per_device_step, rel_tol=1e-3), run
        peak = run.published_tflops_per_chip / run.published_mfu
        assert math.isclose(peak, run.peak_tflops_per_chip, rel_tol=0.02), run
        for which in ("head", "published"):
            mesh = maxtext_runs.maxtext_mesh(maxtext_runs.config(run, which))
            sizes = [int(part.split("=")[1]) for part in mesh.split(",")]
            assert math.prod(sizes) == run.num_chips, (run, which, mesh)


def test_hlo_cases_checks_every_plan_of_a_case(monkeypatch: pytest.MonkeyPatch) -> None:
    """One case of ``benchmarks/hlo_cases.py``: every plan run, verified and reported."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import hlo_cases

    fn, args = hlo_cases.CASES["dot of vectors"]
    row = hlo_cases.check(fn, args, "data=2,model=4")
    assert row["equal"] and row["collectives_differ"] == [] and row["plans"] > 1
    assert len(hlo_cases.CASES) >= 60


def test_xla_heap_counts_a_buffer_written_over_once(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The temporaries' fullest point from XLA's dumps: values alive at one point, two that
    share a buffer (one written over the other at the point it reads it) counted once."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import xla_heap

    (tmp_path / "m.cpu_after_optimizations-buffer-assignment.txt").write_text(
        "allocation 0: size 64, parameter 0:\n"
        " value: <0 p @0> (size=64,offset=0): f32[16]{0}\n"
        "allocation 1: size 96, preallocated-temp:\n"
        " value: <1 a @0> (size=32,offset=0): f32[8]{0}\n"
        " value: <2 b @0> (size=32,offset=0): f32[8]{0}\n"
        " value: <3 c @0> (size=64,offset=32): f32[16]{0}\n"
        " value: <4 t{} @0> (size=16,offset=80): (f32[8], f32[8])\n"
    )
    (tmp_path / "m.cpu_after_optimizations-live-range.txt").write_text(
        "  BufferLiveRange:\n    p{}:0-9\n    a{}:1-3\n    b{}:3-6\n    c{}:2-3\n    t{}:7-8\n"
    )
    # at 3: a and b in one buffer (32) and c (64); t (16) lies over c's bytes, later
    assert xla_heap.temp_live_peak(tmp_path, 96) == 96
    assert xla_heap.temp_live_peak(tmp_path, 128) is None  # (no module with that heap)


def test_the_four_axis_benchmark_times_pricing_and_puts_back_what_it_wrapped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a small program and mesh: the pricing is timed and its pairs counted, every plan is
    listed, and the planner's own functions are themselves again after."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import four_axis_planning

    import shardwise._program.pricing as pricing
    import shardwise._program.reading as reading

    build, grid = reading.build_problem, pricing.reshard_grid
    tiny = (dict(name="mlp", batch=64, hidden=32, ffn=64), "a=2,b=4", False)
    monkeypatch.setitem(four_axis_planning.PROGRAMS, "tiny", tiny)
    found = four_axis_planning.planned("tiny")
    assert reading.build_problem is build and pricing.reshard_grid is grid
    assert found["pairs"] > 0 and found["pricing_s"] >= 0 and found["plan_s"] >= 0
    assert "search" in found["plans"] and found["mesh"] == "a=2,b=4"
