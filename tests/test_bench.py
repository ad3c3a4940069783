"""The benchmark code at tiny sizes: every workload and peer runs and is checked; no timing
assertions (speed is measured by `shardwise bench`, not by tests)."""

from __future__ import annotations

import json
import sys

import jax
import numpy as np
import pytest
from typer.testing import CliRunner

import shardwise
from shardwise._runtime.timing import alternate, block, paired_ratio
from shardwise.bench import run_bench
from shardwise.bench.run import correct
from shardwise.bench.workloads import PEERS, installed
from shardwise.cli import app

runner = CliRunner()


@pytest.fixture(scope="module")
def tiny():
    return run_bench("tiny", PEERS, repeat=2, curve=True)


def test_every_workload_and_peer_runs_and_is_correct(tiny):
    assert [w["name"] for w in tiny["workloads"]] == ["W1", "W2", "W3", "W4"]
    for w in tiny["workloads"]:
        expected = {"shardwise", "raw"} | {p for p in PEERS if installed(p)}
        assert set(w["correct"]) == expected
        assert all(w["correct"].values()), w["correct"]
        assert set(w["peers"]) == expected - {"shardwise", "raw"}
        for key in ("shardwise_seconds", "bytes", "flops", "roofline_fraction", "layer_overhead"):
            assert key in w
        assert w["ratios"].keys() == w["peers"].keys()


def test_machine_limits_are_measured(tiny):
    m = tiny["machine"]
    assert m["cores"] >= 1
    assert m["memory_gbps"] >= max(m["memory_read_gbps"], m["memory_copy_gbps"]) > 0
    assert m["sgemm_gflops"] > 0
    import os

    assert m["malloc_huge_pages"] is (
        "glibc.malloc.hugetlb=1" in os.environ.get("GLIBC_TUNABLES", "")
    )


def test_curve(tiny):
    assert [p["n"] for p in tiny["w1_curve"]] == [1000, 8000]
    assert all(p["shardwise_seconds"] > 0 and p["numpy_seconds"] > 0 for p in tiny["w1_curve"])


def test_plot(tiny, tmp_path):
    from shardwise.bench.plot import plot_bench

    path = plot_bench(tiny, tmp_path / "bench.png")
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_plot_says_a_roofline_share_over_100_percent_is_the_probes(tiny, tmp_path, monkeypatch):
    """A workload read faster than the run's bandwidth probe (slowed on a busy machine) had
    been labelled "112% of roofline" with no word, where the table's caption explains it."""
    import copy

    from matplotlib.figure import Figure

    import shardwise.bench.plot as plot

    drawn = []

    class Kept(Figure):
        def savefig(self, *args, **kwargs):
            drawn.append(self)
            return super().savefig(*args, **kwargs)

    monkeypatch.setattr(plot, "_import_matplotlib", lambda: Kept)
    doc = copy.deepcopy(tiny)  # (the measured shares depend on the machine's load: set)
    for k, w in enumerate(doc["workloads"]):
        w["roofline_fraction"] = 1.117 if k == 0 else 0.5
    plot.plot_bench(doc, tmp_path / "bench.png")
    labels = [t.get_text() for t in drawn[0].axes[0].get_xticklabels()]
    assert "112% of roofline\n(its probe was slowed)" in labels[0], labels
    assert all("probe" not in label for label in labels[1:]), labels


def test_correct_catches_a_wrong_answer():
    ref = np.array([3.0, 3.0])
    assert correct(np.array([3.0, 3.0], np.float32), ref, 3)[0]
    assert not correct(np.array([3.0, 3.1], np.float32), ref, 3)[0]
    assert not correct(np.array([3.0], np.float32), ref[:1].repeat(2), 3)[0]


def test_alternate_runs_every_runner():
    calls = {"a": 0, "b": 0}

    def make(name):
        def run():
            calls[name] += 1

        return run

    medians = alternate({"a": make("a"), "b": make("b")}, repeat=4)
    assert set(medians) == {"a", "b"} and calls == {"a": 5, "b": 5}


