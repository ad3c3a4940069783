"""Streaming that cannot be tricked: work files created exclusively and never followed through
links, manifests checked as input, changed inputs detected, one writer per output, a full
disk and a truncated input are clear errors."""

from __future__ import annotations

import errno
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import shardwise
from shardwise import ArgumentError, ShardwiseError
from shardwise._data.chunks import ChunkWriter
from shardwise._data.sources import BLOCK, SAMPLES, Source
from shardwise._files import exclusive_lock
from shardwise.cli import app

CHILD = Path(__file__).with_name("stream_child.py")
runner = CliRunner()
DAMAGED = "damaged or was edited"


class Stop(Exception):
    """Stops a run after some chunks, as a kill would (its work files stay)."""


def _inputs(tmp_path: Path, n: int = 10_001, seed: int = 0) -> list[Path]:
    rng = np.random.default_rng(seed)
    paths = [tmp_path / "a.npy", tmp_path / "b.npy"]
    for p in paths:
        np.save(p, rng.random((n, 3), dtype=np.float32))
    return paths


def _run(ins, out, equation="nd,nd->n", **kwargs):
    kwargs.setdefault("budget", "64KiB")
    return shardwise.stream(equation, *ins, mesh="devices=8", out=out, **kwargs)


def _expected(ins, equation="nd,nd->n"):
    a, b = (np.load(p).astype(np.float64) for p in ins)
    return np.einsum(equation, a, b)


def _interrupted(ins, out, equation="nd,nd->n", after=2, **kwargs):
    """Leave ``out``'s work files as a run stopped after ``after`` recorded chunks does (small
    chunks, so that many are left to do). Each chunk is recorded as it lands: the run records
    landed chunks from a thread of its own, which a loaded machine can leave waiting until
    every chunk has landed, and then nothing would be left to do."""
    kwargs.setdefault("chunk", 128)

    def stop(done, total, nbytes):
        if done >= after:
            raise Stop

    commit = ChunkWriter.commit

    def commit_and_record(self, *args, **kw):  # type: ignore[no-untyped-def]
        commit(self, *args, **kw)
        self.sync()

    with pytest.MonkeyPatch.context() as m, pytest.raises(Stop):
        m.setattr(ChunkWriter, "commit", commit_and_record)
        _run(ins, out, equation, on_chunk=stop, **kwargs)
    assert not out.exists()
    return _manifest(out)


def _manifest(out: Path) -> dict:
    return json.loads(out.with_name(out.name + ".manifest.json").read_text())


def _edit_manifest(out: Path, **changes) -> None:
    data = _manifest(out)
    data.update(changes)
    out.with_name(out.name + ".manifest.json").write_text(json.dumps(data))


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


# 1. paths and symbolic links


def test_an_existing_partial_file_is_never_overwritten(tmp_path):
    ins = _inputs(tmp_path)
    out = tmp_path / "o.npy"
    (tmp_path / "o.npy.partial").write_bytes(b"someone's work")
    with pytest.raises(ArgumentError, match=r"o\.npy\.partial exists but no run of shardwise"):
        _run(ins, out)
    assert (tmp_path / "o.npy.partial").read_bytes() == b"someone's work"


def test_a_symlinked_partial_is_never_followed(tmp_path):
    ins = _inputs(tmp_path)
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")
    out = tmp_path / "o.npy"
    (tmp_path / "o.npy.partial").symlink_to(victim)
    with pytest.raises(ArgumentError, match="exists but no run"):
        _run(ins, out)
    (tmp_path / "o.npy.partial").unlink()
    # an interrupted run's partial output replaced by a link is refused too
    _interrupted(ins, out)
    partial = tmp_path / "o.npy.partial"
    victim.write_bytes(partial.read_bytes())
    partial.unlink()
    partial.symlink_to(victim)
    before = victim.read_bytes()
    with pytest.raises(ShardwiseError, match="not the file this run created"):  # or a link
        _run(ins, out)
    assert victim.read_bytes() == before


