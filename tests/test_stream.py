"""Streaming: equal to in-memory, resumable after SIGKILL, bounded memory, clear errors."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from typer.testing import CliRunner

import shardwise
from shardwise import ArgumentError, ShapeError, ShardwiseError
from shardwise._data.sources import Source
from shardwise._data.stream import plan_stream
from shardwise._model.op import Op
from shardwise.cli import app

CHILD = Path(__file__).with_name("stream_child.py")
runner = CliRunner()


def _inputs(tmp_path, n=10_001, d=3, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    a, b = rng.random((n, d)).astype(dtype), rng.random((n, d)).astype(dtype)
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    return a, b


@pytest.mark.parametrize(
    ("equation", "shape_b"),
    [
        ("nd,nd->n", None),
        ("nd,nd->", None),
        ("nd,nd->d", None),
        ("nd,ne->de", (10_001, 2)),
        ("nd,d->n", (3,)),  # along 'n', which the vector lacks: it is read whole
        ("nd,e->nde", (2,)),
    ],
)
def test_streamed_equals_in_memory(tmp_path, equation, shape_b):
    a, b = _inputs(tmp_path)
    if shape_b:
        b = np.random.default_rng(1).random(shape_b).astype(np.float32)
        np.save(tmp_path / "b.npy", b)
    out = tmp_path / "out.npy"
    r = shardwise.stream(
        equation, tmp_path / "a.npy", tmp_path / "b.npy", mesh="devices=8", out=out, budget="64KiB"
    )
    assert r.chunks > 4 and r.computed == r.chunks
    expected = np.einsum(equation, a.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(np.load(out), expected, rtol=1e-4)
    assert not out.with_name("out.npy.partial").exists()


def test_sources_numpy_zarr_dask_and_zarr_output(tmp_path):
    import dask.array as da
    import zarr

    a, b = _inputs(tmp_path)
    z = zarr.open_array(str(tmp_path / "a.zarr"), mode="w", shape=a.shape, dtype=a.dtype)
    z[:] = a
    expected = np.einsum("nd,nd->n", a, b)
    for first in (a, str(tmp_path / "a.zarr"), da.from_array(a, chunks=(3000, 3))):
        out = tmp_path / f"out-{random.random()}.zarr"
        shardwise.stream("nd,nd->n", first, b, out=out, budget="64KiB")
        np.testing.assert_allclose(zarr.open_array(str(out), mode="r")[:], expected, rtol=1e-5)


@pytest.mark.parametrize("layout", ["auto", "n=x,d=y"])
def test_chunk_layouts(tmp_path, layout):
    a, b = _inputs(tmp_path, d=4)
    out = tmp_path / "o.npy"
    shardwise.stream(
        "nd,nd->n",
        tmp_path / "a.npy",
        tmp_path / "b.npy",
        mesh="x=2,y=2",
        out=out,
        budget="64KiB",
        layout=layout,
    )
    np.testing.assert_allclose(np.load(out), np.einsum("nd,nd->n", a, b), rtol=1e-5)


@pytest.mark.parametrize(
    ("mesh", "equation", "spec", "blocks"),
    [
        ("devices=8", "nd,nd->n", ("devices",), 8),  # one block per device
        ("x=2,y=4", "nd,nd->n", ("x",), 2),  # replicated over y: one copy of each written
        ("x=2,y=4", "nd,nd->nd", ("x", "y"), None),  # split along d too: assembled instead
    ],
)
def test_results_are_written_from_the_devices_own_blocks(tmp_path, mesh, equation, spec, blocks):
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from shardwise._data.chunks import shard_blocks

    a, b = _inputs(tmp_path, n=1000, d=4)
    value = np.einsum(equation, a, b)
    result = jax.device_put(value, NamedSharding(shardwise.mesh(mesh), P(*spec)))
    found = shard_blocks(result, 0)
    if blocks is None:
        assert found is None
    else:
        assert [start for start, _ in found] == [k * 1000 // blocks for k in range(blocks)]
        np.testing.assert_array_equal(np.concatenate([block for _, block in found]), value)
    layout = ",".join(f"{i}={axis}" for i, axis in zip("nd", spec, strict=False))
    out = tmp_path / "o.npy"
    shardwise.stream(
        equation,
        tmp_path / "a.npy",
        tmp_path / "b.npy",
        mesh=mesh,
        out=out,
        budget="64KiB",
        layout=layout,
    )
    np.testing.assert_allclose(np.load(out), value, rtol=1e-5)


def test_output_leaves_the_page_cache_once_on_disk(tmp_path, monkeypatch):
    a, b = _inputs(tmp_path)
    events: list[tuple[str, int, int]] = []
    flush, advise = os.fdatasync, os.posix_fadvise

    def fdatasync(fd):
        events.append(("flush", 0, 0))
        flush(fd)

    def fadvise(fd, pos, length, advice):
        assert advice == os.POSIX_FADV_DONTNEED
        events.append(("drop", pos, length))
        advise(fd, pos, length, advice)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    monkeypatch.setattr(os, "posix_fadvise", fadvise)
    out = tmp_path / "o.npy"
    r = shardwise.stream(
        "nd,nd->n",
        *(tmp_path / f for f in ("a.npy", "b.npy")),
        out=out,
        mesh="devices=8",
        budget="64KiB",
    )
    np.testing.assert_allclose(np.load(out), np.einsum("nd,nd->n", a, b), rtol=1e-5)
    drops = [(pos, length) for kind, pos, length in events if kind == "drop"]
    assert r.chunks > 4 and events[0][0] == "flush"  # nothing dropped before it is on disk
    header = os.path.getsize(out) - a.shape[0] * 4
    covered = np.zeros(a.shape[0] * 4, bool)
    for pos, length in drops:
        covered[pos - header : pos - header + length] = True
    assert covered.all()  # every byte of the result was let go


def test_rerun_after_completion_does_no_work(tmp_path):
    _inputs(tmp_path)
    args = ("nd,nd->n", tmp_path / "a.npy", tmp_path / "b.npy")
    first = shardwise.stream(*args, out=tmp_path / "o.npy", budget="64KiB")
    before = (tmp_path / "o.npy").stat().st_mtime_ns
    again = shardwise.stream(*args, out=tmp_path / "o.npy", budget="64KiB")
    assert first.computed > 0 and again.computed == 0 and again.skipped == first.chunks
    assert (tmp_path / "o.npy").stat().st_mtime_ns == before


def _run_child(args, slow=False):
    cmd = [sys.executable, str(CHILD), *map(str, args)] + (["--slow"] if slow else [])
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@pytest.mark.slow
@pytest.mark.parametrize("equation", ["nd,nd->n", "nd,nd->"])
def test_resume_after_sigkill_gives_identical_output(tmp_path, equation):
    _inputs(tmp_path, n=40_000)
    ins = [tmp_path / "a.npy", tmp_path / "b.npy"]
    reference = tmp_path / "reference.npy"
    shardwise.stream(equation, *ins, out=reference, budget="64KiB")
    rng = random.Random(7)
    trials = 6
    interrupted = 0
    for trial in range(trials):
        out = tmp_path / f"out{trial}.npy"
        child = _run_child([equation, out, "64KiB", *ins], slow=True)
        # kill once the child has started writing chunks, at a random moment
        manifest = out.with_name(out.name + ".manifest.json")
        deadline = time.time() + 60
        while not manifest.exists() and time.time() < deadline and child.poll() is None:
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.6))
        if child.poll() is None:
            child.send_signal(signal.SIGKILL)
            interrupted += 1
        child.wait()
        if not out.exists():
            assert out.with_name(out.name + ".partial").exists()
        resumed = shardwise.stream(equation, *ins, out=out, budget="64KiB")
        assert resumed.computed + resumed.skipped == resumed.chunks
        assert out.read_bytes() == reference.read_bytes()
    assert interrupted >= trials // 2


def test_peak_memory_stays_within_the_budget(tmp_path):
    budget = 8 * 2**20
    big_n = 8 * budget // 24  # two (n, 3) float32 inputs: 8× the budget in all
    rng = np.random.default_rng(0)
    for name, n in (("big", big_n), ("small", big_n // 64)):
        for side in "ab":
            np.save(tmp_path / f"{name}-{side}.npy", rng.random((n, 3), dtype=np.float32))
    peaks = {}
    for name in ("big", "small"):
        out = subprocess.run(
            [
                sys.executable,
                str(CHILD),
                "nd,nd->n",
                str(tmp_path / f"{name}.npy"),
                str(budget),
                "--rss",
                str(tmp_path / f"{name}-a.npy"),
                str(tmp_path / f"{name}-b.npy"),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        peaks[name] = json.loads(out.stdout.strip().splitlines()[-1])["peak_rss"]
    # the small run's peak is the runtime's fixed overhead plus a small chunk
    assert peaks["big"] - peaks["small"] <= 1.5 * budget, peaks


def test_plan_refuses_a_budget_too_small_and_says_what_would_do():
    src = Source("a", (1000, 3), np.dtype("float32"), "numpy")
    with pytest.raises(
        ArgumentError, match=r"cannot hold the smallest chunk.*or more \(--host-memory"
    ):
        plan_stream(Op.parse("nd,nd->n"), [src, src], devices=8, budget=100)
    with pytest.raises(ArgumentError, match="this equation has none"):
        plan_stream(
            Op.parse("i,j->"),
            [Source("a", (4,), np.dtype("float32"), "numpy")] * 2,
            devices=1,
            budget=10**6,
        )


def test_bad_inputs(tmp_path, monkeypatch):
    a, b = _inputs(tmp_path)
    np.save(tmp_path / "short.npy", b[:100])
    np.save(tmp_path / "f64.npy", b.astype(np.float64))
    with pytest.raises(ShapeError, match="index 'n' has size 10001 in operand 0 but 100"):
        shardwise.stream(
            "nd,nd->n", tmp_path / "a.npy", tmp_path / "short.npy", out=tmp_path / "o.npy"
        )
    with pytest.raises(ShapeError, match="must share one dtype"):
        shardwise.stream(
            "nd,nd->n", tmp_path / "a.npy", tmp_path / "f64.npy", out=tmp_path / "o.npy"
        )
    with pytest.raises(ArgumentError, match="does not exist"):
        shardwise.stream("nd,nd->n", tmp_path / "nope.npy", b, out=tmp_path / "o.npy")
    with pytest.raises(ArgumentError, match=r"folder .* does not exist"):
        shardwise.stream("nd,nd->n", a, b, out=tmp_path / "no" / "o.npy")
    monkeypatch.setattr("shardwise._data.sink._free_bytes", lambda folder: 10)
    with pytest.raises(ShardwiseError, match="not enough disk space"):
        shardwise.stream("nd,nd->n", a, b, out=tmp_path / "full.npy")
    monkeypatch.undo()
    (tmp_path / "exists.npy").write_bytes(b"keep me")
    with pytest.raises(ArgumentError, match="already exists"):
        shardwise.stream("nd,nd->n", a, b, out=tmp_path / "exists.npy")
    assert (tmp_path / "exists.npy").read_bytes() == b"keep me"


def test_changed_input_is_refused_and_results_kept(tmp_path):
    a, _ = _inputs(tmp_path, n=40_000)
    ins = [tmp_path / "a.npy", tmp_path / "b.npy"]
    out = tmp_path / "o.npy"
    child = _run_child(["nd,nd->n", out, "64KiB", *ins], slow=True)
    manifest = out.with_name("o.npy.manifest.json")
    while not manifest.exists() and child.poll() is None:
        time.sleep(0.01)
    time.sleep(0.3)
    child.send_signal(signal.SIGKILL)
    child.wait()
    if out.exists():
        pytest.skip("the child finished before it could be interrupted")
    partial = out.with_name("o.npy.partial").read_bytes()
    np.save(ins[0], a + 1)
    with pytest.raises(ShardwiseError, match=r"input 0 .* changed since the last run"):
        shardwise.stream("nd,nd->n", *ins, out=out, budget="64KiB")
    assert out.with_name("o.npy.partial").read_bytes() == partial
    assert manifest.exists()


def test_zarr_missing_names_the_extra(tmp_path, monkeypatch):
    import sys as _sys

    (tmp_path / "z").mkdir()
    monkeypatch.setitem(_sys.modules, "zarr", None)
    with pytest.raises(ImportError, match=r"shardwise\[zarr\]"):
        shardwise.stream("nd,nd->n", tmp_path / "z", np.ones((8, 3)), out=tmp_path / "o.npy")


def _run_cli(tmp_path, out, *options, n=1000):
    if not (tmp_path / "a.npy").exists():
        _inputs(tmp_path, n=n)
    ins = [str(tmp_path / "a.npy"), str(tmp_path / "b.npy")]
    return runner.invoke(app, ["run", "nd,nd->n", *ins, "--out", str(out), *options])


def test_cli_run_refuses_an_output_that_is_neither_npy_nor_zarr(tmp_path):
    """--out o3.txt used to write a Zarr folder named o3.txt: a name is .npy, .zarr or a Zarr
    folder that exists, and anything else is refused before anything is written."""
    result = _run_cli(tmp_path, tmp_path / "o3.txt")
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert "neither a .npy file nor a Zarr folder; name it o3.npy" in text, text
    assert "o3.zarr" in text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.npy", "b.npy"]
    with pytest.raises(ArgumentError, match=r"neither a \.npy file nor a Zarr folder"):
        shardwise.stream("nd,nd->n", np.ones((8, 3)), np.ones((8, 3)), out=tmp_path / "o")


def test_cli_run_interrupted_says_the_chunks_are_kept_and_how_to_resume(tmp_path, monkeypatch):
    """Ctrl-C ended the command with exit 130 and not a word; the chunks written are kept."""
    import shardwise._data.stream as streaming

    def interrupted(*args, on_chunk, **kwargs):
        on_chunk(1, 4, 1024)
        raise KeyboardInterrupt

    monkeypatch.setattr(streaming, "stream", interrupted)
    result = _run_cli(tmp_path, tmp_path / "o.npy")
    assert result.exit_code == 130, result.output
    text = " ".join(result.output.split())
    assert "interrupted: the chunks written to" in text and "run the same command to resume" in text


def test_a_bfloat16_npy_file_is_refused_saying_so(tmp_path):
    """np.save writes bfloat16 as raw bytes (|V2): it had been refused as "not a number"."""
    np.save(tmp_path / "a.npy", np.ones((300, 4), ml_dtypes.bfloat16))
    a = tmp_path / "a.npy"
    with pytest.raises(
        shardwise.ArgumentTypeError,
        match=r"np\.save writes bfloat16 so.*view\(ml_dtypes\.bfloat16\)",
    ):
        shardwise.stream("nd,nd->n", a, a, out=tmp_path / "o.npy")


def test_cli_run_error_comes_without_a_progress_bar(tmp_path):
    result = _run_cli(tmp_path, tmp_path / "o.npy", "--host-memory", "100B")
    assert result.exit_code == 2
    assert result.output.startswith("error: a memory budget of 100 B"), result.output
    assert "━" not in result.output and "0/?" not in result.output


@pytest.mark.parametrize(("memory", "summary"), [("2GiB", "1 chunk computed"),
                                                 ("64KiB", "4 chunks computed")])  # fmt: skip
def test_cli_run_prints_one_summary_with_one_throughput(tmp_path, memory, summary):
    """One line at the end, with its plurals right and one throughput figure (the progress bar
    is gone by then, and showed no second, differently timed figure)."""
    result = _run_cli(tmp_path, tmp_path / "o.npy", "--host-memory", memory, n=3000)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert text.startswith(f"wrote {tmp_path / 'o.npy'}: {summary}"), text
    assert text.count("/s") == 1 and "━" not in text, text
    again = " ".join(_run_cli(tmp_path, tmp_path / "o.npy", "--host-memory", memory).output.split())
    assert f"({summary.split(' computed')[0]}); nothing to do" in again, again


def test_cli_run(tmp_path):
    a, b = _inputs(tmp_path)
    out = tmp_path / "o.npy"
    args = [
        "run",
        "nd,nd->n",
        str(tmp_path / "a.npy"),
        str(tmp_path / "b.npy"),
        "--out",
        str(out),
        "--host-memory",
        "64KiB",
    ]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["computed"] == data["chunks"] > 1
    np.testing.assert_allclose(np.load(out), np.einsum("nd,nd->n", a, b), rtol=1e-5)
    again = runner.invoke(app, args)
    assert again.exit_code == 0 and "nothing to do" in again.output
    small = runner.invoke(
        app, [*args[:4], "--out", str(tmp_path / "other.npy"), "--host-memory", "100B"]
    )
    assert small.exit_code == 2
    assert "cannot hold the smallest chunk" in " ".join(small.output.split())
    os.remove(out)


@pytest.mark.parametrize("equation", ["nd,nd->n", "nd,nd->"])
def test_npy_chunks_are_computed_from_the_page_cache(tmp_path, monkeypatch, equation):
    # 10 001 rows in chunks of 1280: the last chunk has 1041 rows, so on 8 devices of 160
    # rows one device holds the end of the file and one lies wholly past it (zero padding)
    a, b = _inputs(tmp_path)

    def no_reads(*args, **kwargs):
        raise AssertionError("full .npy chunks on CPU devices must be mapped, not read")

    monkeypatch.setattr(Source, "read", no_reads)
    # mapped only where nobody can truncate the file (a read-only file system): pretend so
    monkeypatch.setattr(Source, "mappable", property(lambda self: self.kind == "npy"))
    out = tmp_path / "out.npy"
    r = shardwise.stream(
        equation,
        tmp_path / "a.npy",
        tmp_path / "b.npy",
        mesh="devices=8",
        out=out,
        budget="1MiB",
        chunk=1280,
    )
    assert r.chunks == 8
    expected = np.einsum(equation, a.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(np.load(out), expected, rtol=1e-5)


@pytest.mark.parametrize(("mesh", "spec"), [("devices=8", ("devices",)), ("x=2,y=4", ("x", "y"))])
def test_in_place_pads_missing_rows_with_zeros(mesh, spec):
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from shardwise._runtime.hostmem import in_place

    block = np.arange(37 * 8, dtype=np.float32).reshape(37, 8) + 1
    sharding = NamedSharding(shardwise.mesh(mesh), P(*spec))
    placed = in_place(block, sharding, (64, 8))
    expected = np.zeros((64, 8), np.float32)
    expected[:37] = block
    np.testing.assert_array_equal(np.asarray(placed), expected)
    for shard in placed.addressable_shards:
        np.testing.assert_array_equal(np.asarray(shard.data), expected[shard.index])


def test_a_disk_failing_mid_run_keeps_earlier_chunks_and_resumes(tmp_path, monkeypatch):
    import errno

    a, b = _inputs(tmp_path, n=40_000)
    ins = [tmp_path / "a.npy", tmp_path / "b.npy"]
    out = tmp_path / "o.npy"
    real = os.fdatasync
    manifest = out.with_name("o.npy.manifest.json")

    def failing(fd):  # once a chunk is recorded (flushes are batched as the machine allows)
        if manifest.exists() and json.loads(manifest.read_text())["done"]:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd)

    monkeypatch.setattr(os, "fdatasync", failing)
    with pytest.raises(ShardwiseError, match=r"No space left on device.*Earlier chunks are kept"):
        shardwise.stream("nd,nd->n", *ins, out=out, budget="64KiB")
    monkeypatch.undo()
    assert not out.exists()
    recorded = json.loads(out.with_name("o.npy.manifest.json").read_text())["done"]
    assert recorded  # the chunks flushed before the failure stay recorded
    resumed = shardwise.stream("nd,nd->n", *ins, out=out, budget="64KiB")
    assert resumed.skipped == len(recorded) and resumed.computed == resumed.chunks - len(recorded)
    np.testing.assert_allclose(np.load(out), np.einsum("nd,nd->n", a, b), rtol=1e-5)


def test_a_page_cache_that_refuses_advice_changes_nothing(tmp_path, monkeypatch):
    import errno

    a, b = _inputs(tmp_path)

    def refuse(*args):
        raise OSError(errno.EINVAL, "advice not supported here")

    monkeypatch.setattr(os, "posix_fadvise", refuse)
    out = tmp_path / "o.npy"
    shardwise.stream("nd,nd->n", tmp_path / "a.npy", tmp_path / "b.npy", out=out, budget="64KiB")
    np.testing.assert_allclose(np.load(out), np.einsum("nd,nd->n", a, b), rtol=1e-5)


def test_an_exception_from_on_chunk_stops_the_run_and_the_same_call_resumes(tmp_path):
    """on_chunk is called as chunks become durable, with a count that grows (several chunks
    may be recorded at once); once it raises it is not called again, the run stops and the
    error reaches the caller, and the same call then finishes the rest."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal((8192, 16)).astype(np.float32)
    b = rng.standard_normal((8192, 16)).astype(np.float32)
    seen: list[int] = []

    class Stop(Exception):
        pass

    def stop_early(done: int, total: int, nbytes: int) -> None:
        seen.append(done)
        if done >= 2:
            raise Stop

    out = tmp_path / "o.npy"
    with pytest.raises(Stop):
        shardwise.stream("nd,nd->n", a, b, out=out, budget="64KiB", on_chunk=stop_early)
    assert seen == sorted(seen) and len([d for d in seen if d >= 2]) == 1  # not called again
    assert not out.exists()
    r = shardwise.stream("nd,nd->n", a, b, out=out, budget="64KiB")
    assert r.skipped >= 2 and r.computed == r.chunks - r.skipped
    np.testing.assert_allclose(np.load(out), np.einsum("nd,nd->n", a, b), rtol=1e-5, atol=1e-5)