def test_alternate_starts_every_timed_call_on_a_quiet_machine(monkeypatch):
    from shardwise._runtime import timing

    events = []
    monkeypatch.setattr(timing.time, "sleep", lambda s: events.append(("idle", s)))
    alternate({"a": lambda: events.append("a"), "b": lambda: events.append("b")}, repeat=3)
    timed = events[2:]  # after one warm-up call each
    assert timed[0::2] == [("idle", timing.QUIET_SECONDS)] * 6
    assert timed[1::2] == ["a", "b", "b", "a", "a", "b"]


def test_paired_ratio_compares_runs_pair_by_pair(monkeypatch):
    # a fake clock: "a" takes 3 units, "b" 2, plus a drift that grows every call and would
    # skew medians taken over a whole round; paired ratios stay near 1.5
    now = [0.0]
    calls = []

    def tick(cost):
        def run():
            calls.append(cost)
            now[0] += cost * (1 + 0.001 * len(calls))

        return run

    monkeypatch.setattr("shardwise._runtime.timing.time.perf_counter", lambda: now[0])
    ratio = paired_ratio(tick(3.0), tick(2.0), pairs=9)
    assert ratio == pytest.approx(1.5, rel=0.01)
    assert len(calls) == 2 + 2 * 9  # one warm-up each, then the pairs


def test_cli_bench_json_contract(tmp_path):
    saved = tmp_path / "bench.json"
    argv = ["bench", "--suite", "tiny", "--repeat", "1", "--peers", "numpy", "--json"]
    result = runner.invoke(app, [*argv, "--out", str(saved)])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    # the results name the CPU and the versions they ran on, printed and saved alike
    assert json.loads(saved.read_text())["host"] == data["host"]
    assert data["host"]["cpu"] and data["host"]["versions"]["shardwise"] == shardwise.__version__
    assert set(data["host"]["versions"]) == {"jax", "jaxlib", "numpy", "shardwise"}
    assert {"cores", "memory_read_gbps", "memory_copy_gbps", "sgemm_gflops"} <= set(data["machine"])
    w = data["workloads"][0]
    assert {"name", "shardwise_seconds", "bytes", "flops", "roofline_fraction", "peers"} <= set(w)
    assert set(w["peers"]) == {"numpy"}


def test_the_tiny_suites_cache_sized_probe_is_not_called_memory_and_over_100_is_said():
    """The tiny suite reads 8 MB, which a cache holds: its 239 GB/s had headed the table as the
    machine's memory bandwidth; a workload over 100% of its roofline went unremarked."""
    from shardwise.cli.bench import bench_table

    doc = {"machine": {"cores": 2, "memory_gbps": 239.1, "probe_bytes": 8 * 10**6,
                       "sgemm_gflops": 100.0},
           "devices": {"count": 8, "platform": "cpu"},
           "workloads": [{"name": "W1", "title": "t", "shardwise_seconds": 1e-3,
                          "roofline_fraction": 1.86, "roofline_fraction_machine": 1.21,
                          "ratios": {}, "peers": {}, "layer_overhead": 0.1,
                          "correct": {"shardwise": True}}]}  # fmt: skip
    table = bench_table(doc, "tiny", 1)
    assert "a read of 8 MB (in cache) 239.1 GB/s" in str(table.title)
    assert "roofline is a floor there, not a ceiling" in str(table.caption)


def test_host_names_the_cpu_and_the_libraries_versions(tmp_path):
    """Saved results had not said what machine and what libraries they were measured on."""
    from shardwise.bench.machine import cpu_model, host
    from shardwise.cli.bench import bench_table

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: x\nmodel name\t: Some CPU @ 2.0GHz\n")
    assert cpu_model(info) == "Some CPU @ 2.0GHz"
    assert cpu_model(tmp_path / "absent") != ""  # (platform's word, or "unknown CPU")
    h = host(["numpy", "torch", "dask", "jax"], cpuinfo=info)
    assert h["cpu"] == "Some CPU @ 2.0GHz"
    assert list(h["versions"]) == ["jax", "jaxlib", "numpy", "shardwise", "torch", "dask"]
    assert h["versions"]["numpy"] == np.__version__
    doc = {"machine": {"cores": 2, "memory_gbps": 9.0, "sgemm_gflops": 100.0},
           "devices": {"count": 8, "platform": "cpu"}, "host": h, "workloads": []}  # fmt: skip
    title = str(bench_table(doc, "tiny", 1).title)
    assert title.startswith("shardwise bench (tiny) on Some CPU @ 2.0GHz (")
    assert f"numpy {np.__version__}, shardwise {shardwise.__version__}" in title


