"""A device profile is input: every path by which one enters (a file given by name or path,
the calibrated profile in the cache, a ``Profile`` built in Python, a calibration) checks it,
and refuses it (or, for the cache, sets it aside with a warning) in one line naming the file."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import jax
import pytest
from typer.testing import CliRunner

import shardwise
from shardwise import ShardwiseError, ShardwiseWarning
from shardwise._model.mesh import MeshSpec, build_mesh
from shardwise._model.profile import BUILTIN, Profile
from shardwise._model.profile_files import (
    MAX_PROFILE_BYTES,
    cache_dir,
    default_profile,
    load_profile,
    local_name,
    read_profile,
    save_profile,
)
from shardwise.cli import app

runner = CliRunner()
CPU = BUILTIN["cpu-2core"]
PLAN = ["plan", "nd,nd->n", "--shapes", "8x4,8x4", "--mesh", "x=2,y=4"]
SAFETY_S = 60
"""How long a test waits for a call that must return at once before calling it hung."""


def flat(text: str) -> str:
    return " ".join(text.split())


def cpu_json(**changes: object) -> dict[str, object]:
    data = CPU.to_json()
    data.update(changes)
    return data


def with_figure(path: tuple[str, ...], value: object) -> dict[str, object]:
    data = CPU.to_json()
    inner = data
    for key in path[:-1]:
        inner = inner[key]
    inner[path[-1]] = value
    return data


BAD_FIGURES = [
    (("memory_Bps",), math.nan, "memory_Bps is nan"),
    (("memory_Bps",), 0, "memory_Bps is 0"),
    (("memory_Bps",), -2e9, "memory_Bps is -2000000000.0"),
    (("memory_Bps",), math.inf, "memory_Bps is inf"),
    (("memory_Bps",), "2e9", 'memory_Bps is "2e9", not a number'),
    (("memory_Bps",), True, "memory_Bps is true, not a number"),
    (("flops_per_s", "float32"), math.nan, "flops_per_s['float32'] is nan"),
    (("link", "bandwidth_Bps"), 0.0, "link.bandwidth_Bps is 0.0"),
    (("link", "latency_s"), -1e-6, "link.latency_s is -1e-06"),
    (("gather", "latency_s"), "fast", 'gather.latency_s is "fast", not a number'),
    (("matmul_Bps",), math.inf, "matmul_Bps is inf"),
    (("memory_bytes",), -1, "memory_bytes is -1"),
    (("conv_tap_s",), -5e-8, "conv_tap_s is -5e-08"),
    (("conv_tap_s",), "55ns", 'conv_tap_s is "55ns", not a number'),
    (("platform",), "quantum", "platform is 'quantum'; it must be one of cpu, gpu, tpu"),
    (("speed",), 1.0, "it has the unknown key 'speed'"),
    # a dtype named by its short form had been no rate at all: 1 GFLOP/s, 45 times too slow
    (("flops_per_s",), {"f32": 5.2e10}, "flops_per_s names 'f32', which is not a dtype's"),
    (("flops_per_s",), {"bfloat16": 9.1e10}, "flops_per_s has no float32"),
]


@pytest.mark.parametrize(("path", "value", "said"), BAD_FIGURES, ids=lambda x: str(x)[:20])
def test_a_profile_file_with_a_bad_figure_is_refused(tmp_path, path, value, said):
    file = tmp_path / "bad.json"
    file.write_text(json.dumps(with_figure(path, value)))  # NaN and Infinity as JSON allows
    result = runner.invoke(app, [*PLAN, "--profile", str(file)])
    assert result.exit_code == 2, result.output
    text = flat(result.output)
    assert f"profile file '{file}' is not a usable profile: {said}" in text, text


def test_a_profile_built_in_python_with_a_bad_figure_is_refused():
    with pytest.raises(shardwise.ArgumentError, match="memory_Bps is nan; it must be a finite"):
        dataclasses.replace(CPU, memory_Bps=math.nan)
    with pytest.raises(
        shardwise.ArgumentError, match=r'flops_per_s\[.float32.\] is "1e12", not a number'
    ):
        dataclasses.replace(CPU, flops_per_s={"float32": "1e12"})
    with pytest.raises(shardwise.ArgumentError, match="bandwidth_Bps is 0"):
        dataclasses.replace(CPU, gather_links={"x": dataclasses.replace(CPU.link, bandwidth_Bps=0)})
    # a free link (no latency) is a figure some what-if studies use
    assert dataclasses.replace(CPU, link=dataclasses.replace(CPU.link, latency_s=0.0))
    # and a convolution that takes no time per tap (a GPU's, a TPU's: none is given)
    assert dataclasses.replace(CPU, conv_tap_s=0.0).conv_tap_s == 0.0


def test_a_profiles_time_per_convolution_tap_is_written_and_read_back():
    data = CPU.to_json()
    assert data["conv_tap_s"] == CPU.conv_tap_s > 0
    assert Profile.from_json(data).conv_tap_s == CPU.conv_tap_s
    del data["conv_tap_s"]  # a profile written before it existed: no time per tap
    assert Profile.from_json(data).conv_tap_s is None


def test_a_profile_nested_100000_deep_is_refused(tmp_path):
    file = tmp_path / "deep.json"
    file.write_text("[" * 100_000 + "]" * 100_000)
    result = runner.invoke(app, [*PLAN, "--profile", str(file)])
    assert result.exit_code == 2, result.output
    assert f"profile file '{file}' is not a profile: its JSON is nested too deeply" in flat(
        result.output
    )


def test_a_profile_over_the_size_cap_is_refused(tmp_path):
    file = tmp_path / "big.json"
    file.write_text(json.dumps(cpu_json(sources={"all": "x" * MAX_PROFILE_BYTES})))
    with pytest.raises(shardwise.ArgumentError, match="is over 1 MiB, which no profile is"):
        load_profile(str(file))


def test_a_profile_may_give_rates_of_any_dtype_numpy_names():
    """Rates of float8 types, which the planner looks up by their names, are kept (the check
    for short forms had refused every name but 15)."""
    import dataclasses

    from shardwise._model.profile import BUILTIN

    h100 = BUILTIN["h100"]
    fp8 = dataclasses.replace(h100, flops_per_s={**h100.flops_per_s, "float8_e4m3fn": 1.9e15})
    assert fp8.flops("float8_e4m3fn") == 1.9e15


def test_a_folder_given_as_a_profile_is_said_to_be_a_folder(tmp_path):
    """A path to a folder had been answered "no profile named '/tmp/…'", listing names."""
    result = runner.invoke(app, [*PLAN, "--profile", str(tmp_path)])
    assert result.exit_code == 2
    assert "is a folder, not a regular file" in flat(result.output)


def test_dev_zero_given_as_a_profile_is_refused():
    result = runner.invoke(app, [*PLAN, "--profile", "/dev/zero"])
    assert result.exit_code == 2, result.output
    assert "profile file '/dev/zero' is a device, not a regular file" in flat(result.output)


def test_a_symbolic_link_to_a_valid_profile_is_not_followed(tmp_path):
    real = tmp_path / "real.json"
    real.write_text(json.dumps(cpu_json(name="mine")))
    link = tmp_path / "link.json"
    link.symlink_to(real)
    assert load_profile(str(real)).name == "mine"
    result = runner.invoke(app, [*PLAN, "--profile", str(link)])
    assert result.exit_code == 2, result.output
    text = flat(result.output)
    assert f"profile file '{link}' is a symbolic link (to {real})" in text, text
    assert "give the path of the file itself" in text


@pytest.fixture
def cache_slot(tmp_path, monkeypatch):
    """Where the calibrated profile of 8 CPU devices lives, in an empty cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    slot = cache_dir() / f"{local_name('cpu', 8)}.json"
    slot.parent.mkdir(parents=True)
    return slot