def test_a_folder_that_is_not_a_zarr_array_is_a_clear_error(tmp_path):
    """A plain folder (or a Zarr group) given as an input used to end in "unexpected
    ArrayNotFoundError", exit 1: it is refused naming the folder and what inputs can be."""
    zarr = pytest.importorskip("zarr")
    _inputs(tmp_path, n=300)
    (tmp_path / "plain").mkdir()
    zarr.open_group(str(tmp_path / "group.zarr"), mode="w")
    out = tmp_path / "o.npy"
    for folder in ("plain", "group.zarr"):
        with pytest.raises(ArgumentError, match=rf"input 1 '.*{folder}' is a folder but not a"):
            shardwise.stream("nd,nd->n", tmp_path / "a.npy", tmp_path / folder, out=out)
        argv = ["run", "nd,nd->n", str(tmp_path / "a.npy"), str(tmp_path / folder)]
        result = runner.invoke(app, [*argv, "--out", str(out)])
        assert result.exit_code == 2, result.output
        text = " ".join(result.output.split())
        assert f"{folder}' is a folder but not a Zarr array" in text, text
        assert "give a .npy file or a Zarr array's folder" in text, text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.npy", "b.npy", "group.zarr", "plain"]


@pytest.mark.parametrize("kind", ["npy", "numpy"])
def test_inputs_of_either_byte_order_stream_together(tmp_path, kind):
    """A big-endian input beside a little-endian one used to be refused as "must share one
    dtype, but be.npy is float32, le.npy is float32": both are read in native byte order."""
    rng = np.random.default_rng(5)
    little = rng.random((3000, 4)).astype("<f4")
    big = rng.random((3000, 4)).astype(">f4")
    np.save(tmp_path / "le.npy", little)
    np.save(tmp_path / "be.npy", big)
    ins = [tmp_path / "be.npy", tmp_path / "le.npy"] if kind == "npy" else [big, little]
    out = tmp_path / "o.npy"
    r = shardwise.stream("nd,nd->n", *ins, mesh="devices=8", out=out, budget="64KiB")
    assert r.chunks > 1
    want = np.einsum("nd,nd->n", big.astype(np.float64), little.astype(np.float64))
    np.testing.assert_allclose(np.load(out), want, rtol=1e-5)
    argv = ["run", "nd,nd->n", str(tmp_path / "be.npy"), str(tmp_path / "le.npy")]
    result = runner.invoke(app, [*argv, "--out", str(tmp_path / "cli.npy")])
    assert result.exit_code == 0, result.output
    np.testing.assert_allclose(np.load(tmp_path / "cli.npy"), want, rtol=1e-5)