def test_symlinked_manifest_and_temporary_files_are_never_followed(tmp_path):
    ins = _inputs(tmp_path)
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")
    out = tmp_path / "o.npy"
    (tmp_path / "o.npy.manifest.json.tmp").symlink_to(victim)
    _run(ins, out)
    np.testing.assert_allclose(np.load(out), _expected(ins), rtol=1e-5)
    assert victim.read_bytes() == b"keep me"
    assert (tmp_path / "o.npy.manifest.json.tmp").is_symlink()  # not shardwise's: kept
    other = tmp_path / "p.npy"
    (tmp_path / "p.npy.manifest.json").symlink_to(victim)
    with pytest.raises(ShardwiseError, match="symbolic link"):
        _run(ins, other)
    assert victim.read_bytes() == b"keep me"


def test_a_lock_file_that_is_not_shardwise_s_is_kept(tmp_path):
    ins = _inputs(tmp_path)
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")
    (tmp_path / "o.npy.lock").write_bytes(b"my notes")
    with pytest.raises(ShardwiseError, match="is in the way"):
        _run(ins, tmp_path / "o.npy")
    (tmp_path / "p.npy.lock").symlink_to(victim)
    with pytest.raises(ShardwiseError, match="is in the way"):
        _run(ins, tmp_path / "p.npy")
    assert (tmp_path / "o.npy.lock").read_bytes() == b"my notes"
    assert victim.read_bytes() == b"keep me"


def test_a_zarr_partial_folder_of_someone_elses_files_is_kept(tmp_path):
    ins = _inputs(tmp_path)
    folder = tmp_path / "out.zarr.partial"
    folder.mkdir()
    (folder / "thesis.tex").write_text("years of work")
    with pytest.raises(ArgumentError, match="exists but no run"):
        _run(ins, tmp_path / "out.zarr")
    assert (folder / "thesis.tex").read_text() == "years of work"


def test_an_input_named_like_a_running_sum_is_never_touched(tmp_path):
    a, b = _inputs(tmp_path)
    named = tmp_path / "o.npy.acc.1.npy"
    a.rename(named)
    ins = [named, b]
    before = named.read_bytes()
    out = tmp_path / "o.npy"
    _interrupted(ins, out, "nd,nd->", after=3)
    _run(ins, out, "nd,nd->")
    np.testing.assert_allclose(np.load(out), _expected(ins, "nd,nd->"), rtol=1e-5)
    assert named.read_bytes() == before
    assert sorted(_files(tmp_path)) == ["b.npy", "o.npy", "o.npy.acc.1.npy", "o.npy.manifest.json"]


def test_an_input_that_is_the_partial_output_is_refused(tmp_path):
    ins = _inputs(tmp_path)
    out = tmp_path / "o.zarr"
    _interrupted(ins, out, "nd,nd->nd")
    with pytest.raises(ArgumentError, match=r"is the output .* or its partial output"):
        _run([tmp_path / "o.zarr.partial", ins[1]], out, "nd,nd->nd")


# 2. the manifest is input


def test_a_manifest_naming_a_file_outside_is_refused_and_the_file_kept(tmp_path):
    ins = _inputs(tmp_path)
    (tmp_path / "victimdir").mkdir()
    victim = tmp_path / "victimdir" / "victim.npy"
    np.save(victim, np.zeros(3))
    before = victim.read_bytes()
    out = tmp_path / "work" / "o.npy"
    out.parent.mkdir()
    data = _interrupted(ins, out, "nd,nd->", after=2)
    for name in ("../victimdir/victim.npy", str(victim), "o.npy.acc.1.npy"):
        acc = {**data["accumulator"], "name": name}
        _edit_manifest(out, accumulator=acc)
        with pytest.raises(ShardwiseError, match=DAMAGED):
            _run(ins, out, "nd,nd->")
    assert victim.read_bytes() == before


def test_a_done_list_claiming_every_chunk_is_refused(tmp_path):
    ins = _inputs(tmp_path)
    out = tmp_path / "o.npy"
    data = _interrupted(ins, out, after=2)
    chunks = data["plan"]["chunks"]
    assert len(data["done"]) < chunks
    _edit_manifest(out, done=list(range(chunks)))  # without evidence: against the schema
    with pytest.raises(ShardwiseError, match=DAMAGED):
        _run(ins, out)
    first = data["evidence"][str(data["done"][0])]
    evidence = {str(c): data["evidence"].get(str(c), first) for c in range(chunks)}
    _edit_manifest(out, done=list(range(chunks)), evidence=evidence)  # evidence made up
    with pytest.raises(ShardwiseError, match=r"chunk \d+ does not hold the bytes recorded"):
        _run(ins, out)
    assert not out.exists()