def _write(slot: Path, how: str) -> str:
    """Put an unusable calibrated profile in ``slot``; what the warning says of it."""
    if how == "nan":
        slot.write_text(json.dumps(cpu_json(name="local-cpu-8", memory_Bps=math.nan)))
        return "is not a usable profile: memory_Bps is nan"
    if how == "deep":
        slot.write_text("[" * 100_000)
        return "its JSON is nested too deeply"
    if how == "not json":
        slot.write_text("memory_Bps = 2e9\n")
        return "is not valid JSON"
    if how == "tpu":
        data = BUILTIN["tpu-v5e"].to_json() | {"name": "local-cpu-8"}
        slot.write_text(json.dumps(data))
        return "is for tpu devices, not the cpu devices here"
    if how == "link":
        real = slot.parent.parent / "elsewhere.json"
        real.write_text(json.dumps(cpu_json(name="local-cpu-8")))
        slot.symlink_to(real)
        return f"is a symbolic link (to {real})"
    if how == "stale":  # a CPU profile from before the one-step collective model
        data = {k: v for k, v in cpu_json(name="local-cpu-8").items() if k != "gather"}
        slot.write_text(json.dumps(data))
        return "was measured for an older CPU cost model"
    raise AssertionError(how)


@pytest.mark.parametrize("how", ["nan", "deep", "not json", "tpu", "link", "stale"])
def test_an_unusable_calibrated_profile_falls_back_to_the_built_in_one_with_a_warning(
    cache_slot, how
):
    said = _write(cache_slot, how)
    with pytest.warns(ShardwiseWarning) as caught:
        assert default_profile("cpu", 8) == CPU
    [message] = [flat(str(w.message)) for w in caught]
    assert message.startswith(f"calibrated profile '{cache_slot}' "), message
    assert said in message and "planning with the built-in profile cpu-2core" in message
    # the same file is not read (nor warned about) again until it changes
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert default_profile("cpu", 8) == CPU