def test_cli_bench_bad_input():
    result = runner.invoke(app, ["bench", "--suite", "huge"])
    assert result.exit_code == 2 and "not one of seed, full, tiny" in result.output
    result = runner.invoke(app, ["bench", "--peers", "numpy,julia"])
    assert result.exit_code == 2 and "unknown peer 'julia'" in result.output


@pytest.mark.parametrize("peers", ["torch", "numpy,torch"])
def test_cli_bench_says_a_named_peer_is_missing(monkeypatch, peers):
    """--peers torch without torch installed used to run without it and say nothing."""
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch fails, as if not installed
    result = runner.invoke(app, ["bench", "--suite", "tiny", "--repeat", "1", "--peers", peers])
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert "--peers names torch, which is not installed here; install torch (pip install" in text
    assert "shardwise[bench]" in text and "leave it out of --peers" in text


def test_cli_bench_notes_the_default_peers_that_are_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    result = runner.invoke(app, ["bench", "--suite", "tiny", "--repeat", "1", "--json"])
    assert result.exit_code == 0, result.output
    assert "not installed, so not benchmarked: torch (pip install" in " ".join(
        result.stderr.split()
    )
    assert all("torch" not in w["peers"] for w in json.loads(result.stdout)["workloads"])


def test_bench_refuses_a_bad_plot_an_out_folder_and_too_few_devices_before_measuring(
    tmp_path, monkeypatch
):
    """A --plot of another format, or --out naming a folder, had failed after the whole run
    (the results lost, as "a bug in shardwise"); too few devices had been said as a mesh
    'devices=8' the user never gave, after the machine was measured."""
    import shardwise.bench as bench

    def measured(*args, **kwargs):
        raise AssertionError("measured before the arguments were checked")

    monkeypatch.setattr(bench, "run_bench", measured)
    cases = [
        (["--plot", str(tmp_path / "b.txt")], "must end in .png or .svg"),
        (["--out", str(tmp_path)], "is a folder; give the path of a file in it"),
    ]
    for extra, said in cases:
        result = runner.invoke(app, ["bench", "--suite", "tiny", "--peers", "numpy", *extra])
        assert result.exit_code == 2 and said in " ".join(result.output.split()), result.output
    import jax

    monkeypatch.setattr(jax, "device_count", lambda: 4)
    result = runner.invoke(app, ["bench", "--suite", "tiny", "--peers", "numpy"])
    assert result.exit_code == 2
    assert "bench's workloads run on 8 devices" in " ".join(result.output.split())


def test_block_waits_for_every_array_of_any_pytree():
    """A Flax ``TrainState``, an Equinox module, a registered dataclass: ``block`` had waited
    only inside tuples, lists and dicts, so timing a step that returns one timed its
    dispatch, and runs that overlapped stopped XLA's CPU collectives."""
    import dataclasses

    waited = []

    class Pending:
        def block_until_ready(self):
            waited.append(self)
            return self

    @jax.tree_util.register_dataclass
    @dataclasses.dataclass
    class State:
        params: dict
        step: object

    leaves = [Pending(), Pending(), Pending()]
    state = State({"w": leaves[0], "b": [leaves[1]]}, leaves[2])
    assert block(state) is state
    assert sorted(map(id, waited)) == sorted(map(id, leaves))


def test_block_takes_a_dict_whose_keys_do_not_sort():
    """Another library's result may be a dict of mixed keys, which JAX's trees cannot sort."""
    waited = []

    class Pending:
        def block_until_ready(self):
            waited.append(self)

    found = {1: Pending(), "a": [Pending()]}
    assert block(found) is found and len(waited) == 2
    held = [found, Pending()]  # (inside a list: the fallback had called itself on the list)
    assert block(held) is held and len(waited) == 5