def test_an_npy_output_is_streamed_along_its_first_axis(tmp_path):
    """'nd,nd->dn' into a .npy file used to be cut along 'n' and refused at the first chunk's
    write ("a .npy output is written along its first axis only"), leaving work files behind:
    the plan picks an index the output can be written along ('d'), before any file is made;
    a Zarr output, written along any axis, keeps the longest ('n')."""
    a, b = _inputs(tmp_path, n=300)
    out = tmp_path / "o.npy"
    argv = ["run", "nd,nd->dn", str(tmp_path / "a.npy"), str(tmp_path / "b.npy")]
    with pytest.warns(shardwise.ShardwiseWarning, match=r"3 rows along 'd' is padded to 128"):
        result = runner.invoke(app, [*argv, "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["index"] == "d"
    np.testing.assert_allclose(np.load(out), np.einsum("nd,nd->dn", a, b), rtol=1e-6)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "a.npy",
        "b.npy",
        "o.npy",
        "o.npy.manifest.json",
    ]
    zarr = pytest.importorskip("zarr")
    zarr_out = tmp_path / "o.zarr"
    r = shardwise.stream("nd,nd->dn", a, b, mesh="devices=8", out=zarr_out, chunk=128)
    assert r.plan.index == "n" and r.chunks > 1
    got = np.asarray(zarr.open_array(str(zarr_out), mode="r")[...])
    np.testing.assert_allclose(got, np.einsum("nd,nd->dn", a, b), rtol=1e-6)


def test_a_run_refused_before_its_first_chunk_leaves_no_work_files(tmp_path):
    """A layout refused at the first compile used to leave o.npy.manifest.json and
    o.npy.partial, and the corrected command on the same --out then failed with "belongs to
    another run": a run stopped before it reads a chunk removes the files it made."""
    a, b = _inputs(tmp_path, n=300)
    out = tmp_path / "o.npy"
    argv = ["run", "nd,nd->d", str(tmp_path / "a.npy"), str(tmp_path / "b.npy"), "--out", str(out)]
    bad = runner.invoke(app, [*argv, "--mesh", "x=2,y=4", "--layout", "n=x,d=y"])
    assert bad.exit_code == 2, bad.output
    assert "cannot be split evenly" in " ".join(bad.output.split()), bad.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.npy", "b.npy"]
    argv[1] = "nd,nd->n"
    fixed = runner.invoke(app, [*argv, "--mesh", "x=2,y=4"])
    assert fixed.exit_code == 0, fixed.output
    np.testing.assert_allclose(np.load(out), np.einsum("nd,nd->n", a, b), rtol=1e-5)


def test_a_matrix_times_a_vector_streams_along_the_matrix_rows(tmp_path):
    """'nd,d->n' used to be cut along 'd' (4 long, padded to 128 rows per chunk) and asked
    for a 1.5 MiB budget for 16 KB of data: it streams along 'n' within 16 KiB."""
    rng = np.random.default_rng(9)
    a, w = rng.random((1000, 4)).astype(np.float32), np.ones(4, np.float32)
    sources = [Source("a", a.shape, a.dtype, "numpy"), Source("w", w.shape, w.dtype, "numpy")]
    plan = plan_stream(Op.parse("nd,d->n"), sources, devices=8, budget=16 << 10)
    assert (plan.index, plan.accumulate) == ("n", False)
    assert plan.peak_bytes <= 16 << 10
    out = tmp_path / "o.npy"
    r = shardwise.stream("nd,d->n", a, w, mesh="devices=8", out=out, budget="16KiB")
    assert r.chunks == plan.chunks > 1
    np.testing.assert_allclose(np.load(out), np.einsum("nd,d->n", a, w), rtol=1e-6)


def test_stream_under_several_processes_is_refused_before_it_touches_the_output(
    tmp_path, monkeypatch
):
    """Under ``shardwise launch`` each process had taken the other's lock on the one output
    ("being written by process 8098", leaving its work files), or crashed fetching an array
    that spans both."""
    import shardwise._data.stream as streaming

    monkeypatch.setattr(streaming, "multi_process", lambda: True)
    a = np.ones((64, 3), np.float32)
    with pytest.raises(ArgumentError, match=r"runs in one process, .*Run it without launch"):
        shardwise.stream("nd,nd->n", a, a, out=tmp_path / "o.npy")
    assert list(tmp_path.iterdir()) == []


def test_a_npy_output_that_cannot_be_cut_along_its_long_index_says_so():
    """'bnd,bnd->bn' into a .npy (written along b, 3 long) can only be cut along 'd' (4
    long, padded to 128 rows a chunk): it had asked for 925 MiB for 9.6 MB of input without
    saying why, nor that a .zarr output, or 'n' first, streams along n."""
    x = Source("x", (3, 100_000, 4), np.dtype("float32"), "numpy")
    with pytest.raises(ArgumentError, match=r"cannot be cut along 'n' \(100,000 long\): write "
                       r"the output as \.zarr, or put 'n' first"):  # fmt: skip
        plan_stream(Op.parse("bnd,bnd->bn"), [x, x], devices=8, budget=64 << 20, first_axis=True)
    assert plan_stream(Op.parse("bnd,bnd->bn"), [x, x], devices=8, budget=64 << 20).index == "n"


def test_a_npy_output_whose_chunks_pad_a_short_index_says_how_much_and_why(tmp_path):
    """The same run within its budget: cut along 'd' (4 long), each chunk 124 rows of zeros
    past it, it had run without a word of the padding or of the .zarr output that avoids it."""
    rng = np.random.default_rng(0)
    a, b = rng.random((3, 2000, 4), np.float32), rng.random((3, 2000, 4), np.float32)
    with pytest.warns(shardwise.ShardwiseWarning) as said:
        result = shardwise.stream("bnd,bnd->bn", a, b, out=tmp_path / "o.npy", budget="1GiB")
    text = " ".join(str(w.message) for w in said)
    assert "the last chunk of 4 rows along 'd' is padded to 128 (124 rows of zeros" in text
    assert "cannot be cut along 'n' (2,000 long): write the output as .zarr" in text
    assert result.plan.index == "d"
    np.testing.assert_allclose(np.load(tmp_path / "o.npy"), (a * b).sum(-1), rtol=1e-5)
    # a .zarr output streams along 'n', padding no more than alignment asks: nothing to say
    zarr_run = shardwise.stream("bnd,bnd->bn", a, b, out=tmp_path / "o.zarr", budget="1GiB")
    assert zarr_run.plan.index == "n"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_narrow_float_summed_over_many_chunks_is_as_exact_as_in_one_go(tmp_path, dtype):
    """The running sum of bfloat16 chunks had been kept in bfloat16: past 8,192 each
    chunk's part (about 32) was under half a step and rounded away, and the sum stopped
    growing (16,384 for 50,000). It is kept in float32 and written in the output's type."""
    rng = np.random.default_rng(0)
    a, b = rng.random((40_000, 4)), rng.random((40_000, 4))
    kind = np.dtype(getattr(ml_dtypes, dtype, dtype))
    x, y = a.astype(kind), b.astype(kind)
    r = shardwise.stream("nd,nd->d", x, y, mesh="devices=8", out=tmp_path / "o.npy", chunk=128)
    assert r.chunks > 300
    got = np.load(tmp_path / "o.npy").view(kind).astype(np.float64)  # (.npy: bfloat16 as V2)
    want = np.einsum("nd,nd->d", x.astype(np.float64), y.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=1e-2)  # (bfloat16 holds 3 digits)


@pytest.mark.parametrize("kind", ["npy", "numpy"])
def test_bytes_read_are_the_inputs_not_the_padded_chunks(tmp_path, kind):
    """Two (10, 3) float32 inputs are 240 bytes; chunks padded to 128 rows had been counted
    whole (3 KiB read, and a throughput inflated alike); a vector read whole for every chunk is
    counted once."""
    rng = np.random.default_rng(3)
    a, w = rng.random((1000, 3)).astype(np.float32), np.ones(3, np.float32)
    small = a[:10]
    if kind == "npy":
        np.save(tmp_path / "s.npy", small)
        np.save(tmp_path / "a.npy", a)
        small, a = tmp_path / "s.npy", tmp_path / "a.npy"  # type: ignore[assignment]
    r = shardwise.stream("nd,nd->n", small, small, mesh="devices=8", out=tmp_path / "o.npy")
    assert r.bytes_read == 2 * 10 * 3 * 4
    r = shardwise.stream("nd,d->n", a, w, mesh="devices=8", out=tmp_path / "v.npy",
                         budget="16KiB")  # fmt: skip
    assert r.chunks > 1 and r.bytes_read == 1000 * 3 * 4 + 3 * 4


@pytest.mark.parametrize(
    ("equation", "shapes"),
    [
        ("nd,nd->n", [(0, 3), (0, 3)]),  # an empty result
        ("nd,nd->", [(0, 3), (0, 3)]),  # a sum of nothing: zero
        ("nd,nd->n", [(5, 0), (5, 0)]),
        ("nd,d->n", [(0, 3), (3,)]),
        ("nd,e->e", [(0, 3), (4,)]),  # summed over 'n', which the vector lacks
        ("ij,jk->ik", [(4, 0), (0, 5)]),
    ],
)
@pytest.mark.parametrize("suffix", [".npy", ".zarr"])
def test_an_empty_input_gives_numpys_result(tmp_path, equation, shapes, suffix):
    """An input with no elements used to end in a bare ZeroDivisionError (the CLI's
    "unexpected ZeroDivisionError", exit 1): the run has no chunk to compute and writes
    NumPy's result, an empty array or zeros."""
    if suffix == ".zarr":
        zarr = pytest.importorskip("zarr")
    arrays = [np.ones(s, np.float32) for s in shapes]
    paths = [tmp_path / f"in{k}.npy" for k in range(len(arrays))]
    for p, a in zip(paths, arrays, strict=True):
        np.save(p, a)
    out = tmp_path / f"o{suffix}"
    r = shardwise.stream(equation, *paths, mesh="devices=8", out=out, budget="1MiB")
    assert (r.chunks, r.computed) == (0, 0)
    got = np.load(out) if suffix == ".npy" else np.asarray(zarr.open_array(str(out))[...])
    want = np.einsum(equation, *arrays)
    assert (got.shape, got.dtype) == (want.shape, want.dtype)
    np.testing.assert_array_equal(got, want)
    assert shardwise.stream(equation, *paths, mesh="devices=8", out=out).computed == 0


def test_the_command_line_streams_an_empty_input(tmp_path):
    np.save(tmp_path / "e.npy", np.zeros((0, 3), np.float32))
    argv = ["run", "nd,nd->n", str(tmp_path / "e.npy"), str(tmp_path / "e.npy")]
    result = runner.invoke(app, [*argv, "--out", str(tmp_path / "o.npy")])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "o.npy holds the result: an input is empty, so there is nothing to compute" in text
    want = np.einsum("nd,nd->n", *[np.zeros((0, 3), np.float32)] * 2)
    got = np.load(tmp_path / "o.npy")
    assert (got.shape, got.dtype) == (want.shape, want.dtype)


def test_an_array_sharded_on_an_explicit_mesh_streams(tmp_path):
    """A jax.Array laid out on an Explicit mesh (jax.make_mesh's default) cannot be indexed
    without saying its result's layout: stream had crashed reading it (ShardingTypeError)."""
    import jax
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((2, 4), ("data", "model"))
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((4000, 64), np.float32), rng.standard_normal((64, 16), np.float32)
    with jax.set_mesh(mesh):
        placed = jax.device_put(a, P("data"))
        shardwise.stream("nd,dk->nk", placed, b, out=tmp_path / "o.npy", budget="1MiB")
    np.testing.assert_allclose(np.load(tmp_path / "o.npy"), a @ b, rtol=1e-5, atol=1e-4)


def test_resuming_says_what_changed_and_how_to_start_over(tmp_path):
    """What a resume refuses names the input the run read (another file had been said to
    have "changed"), the rows of an input read whole as the whole of it (the streamed
    input's rows had been named), and a way to start over that works on a finished output
    (deleting the manifest and partial output alone left the output, then refused); a chunk
    size other than the run's is said, not silently dropped; a chunk may be given as text."""
    rng = np.random.default_rng(5)
    a, b, c = (rng.random((1000, 8)).astype(np.float32) for _ in range(3))
    for name, arr in (("a", a), ("b", b), ("c", c)):
        np.save(tmp_path / f"{name}.npy", arr)
    out = tmp_path / "o.npy"
    shardwise.stream("nd,nd->n", tmp_path / "a.npy", tmp_path / "b.npy", out=out, chunk="256")
    said = r"input 1 is .*c\.npy, where the run begun read .*b\.npy.* delete o\.npy\.manifest"
    with pytest.raises(ShardwiseError, match=said) as e:
        shardwise.stream("nd,nd->n", tmp_path / "a.npy", tmp_path / "c.npy", out=out)
    for name in ("o.npy.manifest.json", "o.npy.partial", "o.npy"):  # as the error says
        if name in str(e.value):
            (tmp_path / name).unlink(missing_ok=True)
    shardwise.stream("nd,nd->n", tmp_path / "a.npy", tmp_path / "c.npy", out=out)
    np.testing.assert_allclose(np.load(out), np.einsum("nd,nd->n", a, c), rtol=1e-5)

    class Stop(Exception):
        pass

    def stop(done: int, total: int, nbytes: int) -> None:
        raise Stop

    w = rng.random((8, 300)).astype(np.float32)  # read whole, for every chunk
    changed = w.copy()
    changed[3, 90] += 1  # (where the fingerprint's sample of its bytes does not look)
    with pytest.raises(Stop):
        shardwise.stream("nd,dk->nk", a, w, out=tmp_path / "m.npy", chunk=128, on_chunk=stop)
    with pytest.warns(shardwise.ShardwiseWarning, match=r"in chunks of 128, not of 256"):
        shardwise.stream("nd,dk->nk", a, w, out=tmp_path / "m.npy", chunk=256)
    with pytest.raises(Stop):
        shardwise.stream("nd,dk->nk", a, w, out=tmp_path / "n.npy", chunk=128, on_chunk=stop)
    with pytest.raises(ShardwiseError, match=r"input 1 \(.*\) changed since the last run: the "
                       r"whole of it that chunk 0 read"):  # fmt: skip
        shardwise.stream("nd,dk->nk", a, changed, out=tmp_path / "n.npy", chunk=128)
    with pytest.raises(ArgumentError, match=r"chunk -128 must be a positive multiple"):
        shardwise.stream("nd,nd->n", a, b, out=tmp_path / "p.npy", chunk="-128")


def test_review_leftovers_of_streams_checks(tmp_path):
    """An equation with nothing to stream along into a .npy said so (a raw ``max()`` error
    had escaped); a NumPy integer is a chunk size; the same file named another way, whose
    ctime moved, is said to have changed, not to be another file."""
    a = Source("a", (4,), np.dtype("float32"), "numpy")
    b = Source("b", (5,), np.dtype("float32"), "numpy")
    with pytest.raises(ArgumentError, match=r"cannot stream 'i,j->'"):
        plan_stream(Op.parse("i,j->"), [a, b], devices=8, budget=1 << 20, first_axis=True)
    x = Source("x", (1000, 3), np.dtype("float32"), "numpy")
    chunked = plan_stream(Op.parse("nd,nd->n"), [x, x], devices=8, budget=1 << 20,
                          chunk=np.int64(128))  # fmt: skip
    assert chunked.chunk == 128
    rng = np.random.default_rng(0)
    np.save(tmp_path / "a.npy", rng.random((1000, 3)).astype(np.float32))
    np.save(tmp_path / "b.npy", rng.random((1000, 3)).astype(np.float32))

    class Stop(Exception):
        pass

    def stop(done: int, total: int, nbytes: int) -> None:
        raise Stop

    out = tmp_path / "o.npy"
    with pytest.raises(Stop):
        shardwise.stream("nd,nd->n", tmp_path / "a.npy", tmp_path / "b.npy", out=out, chunk=128,
                         on_chunk=stop)  # fmt: skip
    os.chmod(tmp_path / "a.npy", 0o644)  # (its ctime moves; its bytes do not)
    with pytest.raises(ShardwiseError, match=r"input 0 \(.*\) changed since the last run \(ctime"):
        shardwise.stream("nd,nd->n", tmp_path / "." / "a.npy", tmp_path / "b.npy", out=out,
                         chunk=128)  # fmt: skip