def _in_thread(call):
    """``call()``'s result, its error and the warnings it gave, from a thread given
    :data:`SAFETY_S` (only a safety net: a call that hangs is the failure asserted)."""
    out: dict[str, object] = {}

    def run() -> None:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                out["result"] = call()
            except Exception as e:
                out["error"] = e
            out["warnings"] = [str(w.message) for w in caught]

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(SAFETY_S)
    return thread, out


def test_a_fifo_in_the_cache_is_set_aside_without_waiting_on_it(cache_slot):
    os.mkfifo(cache_slot)
    thread, out = _in_thread(
        lambda: shardwise.plan_einsum("nd,nd->n", [(64, 64)] * 2, mesh="x=2,y=4").profile
    )
    if thread.is_alive():  # hung on the FIFO: let it go (a writer that closes gives EOF)
        os.close(os.open(cache_slot, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(SAFETY_S)
        pytest.fail("reading the profile waited on the FIFO")
    assert out.get("result") == CPU, out
    [message] = out["warnings"]
    assert f"calibrated profile '{cache_slot}' is a FIFO, not a regular file" in message


_CHILD = """
import resource, sys, warnings
cap = 512 * 2**20  # /dev/zero read to its end would take all the memory there is
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
from shardwise._model.profile_files import default_profile
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    print(default_profile("cpu", 8).name)
print(*(str(w.message) for w in caught))
"""


def test_a_link_to_dev_zero_in_the_cache_is_set_aside(cache_slot):
    cache_slot.symlink_to("/dev/zero")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=SAFETY_S
    )
    assert done.returncode == 0, done.stderr
    name, message = done.stdout.splitlines()
    assert name == "cpu-2core"
    assert f"'{cache_slot}' is a symbolic link (to /dev/zero)" in message


def test_a_foreign_profile_plans_for_its_platform_but_is_not_verified_here():
    # what-if planning for devices one does not have is what a foreign profile is for
    report = shardwise.plan_einsum("bmk,bkn->bmn", [(8, 64, 64)] * 2, mesh="x=2,y=4",
                                   profile="tpu-v5p")  # fmt: skip
    assert report.profile.platform == "tpu" and report.strategies
    # checking its predictions against the HLO compiled for the CPUs here is not
    with pytest.raises(shardwise.ArgumentError, match="profile 'tpu-v5p' is for tpu devices"):
        shardwise.plan_einsum("bmk,bkn->bmn", [(8, 64, 64)] * 2, mesh="x=2,y=4",
                              profile="tpu-v5p", verify=True)  # fmt: skip
    S = jax.ShapeDtypeStruct
    args = S((64, 32), "float32"), S((32, 64), "float32")
    program = shardwise.plan(lambda x, w: x @ w, *args, mesh="x=4", profile="h100", top=1)
    for check in (program.verify, program.tune):
        with pytest.raises(shardwise.ArgumentError, match="'h100' is for gpu devices"):
            check(repeat=1)


def test_a_calibration_that_times_nothing_writes_no_profile(monkeypatch, cache_slot):
    from shardwise._planner import calibrate as cal

    def no_time(runners, repeat, at_least=0.0):
        return {name: (math.nan if name == "memory read" else 1e-3) for name in runners}

    monkeypatch.setattr(cal, "alternate", no_time)
    mesh = build_mesh(MeshSpec.parse("x=2,y=4"))
    with pytest.raises(ShardwiseError, match="calibration timed memory read at nan s"):
        cal.calibrate(mesh, per_device_bytes=2**20, repeat=1)
    assert not cache_slot.exists()


def test_a_profile_round_trips_through_its_file(tmp_path):
    for profile in BUILTIN.values():
        assert read_profile(save_profile(profile, tmp_path / f"{profile.name}.json")) == profile
    assert isinstance(load_profile(str(tmp_path / "h100.json")), Profile)


def _measured_on(mesh: str | None, sources: str = "") -> Profile:
    """A calibrated CPU profile whose links along ``model`` were measured on ``mesh``."""
    link = BUILTIN["cpu-2core"].link
    return dataclasses.replace(
        BUILTIN["cpu-2core"], name="local-cpu-8", mesh=mesh, axis_links={"model": link},
        gather_links={"model": link}, sources={"all": sources},
    )  # fmt: skip


@pytest.mark.parametrize(
    "profile",
    [
        _measured_on("data=2,model=4"),
        # a profile calibrated before the mesh had a field of its own names it in its sources
        _measured_on(
            None,
            "shardwise calibrate on 8 cpu devices (cpu), mesh data=2,model=4, "
            "2026-11-30; per-device figures while every device works at once",
        ),
    ],
    ids=["field", "sources"],
)
def test_a_profile_measured_on_another_mesh_is_warned_about(profile):
    # its links along 'model' were measured on a ring of 4; here 'model' has 2 devices
    S = jax.ShapeDtypeStruct
    args = S((64, 32), "float32"), S((32, 64), "float32")
    with pytest.warns(ShardwiseWarning, match="axis 'model' has 4 devices; on mesh data=4,"):
        shardwise.plan(lambda x, w: x @ w, *args, mesh="data=4,model=2", profile=profile, top=1)
    with pytest.warns(ShardwiseWarning, match="calibrate --mesh data=4,model=2"):
        shardwise.plan_einsum("mk,kn->mn", [(64, 32), (32, 64)], mesh="data=4,model=2",
                              profile=profile)  # fmt: skip
    with warnings.catch_warnings():  # its own mesh, and a mesh whose axes it did not measure
        warnings.simplefilter("error")
        for mesh in ("data=2,model=4", "x=8"):
            shardwise.plan(lambda x, w: x @ w, *args, mesh=mesh, profile=profile, top=1)
            shardwise.plan_einsum("mk,kn->mn", [(64, 32), (32, 64)], mesh=mesh, profile=profile)


def test_a_calibrated_profile_records_its_mesh_and_reads_it_back(monkeypatch, tmp_path):
    from shardwise._planner import calibrate as cal

    monkeypatch.setattr(cal, "alternate", lambda runners, repeat, at_least=0.0: {
        name: 2e-3 if name.startswith("all-") else 1e-3 for name in runners})  # fmt: skip
    profile = cal.calibrate(build_mesh(MeshSpec.parse("x=2,y=4")), per_device_bytes=2**20,
                            repeat=1)  # fmt: skip
    assert profile.mesh == "x=2,y=4"
    assert read_profile(save_profile(profile, tmp_path / "p.json")).mesh == "x=2,y=4"
    with pytest.raises(shardwise.ArgumentError, match="the mesh is named by something other"):
        dataclasses.replace(profile, mesh=8)


def test_the_command_prints_the_warning_as_a_line_of_its_own(tmp_path):
    file = save_profile(_measured_on("data=2,model=4"), tmp_path / "measured.json")
    argv = ["plan", "ij,jk->ik", "--shapes", "64x32,32x64", "--mesh", "data=4,model=2"]
    result = subprocess.run(
        [sys.executable, "-m", "shardwise", *argv, "--profile", str(file)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    # (Python's own form names the line of shardwise that warned: "…/plan.py:317: …")
    assert "warning: profile 'local-cpu-8' measured its links on mesh" in result.stderr
    assert "ShardwiseWarning" not in result.stderr and ".py:" not in result.stderr


def test_a_calibration_too_large_for_the_machine_is_refused_before_it_runs(cache_slot):
    from shardwise._planner import calibrate as cal

    mesh = build_mesh(MeshSpec.parse("x=2"))
    # (16 GiB on 2 devices had failed in XLA as a bug in shardwise; larger ones were killed)
    with pytest.raises(shardwise.ArgumentError, match="give a smaller size"):
        cal.calibrate(mesh, per_device_bytes=2**42, repeat=1)
    assert not cache_slot.exists()