def test_a_done_list_claiming_more_summed_chunks_is_refused(tmp_path):
    ins = _inputs(tmp_path)
    out = tmp_path / "o.npy"
    data = _interrupted(ins, out, "nd,nd->", after=2)
    _edit_manifest(out, done=list(range(data["plan"]["chunks"])))
    with pytest.raises(ShardwiseError, match="does not hold the sum of the chunks recorded"):
        _run(ins, out, "nd,nd->")


@pytest.mark.parametrize("how", ["truncated", "zeroed"])
def test_a_damaged_partial_output_is_refused(tmp_path, how):
    ins = _inputs(tmp_path)
    out = tmp_path / "o.npy"
    _interrupted(ins, out, after=3)
    partial = tmp_path / "o.npy.partial"
    size = partial.stat().st_size
    if how == "truncated":
        os.truncate(partial, size // 2)
    else:
        with open(partial, "r+b") as f:
            f.seek(128)
            f.write(bytes(size - 128))
    with pytest.raises(ShardwiseError, match=r"o\.npy\.partial is damaged"):
        _run(ins, out)
    assert not out.exists()


@pytest.mark.parametrize(
    "text",
    [
        "{",
        "[]",
        '{"format": "shardwise-stream/2"}',
        "MISSING:done",
        'SET:done="all"',
        "SET:done=[999]",
        "SET:done=[-1]",
        "SET:done=[1, 1]",
        "SET:done=[true]",
        'SET:partial="x"',
        'SET:format="shardwise-stream/1"',
        'SET:token="../../x"',
        'SET:plan={"index": "n"}',
        'SET:evidence={"0": "x"}',
        'SET:inputs=[{"name": 3}]',
        "SET:complete=true",
    ],
)
def test_garbled_manifests_are_clear_errors(tmp_path, text):
    ins = _inputs(tmp_path)
    out = tmp_path / "o.npy"
    data = _interrupted(ins, out, after=1)
    path = tmp_path / "o.npy.manifest.json"
    if text.startswith("MISSING:"):
        del data[text.removeprefix("MISSING:")]
        text = json.dumps(data)
    elif text.startswith("SET:"):
        key, value = text.removeprefix("SET:").split("=", 1)
        data[key] = json.loads(value)
        text = json.dumps(data)
    path.write_text(text)
    with pytest.raises(ShardwiseError, match=DAMAGED):
        _run(ins, out)
    args = ["run", "nd,nd->n", *map(str, ins), "--out", str(out), "--host-memory", "64KiB"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert DAMAGED in " ".join(result.output.split())


# 3. changed inputs


def _rewrite_keeping_size_and_mtime(path: Path) -> None:
    st = path.stat()
    np.save(path, np.load(path) + 1)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size


@pytest.mark.parametrize(("first", "then"), [(False, False), (False, True), (True, False)])
def test_an_input_changed_with_size_and_mtime_kept_is_refused(tmp_path, first, then):
    ins = _inputs(tmp_path)
    out = tmp_path / "o.npy"
    _interrupted(ins, out, checksum=first)
    assert ("sha256" in _manifest(out)["inputs"][0]) == first
    _rewrite_keeping_size_and_mtime(ins[0])
    with pytest.raises(ShardwiseError, match=r"input 0 .* changed since the last run"):
        _run(ins, out, checksum=then)


def test_an_input_only_touched_resumes_when_checksums_were_recorded(tmp_path):
    ins = _inputs(tmp_path)
    plain, summed = tmp_path / "p.npy", tmp_path / "o.npy"
    _interrupted(ins, plain)
    _interrupted(ins, summed, checksum=True)
    os.utime(ins[0], ns=(10**9, 10**9))
    with pytest.raises(
        ShardwiseError, match=r"changed since the last run \(mtime_ns, ctime_ns differ"
    ):
        _run(ins, plain)  # nothing recorded tells the bytes are the same
    result = _run(ins, summed)  # the manifest holds SHA-256: the resume compares that
    assert result.skipped > 0
    np.testing.assert_allclose(np.load(summed), _expected(ins), rtol=1e-5)


def test_swapped_inputs_are_refused(tmp_path):
    ins = _inputs(tmp_path)
    out = tmp_path / "o.npy"
    _interrupted(ins, out)
    # given in another order: said by name (it had said "restore it", as if a file changed)
    with pytest.raises(
        ShardwiseError,
        match=r"input 0 is .*b\.npy \(it was input 1\), where "
        r"the run begun read .*a\.npy: give the same inputs, in the same order",
    ):
        _run(ins[::-1], out)
    swap = tmp_path / "swap.npy"
    ins[0].rename(swap)
    ins[1].rename(ins[0])
    swap.rename(ins[1])
    with pytest.raises(ShardwiseError, match=r"input 0 .* now holds what input 1 held"):
        _run(ins, out)


def test_an_input_changed_mid_run_stops_it_and_the_resume_refuses_it(tmp_path, monkeypatch):
    ins = _inputs(tmp_path)
    out = tmp_path / "o.npy"
    read = Source.read
    reads = []

    def read_then_rewrite(self, *args, **kwargs):
        # the input is rewritten once the first chunk's blocks are read: an event, so
        # that the run has chunks left to read whatever the machine's speed
        block = read(self, *args, **kwargs)
        reads.append(self.name)
        if len(reads) == len(ins):
            _rewrite_in_place(ins[0], ins[0].stat().st_size - 1)
        return block

    monkeypatch.setattr(Source, "read", read_then_rewrite)
    with pytest.raises(ShardwiseError, match=r"changed or was truncated|ended early"):
        _run(ins, out, chunk=128)
    monkeypatch.setattr(Source, "read", read)
    with pytest.raises(ShardwiseError, match="changed since the last run"):
        _run(ins, out)


# 3b. a resumed result is a fresh run's on the inputs as they are now, or the resume is refused


def _rewrite_in_place(path: Path, position: int, keep_times: bool = True) -> None:
    """Change one byte of ``path`` in place, then put its atime and mtime back."""
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)
        f.seek(position)
        f.write(b"\t" if byte == b" " else bytes([byte[0] ^ 0x40]))  # (a header stays valid)
    if keep_times:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (
        st.st_size,
        st.st_mtime_ns,
        st.st_ino,
    )


ROWS = 100_001
"""Rows of the inputs whose in-place edits are tested: 1.2 MB, so that most bytes lie outside
the blocks a file's quick fingerprint samples (64 of 4 KiB)."""


def _unsampled(position: int, size: int) -> int:
    """The first byte at or after ``position`` outside the blocks the quick fingerprint hashes:
    an edit there is one that fingerprint cannot see."""
    step = max(0, size - BLOCK) / (SAMPLES - 1)
    blocks = sorted({round(k * step) for k in range(SAMPLES)})
    for start in blocks:
        if start <= position < start + BLOCK:
            position = start + BLOCK
    assert position < size
    return position


def _regions(path: Path, chunk_bytes: int, done: int) -> dict[str, int]:
    """A byte in every region of a .npy file a resume must notice a change in (outside the
    sampled blocks where the region has such bytes; the header is always sampled)."""
    size = path.stat().st_size
    header = size - ROWS * 3 * 4
    return {
        "header's padding": header - 2,
        "first data byte": header,
        "inside a done chunk": _unsampled(header + chunk_bytes // 2, size),
        "last byte of the done chunks": header + done * chunk_bytes - 1,
        "first byte not done": header + done * chunk_bytes,
        "middle": _unsampled(header + (size - header) // 2, size),
        "last byte": size - 1,
    }


REGIONS = [
    "header's padding",
    "first data byte",
    "inside a done chunk",
    "last byte of the done chunks",
    "first byte not done",
    "middle",
    "last byte",
]


@pytest.mark.parametrize("equation", ["nd,nd->n", "nd,nd->d"])
@pytest.mark.parametrize("region", REGIONS)
def test_a_resume_after_an_in_place_edit_with_mtime_put_back_is_refused(tmp_path, region, equation):
    ins = _inputs(tmp_path, n=ROWS)
    out = tmp_path / "o.npy"
    chunk = 2048  # 24 KiB of each input a chunk: the edits below land in the chunks named
    data = _interrupted(ins, out, equation, chunk=chunk, budget="1MiB")
    position = _regions(ins[1], chunk * 3 * 4, len(data["done"]))[region]
    _rewrite_in_place(ins[1], position)
    with pytest.raises(ShardwiseError, match=r"input 1 .* changed since the last run .*ctime"):
        _run(ins, out, equation, chunk=chunk, budget="1MiB")


def test_the_command_line_refuses_a_resume_after_an_in_place_edit(tmp_path):
    ins = _inputs(tmp_path)
    out = tmp_path / "o.npy"
    _interrupted(ins, out)
    _rewrite_in_place(ins[0], ins[0].stat().st_size - 1)
    result = runner.invoke(
        app, ["run", "nd,nd->n", *map(str, ins), "--out", str(out), "--budget", "64KiB"]
    )
    assert result.exit_code == 2, result.output
    assert "changed since the last run" in " ".join(result.output.split())
    assert not out.exists()


def test_a_zarr_folder_edited_in_place_with_mtime_put_back_is_refused(tmp_path):
    zarr = pytest.importorskip("zarr")
    rng = np.random.default_rng(3)
    a = rng.random((4096, 3), dtype=np.float32)
    z = zarr.open_array(
        str(tmp_path / "a.zarr"), mode="w", shape=a.shape, chunks=(512, 3), dtype="f4"
    )
    z[:] = a
    out = tmp_path / "o.npy"
    ins = [tmp_path / "a.zarr", tmp_path / "a.zarr"]
    _interrupted(ins, out)
    files = sorted(
        p for p in (tmp_path / "a.zarr").rglob("*") if p.is_file() and p.stat().st_size > 64
    )
    _rewrite_in_place(files[len(files) // 2], 40)
    with pytest.raises(ShardwiseError, match=r"changed since the last run"):
        _run(ins, out)


def _changed_rows(a: np.ndarray, rows: list[int]) -> np.ndarray:
    b = a.copy()
    b[rows] += 7.0
    return b


@pytest.mark.parametrize("equation", ["nd,nd->n", "nd,nd->d"])
def test_arrays_in_memory_changed_in_a_done_chunk_refuse_the_resume(tmp_path, equation):
    rng = np.random.default_rng(5)
    a, b = rng.random((10_001, 3), dtype=np.float32), rng.random((10_001, 3), dtype=np.float32)
    out = tmp_path / "o.npy"
    _interrupted([a, b], out, equation)
    # row 5: in the first chunk, done, and not one of the rows the quick fingerprint samples
    assert 5 not in np.linspace(0, 10_000, 64).astype(np.int64)
    with pytest.raises(
        ShardwiseError, match=r"input 1 \(array 1\) changed .* rows 0:128 that chunk 0 read"
    ):
        _run([a, _changed_rows(b, [5])], out, equation)
    assert not out.exists()
    _run([a, b], out, equation)  # the same inputs: it resumes
    np.testing.assert_allclose(np.load(out), np.einsum(equation, a, b), rtol=1e-5)


@pytest.mark.parametrize("equation", ["nd,nd->n", "nd,nd->d"])
def test_arrays_in_memory_changed_where_no_chunk_is_done_resume_to_a_fresh_result(
    tmp_path, equation
):
    rng = np.random.default_rng(6)
    a, b = rng.random((10_001, 3), dtype=np.float32), rng.random((10_001, 3), dtype=np.float32)
    out = tmp_path / "o.npy"
    data = _interrupted([a, b], out, equation)
    row = 128 * len(data["done"]) + 1  # not done, not sampled
    assert row not in np.linspace(0, 10_000, 64).astype(np.int64)
    changed = _changed_rows(b, [row])
    result = _run([a, changed], out, equation)
    assert result.skipped == len(data["done"])
    np.testing.assert_allclose(np.load(out), np.einsum(equation, a, changed), rtol=1e-5)


@pytest.mark.parametrize("how", ["npy", "numpy"])
def test_an_input_read_whole_for_every_chunk_is_checked_on_resume(tmp_path, how):
    """'nd,d->n' streams along 'n', reading the vector whole for every chunk: a resume with
    another vector is refused, one with the same vector gives NumPy's result."""
    rng = np.random.default_rng(8)
    a, w = rng.random((10_001, 3), dtype=np.float32), rng.random(3, dtype=np.float32)
    ins = [a, w]
    if how == "npy":
        ins = [tmp_path / "a.npy", tmp_path / "w.npy"]
        np.save(ins[0], a)
        np.save(ins[1], w)
    out = tmp_path / "o.npy"
    data = _interrupted(ins, out, "nd,d->n")
    assert data["plan"]["index"] == "n" and data["done"]
    if how == "npy":
        np.save(ins[1], w + 1)
    with pytest.raises(ShardwiseError, match=r"input 1 .*changed"):
        _run([a, w + 1] if how == "numpy" else ins, out, "nd,d->n")
    if how == "npy":
        np.save(ins[1], w)
        out.with_name("o.npy.manifest.json").unlink()
        out.with_name("o.npy.partial").unlink()
    result = _run(ins, out, "nd,d->n")
    assert result.skipped == (0 if how == "npy" else len(data["done"]))
    np.testing.assert_allclose(np.load(out), a @ w, rtol=1e-5)


def test_dask_arrays_changed_between_runs_refuse_the_resume(tmp_path):
    da = pytest.importorskip("dask.array")
    rng = np.random.default_rng(7)
    a = rng.random((10_001, 3), dtype=np.float32)
    out = tmp_path / "o.npy"
    _interrupted([da.from_array(a, chunks=1000), da.from_array(a, chunks=1000)], out)
    changed = da.from_array(_changed_rows(a, [3]), chunks=1000)
    with pytest.raises(ShardwiseError, match=r"input 1 \(dask array 1\) changed .* chunk 0 read"):
        _run([da.from_array(a, chunks=1000), changed], out)


# 4. one writer per output


def test_a_second_writer_fails_at_once_naming_the_first(tmp_path):
    ins = _inputs(tmp_path, n=40_000)
    out = tmp_path / "o.npy"
    busy = f"being written by process {os.getpid()}"
    with exclusive_lock(tmp_path / "o.npy.lock"), pytest.raises(ShardwiseError, match=busy):
        _run(ins, out)
    assert not (tmp_path / "o.npy.lock").exists()
    cmd = [sys.executable, str(CHILD), "nd,nd->n", str(out), "64KiB", "--slow", *map(str, ins)]
    child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        manifest = tmp_path / "o.npy.manifest.json"
        deadline = time.time() + 120
        while not manifest.exists() and child.poll() is None and time.time() < deadline:
            time.sleep(0.01)
        if child.poll() is not None:
            pytest.skip("the child finished before a second writer could start")
        start = time.perf_counter()
        with pytest.raises(ShardwiseError, match=f"being written by process {child.pid}"):
            _run(ins, out)
        assert time.perf_counter() - start < 10
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    _run(ins, out)  # the lock died with its holder
    np.testing.assert_allclose(np.load(out), _expected(ins), rtol=1e-5)


# 5. a full disk


@pytest.mark.parametrize("equation", ["nd,nd->n", "nd,nd->"])
def test_a_full_disk_mid_run_is_a_clear_error_and_the_run_resumes(tmp_path, monkeypatch, equation):
    ins = _inputs(tmp_path)
    out = tmp_path / "o.npy"
    calls = []
    write, save = os.write, np.save
    # writes that succeed: the first manifest and one record (and one running sum before it)
    allowed = {"nd,nd->n": 2, "nd,nd->": 4}[equation]

    def full(fd, data):
        calls.append(fd)
        if len(calls) > allowed:
            raise OSError(errno.ENOSPC, "No space left on device")
        return write(fd, data)

    def full_save(*args, **kwargs):
        calls.append(0)
        if len(calls) > allowed:
            raise OSError(errno.ENOSPC, "No space left on device")
        return save(*args, **kwargs)

    monkeypatch.setattr(os, "write", full)
    monkeypatch.setattr(np, "save", full_save)
    with pytest.raises(ShardwiseError, match=r"No space left on device; the run needs about"):
        _run(ins, out, equation)
    monkeypatch.undo()
    assert not out.exists()
    names = sorted(_files(tmp_path))
    assert not [n for n in names if n.endswith(".tmp")], names
    assert "o.npy.lock" not in names
    assert _manifest(out)["done"]
    _run(ins, out, equation)
    np.testing.assert_allclose(np.load(out), _expected(ins, equation), rtol=1e-5)


def test_the_command_line_reports_a_full_disk_with_exit_2(tmp_path, monkeypatch):
    ins = _inputs(tmp_path)
    write = os.write
    calls = []

    def full(fd, data):
        calls.append(fd)
        if len(calls) > 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return write(fd, data)

    monkeypatch.setattr(os, "write", full)
    args = ["run", "nd,nd->n", *map(str, ins), "--out", str(tmp_path / "o.npy")]
    result = runner.invoke(app, [*args, "--host-memory", "64KiB"])
    text = " ".join(result.output.split())
    assert result.exit_code == 2, text
    assert "No space left on device" in text and "This is a bug" not in text


# 6. an input truncated under a running stream


def test_an_input_truncated_mid_run_is_a_clear_error_not_a_crash(tmp_path):
    ins = _inputs(tmp_path, n=40_000)
    out = tmp_path / "o.npy"
    cmd = [sys.executable, str(CHILD), "nd,nd->n", str(out), "64KiB", "--truncate", str(ins[0])]
    done = subprocess.run([*cmd, *map(str, ins)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, (done.returncode, done.stderr[-2000:])  # not -SIGBUS
    assert "changed or was truncated while this run read it" in done.stderr or (
        "ended early" in done.stderr
    )
    assert not out.exists() and (tmp_path / "o.npy.manifest.json").exists()


def test_inputs_are_read_not_mapped_where_they_can_change(tmp_path, monkeypatch):
    import mmap

    ins = _inputs(tmp_path)

    real = mmap.mmap

    def no_file_maps(fileno, *args, **kwargs):
        if fileno != -1:
            raise AssertionError("a file others can truncate must not be memory-mapped")
        return real(fileno, *args, **kwargs)

    monkeypatch.setattr(mmap, "mmap", no_file_maps)
    _run(ins, tmp_path / "o.npy")
    np.testing.assert_allclose(np.load(tmp_path / "o.npy"), _expected(ins), rtol=1e-5)


# 11. damaged headers and impossible arguments


@pytest.mark.parametrize("shape", [(-5, 3), (10**12, 3), (2**40, 2**40)])
def test_npy_headers_with_impossible_sizes_are_refused(tmp_path, shape):
    ins = _inputs(tmp_path)
    bad = tmp_path / "bad.npy"
    data = ins[0].read_bytes()
    header = {"descr": "<f4", "fortran_order": False, "shape": shape}
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, header)
    bad.write_bytes(buffer.getvalue() + data[128:])
    with pytest.raises(ArgumentError, match=r"input 0 '.*bad\.npy' (has a damaged|claims)"):
        _run([bad, ins[1]], tmp_path / "o.npy")


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [("--host-memory", "0", "positive size"), ("--out", "", "names no file")],
)
def test_the_command_line_refuses_a_zero_budget_and_an_empty_output(
    tmp_path, option, value, message
):
    ins = _inputs(tmp_path)
    args = {"--host-memory": "64KiB", "--out": str(tmp_path / "o.npy"), option: value}
    argv = ["run", "nd,nd->n", *map(str, ins)] + [x for kv in args.items() for x in kv]
    result = runner.invoke(app, argv)
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())


# the finish: nothing lost between the manifest and the rename


def test_a_run_stopped_between_finishing_and_renaming_completes_on_rerun(tmp_path, monkeypatch):
    from shardwise._data import sink

    ins = _inputs(tmp_path)
    out = tmp_path / "o.npy"
    real = sink.place

    def stop_at_the_end(src, dst):
        if dst == out:
            raise Stop
        real(src, dst)

    monkeypatch.setattr(sink, "place", stop_at_the_end)
    with pytest.raises(Stop):
        _run(ins, out)
    monkeypatch.undo()
    assert _manifest(out)["complete"] and not out.exists()
    result = _run(ins, out)
    assert result.computed == 0
    np.testing.assert_allclose(np.load(out), _expected(ins), rtol=1e-5)
    assert sorted(_files(tmp_path)) == ["a.npy", "b.npy", "o.npy", "o.npy.manifest.json"]


def _read_only(folder: Path, monkeypatch, code: int) -> None:
    """Make ``folder`` read-only: by its mode, and (for root, whom modes do not stop) by
    failing every write, creation or removal in it with ``code`` (EROFS, EACCES)."""
    folder.chmod(0o555)

    def inside(path) -> bool:
        return isinstance(path, str | os.PathLike) and Path(path).parent == folder

    def refuse(path):
        raise OSError(code, os.strerror(code), str(path))

    writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    real_open = os.open

    def open_(path, flags, *args, **kwargs):
        if flags & writes and inside(path):
            refuse(path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_)
    for name in ("unlink", "remove", "link", "rename", "replace", "mkdir", "rmdir"):
        real = getattr(os, name)

        def guarded(*args, _real=real, **kwargs):
            if any(inside(a) for a in args):
                refuse(next(a for a in args if inside(a)))
            return _real(*args, **kwargs)

        monkeypatch.setattr(os, name, guarded)


def _stamps(folder: Path) -> dict[str, tuple[int, int, int, int]]:
    return {
        p.name: (s.st_ino, s.st_size, s.st_mtime_ns, s.st_ctime_ns)
        for p in folder.iterdir()
        if (s := p.stat())
    }


@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES], ids=["read-only disk", "no write"])
def test_a_finished_run_on_a_read_only_folder_is_read_back_not_written(tmp_path, monkeypatch, code):
    """Rerunning a finished run whose output lies on a read-only disk had failed taking its
    lock ("cannot write 'o.npy': Read-only file system"), where a writable folder says the
    run is done: the manifest and the output are read, nothing is written."""
    ins = _inputs(tmp_path, n=1000)
    folder = tmp_path / "out"
    folder.mkdir()
    out = folder / "o.npy"
    first = _run(ins, out, chunk=128)
    unfinished = folder / "p.npy"
    _interrupted(ins, unfinished)
    before = _stamps(folder)
    try:
        _read_only(folder, monkeypatch, code)
        again = _run(ins, out, chunk=128)
        argv = ["run", "nd,nd->n", *map(str, ins), "--out", str(out), "--host-memory", "64KiB"]
        said = runner.invoke(app, argv)
        with pytest.raises(ShardwiseError, match=r"cannot write .*p\.npy'.*Choose an output in "
                           r"a folder you can write to"):  # fmt: skip
            _run(ins, unfinished, chunk=128)  # (not finished: it must write, and cannot)
    finally:
        monkeypatch.undo()
        folder.chmod(0o755)
    assert (again.computed, again.skipped, again.chunks) == (0, first.chunks, first.chunks)
    assert said.exit_code == 0 and "is already complete" in said.output, said.output
    assert _stamps(folder) == before  # nothing written, created or removed
    np.testing.assert_allclose(np.load(out), _expected(ins), rtol=1e-6)


@pytest.mark.parametrize("suffix", [".npy", ".txt"])
def test_an_output_name_too_long_for_its_work_files_is_refused_up_front(tmp_path, suffix):
    # the name, or its work files' (.manifest.json), over the 255 bytes of a name: it had
    # escaped as 'unexpected OSError … a bug in shardwise', or been told to free space
    x = np.ones((16, 4), np.float32)
    out = tmp_path / ("z" * (221 - len(suffix)) + suffix)  # (the first length refused)
    with pytest.raises(shardwise.ArgumentError, match="over the 220 an output's may have"):
        shardwise.stream("nd,nd->n", x, x, out=out)
    assert list(tmp_path.iterdir()) == []


def test_the_longest_output_name_allowed_streams(tmp_path):
    x = np.ones((16, 4), np.float32)
    out = tmp_path / ("z" * 216 + ".npy")  # (220 bytes: its work files' names are 255)
    shardwise.stream("nd,nd->n", x, x, out=out)
    np.testing.assert_array_equal(np.load(out), np.einsum("nd,nd->n", x, x))
