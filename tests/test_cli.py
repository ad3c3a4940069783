"""The command line: demo and explain, one vocabulary of flags, through typer's CliRunner."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from shardwise.cli import app

runner = CliRunner()


def contract(collectives):
    """The engine's contract keys of each collective (later work adds keys beside them)."""
    return [{k: c[k] for k in ("kind", "mesh_axes", "bytes")} for c in collectives]


def test_demo_small_json_follows_the_contract():
    result = runner.invoke(app, ["demo", "--size", "small", "--json", "--repeat", "1"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["devices"] == {"platform": "cpu", "count": 8, "processes": 1, "used": 8}
    assert [s["name"] for s in data["scenarios"]] == ["S1", "S2", "S3", "S4", "S5"]
    s5 = data["scenarios"].pop()
    assert s5["ok"] and [p["name"] for p in s5["parts"]] == [
        "data.mean()",
        "dot(data, data).mean()",
    ]
    assert all(p["max_abs_error"] <= 1e-9 * abs(p["dask_value"]) for p in s5["parts"])
    for s in data["scenarios"]:
        assert s["ok"] is True
        # float32 sums of random rows differ from float64's: a check that passes still says
        # by how much (it had said 0 whenever it passed)
        assert 0 < s["max_abs_error"] <= s["tolerance"]
        assert s["seconds"] > 0
        assert set(s["explain"]) >= {
            "equation",
            "mesh",
            "mode",
            "operands",
            "output",
            "collectives",
        }
    s3, s4 = data["scenarios"][2], data["scenarios"][3]
    assert s3["explain"]["operands"][0]["shard_shape"] == [64, 100]
    assert s3["explain"]["collectives"][0]["kind"] == "all-reduce"
    assert contract(s4["explain"]["collectives"]) == [
        {"kind": "all-reduce", "mesh_axes": ["y"], "bytes": 800}
    ]


def test_demo_table():
    result = runner.invoke(
        app, ["demo", "--size", "small", "--repeat", "1"], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 0, result.output
    for text in ("S1", "S4", "all-reduce over y", "P(x,y)"):
        assert text in result.output


def test_demo_exits_nonzero_on_a_wrong_result(monkeypatch):
    import shardwise._demo as demo

    real = demo.check_einsum

    def wrong(op, arrays, result):
        return real(op, arrays, result + 1.0)

    monkeypatch.setattr(demo, "check_einsum", wrong)
    result = runner.invoke(app, ["demo", "--size", "small", "--repeat", "1"])
    assert result.exit_code == 1
    assert "wrong results in S1, S2, S3, S4" in result.output  # S5 is checked against Dask


def test_demo_says_the_devices_it_runs_on_and_refuses_too_few(monkeypatch):
    """On 16 devices the title had said "on 16 cpu devices" where every scenario runs on 8;
    on 4 the error had named a mesh 'devices=8' the user never gave."""
    from shardwise.cli.demo import demo_table

    report = {"devices": {"platform": "cpu", "count": 16, "processes": 1, "used": 8},
              "size": "small", "scenarios": [], "ok": True, "skipped": []}  # fmt: skip
    assert "on 8 of the 16 cpu devices" in str(demo_table(report).title)
    import shardwise._demo as demo

    monkeypatch.setattr(demo.jax, "device_count", lambda: 4)
    result = runner.invoke(app, ["demo", "--size", "small", "--repeat", "1"])
    assert result.exit_code == 2
    assert "run on 8 devices (a line of 8 and a 2 × 4 grid), but 4 are" in result.output


def test_demo_bad_size():
    result = runner.invoke(app, ["demo", "--size", "huge"])
    assert result.exit_code == 2
    assert "not one of tutorial, small" in result.output


@pytest.mark.parametrize(
    ("argv", "collectives", "shard"),
    [
        (
            ["--mesh", "x=2,y=4", "--in", "x,y", "--in", "x,y", "--out-spec", "x"],
            [{"kind": "all-reduce", "mesh_axes": ["y"], "bytes": 8000}],
            [2000, 2500],
        ),
        (["--mesh", "devices=8", "--in", "devices", "--in", "devices"], [], [500, 10000]),
        (
            ["--mesh", "devices=8", "--layout", "d=devices", "--out-spec", "", "--mode", "manual"],
            [{"kind": "all-reduce", "mesh_axes": ["devices"], "bytes": 16000}],
            [4000, 1250],
        ),
    ],
)
def test_explain_json(argv, collectives, shard):
    result = runner.invoke(
        app, ["explain", "nd,nd->n", "--shapes", "4000x10000,4000x10000", "--json", *argv]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert contract(data["collectives"]) == collectives
    assert data["operands"][0]["shard_shape"] == shard
    assert data["operands"][0]["shape"] == [4000, 10000]
    assert data["output"]["shape"] == [4000]


def test_explain_table():
    result = runner.invoke(
        app,
        [
            "explain",
            "mk,kn->mn",
            "--shapes",
            "64x64,64x64",
            "--mesh",
            "x=2,y=4",
            "--in",
            "x,y",
            "--in",
            "y",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "all-reduce" in result.output and "(32, 16)" in result.output


# one vocabulary: flags without metavars, --out for files, memory named for what it bounds

COMMANDS = ["demo", "explain", "plan", "run", "bench", "calibrate", "launch"]


def flat(text):
    """``text`` with every run of whitespace as one space (rich wraps long lines)."""
    return " ".join(text.split())


def warned(result, old, new, command):
    return (
        f"warning: {old} is deprecated for {command}; use {new} (it will be removed in the "
        "next release)"
    ) in flat(result.stderr)


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help_shows_flags_without_a_value_placeholder(command):
    result = runner.invoke(
        app, [command, "--help"] if command else ["--help"], env={"COLUMNS": "120"}
    )
    assert result.exit_code == 0, result.output
    assert "<bool>" not in result.output and "BOOLEAN" not in result.output, result.output
    flag = re.compile(r"^│\s+(?:\*\s+)?(--help|--json|--verify|--all-output|--dask)\b(.*)$")
    rows = [m for line in result.output.splitlines() if (m := flag.match(line))]
    assert rows  # every command has --help
    for m in rows:
        before_help = m.group(2).split("Show this")[0] if m.group(1) == "--help" else m.group(2)
        assert "<" not in before_help, m.group(0)
    if command in ("plan", "bench", "calibrate", "explain"):
        assert "<int range>" in result.output or "<str>" in result.output  # values keep theirs


def test_deprecated_names_are_left_out_of_the_help():
    explain = runner.invoke(app, ["explain", "--help"], env={"COLUMNS": "120"}).output
    assert "--out-spec" in explain and not re.search(r"--out(?!-)", explain)
    for command, new in (("plan", "--device-memory"), ("run", "--host-memory")):
        text = runner.invoke(app, [command, "--help"], env={"COLUMNS": "120"}).output
        assert new in text and "--budget" not in text


EXPLAIN = ["explain", "nd,nd->n", "--shapes", "64x32,64x32", "--mesh", "x=2,y=4", "--json"]
EXPLAIN_IN = ["--in", "x,y", "--in", "x,y"]


@pytest.mark.parametrize(
    "argv",
    [
        ["demo", "--size", "small"],
        EXPLAIN[:-1],
        ["plan", "nd,nd->n", "--shapes", "64x32,64x32"],
        ["plan", "--model", "mlp"],
        ["bench"],
        ["calibrate"],
    ],
)
@pytest.mark.parametrize("fmt", ["markdown", "plain"])
def test_json_and_format_together_are_refused_not_one_left_out(argv, fmt):
    """--json --format markdown had printed the JSON and left --format out, silently."""
    result = runner.invoke(app, [*argv, "--json", "--format", fmt])
    assert result.exit_code == 2, result.output
    said = flat(result.stderr)
    assert f"--json and --format {fmt} were both given" in said
    assert "--format says how tables are printed" in said and "give one" in said
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("argv", "needs"),
    [
        (["nd,nd->n", "--shapes", "64x32,64x32"], "--verify"),
        (["--model", "mlp"], "--verify or --tune"),
    ],
)
def test_plan_refuses_repeat_without_what_it_times(argv, needs):
    """An einsum's --repeat 3 without --verify had been taken and left out: nothing is timed."""
    result = runner.invoke(app, ["plan", *argv, "--mesh", "x=2", "--repeat", "3"])
    assert result.exit_code == 2, result.output
    said = flat(result.stderr)
    assert f"--repeat 3 counts the timed runs of {needs}, and nothing is timed without" in said
    assert f"--repeat needs {needs}" in said and "or drop --repeat" in said


def test_explain_out_spec_and_its_deprecated_name_out():
    new = runner.invoke(app, [*EXPLAIN, *EXPLAIN_IN, "--out-spec", "x"])
    assert new.exit_code == 0, new.output
    assert "deprecated" not in new.stderr
    old = runner.invoke(app, [*EXPLAIN, *EXPLAIN_IN, "--out", "x"])
    assert old.exit_code == 0, old.output
    assert warned(old, "--out", "--out-spec", "explain"), old.stderr
    assert json.loads(old.stdout)["output"] == json.loads(new.stdout)["output"]
    assert json.loads(new.stdout)["output"]["shard_shape"] == [32]
    replicated = runner.invoke(app, [*EXPLAIN, *EXPLAIN_IN, "--out-spec", "-"])
    assert replicated.exit_code == 0, replicated.output
    assert json.loads(replicated.stdout)["output"]["shard_shape"] == [64]


def test_explain_refuses_out_spec_and_out_together():
    result = runner.invoke(app, [*EXPLAIN, *EXPLAIN_IN, "--out-spec", "x", "--out", "x"])
    assert result.exit_code == 2
    assert "both --out-spec and --out" in flat(result.output)
    assert "give --out-spec only" in flat(result.output)


def test_explain_says_how_many_in_it_needs_and_how_to_write_replicated():
    result = runner.invoke(app, [*EXPLAIN, "--in", "x,y"])
    assert result.exit_code == 2
    text = flat(result.output)
    assert "--in was given 1 time, but 'nd,nd->n' has 2 operands" in text, text
    assert "'' or - for a replicated one" in text and "None" not in text


PLAN = ["plan", "nd,nd->n", "--shapes", "8x4,8x4", "--mesh", "x=2", "--profile", "h100"]


@pytest.mark.parametrize(("flag", "warns"), [("--device-memory", False), ("--budget", True)])
def test_plan_device_memory_and_its_deprecated_name_budget(flag, warns):
    result = runner.invoke(app, [*PLAN, flag, "1MiB", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["budget_bytes"] == 2**20
    assert warned(result, "--budget", "--device-memory", "plan") is warns, result.stderr


def test_plan_memory_errors_name_the_new_flag():
    for flag in ("--device-memory", "--budget"):
        result = runner.invoke(app, [*PLAN, flag, "0"])
        assert result.exit_code == 2
        assert "--device-memory '0' is 0 bytes" in flat(result.output), result.output
    both = runner.invoke(app, [*PLAN, "--device-memory", "1MiB", "--budget", "1MiB"])
    assert both.exit_code == 2 and "give --device-memory only" in flat(both.output)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["nonsense", "--model", "mlp"], "given the einsum 'nonsense' and --model"),
        (["ab,bc->ac", "--function", "{src}:f", "--args", "x=f32[8,4]", "--args", "w=f32[4,2]"],
         "given the einsum 'ab,bc->ac' and --function"),
        (["--shapes", "8x4,8x4", "--model", "mlp"], "given --shapes and --model"),
        (["--function", "{src}:f", "--args", "x=f32[8,4]", "w=f32[4,2]"],
         "each --args takes one value, so write --args before each: --args w=f32[4,2]"),
    ],
)  # fmt: skip
def test_plan_refuses_an_einsum_given_with_a_program(tmp_path, argv, said):
    src = tmp_path / "prog.py"
    src.write_text("def f(x, w):\n    return x @ w\n")
    argv = [a.replace("{src}", str(src)) for a in argv]
    result = runner.invoke(app, ["plan", *argv, "--mesh", "x=2", "--profile", "h100"])
    assert result.exit_code == 2, result.output
    assert said in flat(result.output), result.output


@pytest.mark.parametrize(
    "flags",
    [["--train"], ["--html", "{tmp}/report.html"], ["--batch", "256", "-q"], ["--fixed", "x=-"],
     ["--time-limit", "300"]],
)  # fmt: skip
def test_plan_of_an_einsum_refuses_what_only_a_program_reads(tmp_path, flags):
    flags = [f.replace("{tmp}", str(tmp_path)) for f in flags]
    result = runner.invoke(app, [*PLAN, *flags])
    assert result.exit_code == 2, result.output
    named = [f for f in flags if f.startswith("-")]
    said = f"{', '.join(named).replace('-q', '--quiet')} go"
    assert said in flat(result.output) and "not an einsum's" in flat(result.output), result.output
    if "--html" in flags:
        assert (
            "shardwise explain" in flat(result.output) and not (tmp_path / "report.html").exists()
        )


def test_plan_time_limit_is_the_programs(monkeypatch):
    """``--time-limit`` gives a program's plan its limit (pricing a mesh of four axes can take
    more than the minute it has by default, which the error's advice says to raise)."""
    import shardwise

    asked: list[float] = []
    real = shardwise.plan

    def recorded(*args, **kwargs):
        asked.append(kwargs.get("time_limit", -1.0))
        return real(*args, **kwargs)

    monkeypatch.setattr(shardwise, "plan", recorded)
    argv = ["plan", "--model", "mlp", "--batch", "16", "--hidden", "8", "--ffn", "16", "--mesh",
            "x=2", "--profile", "cpu-2core", "--quiet"]  # fmt: skip
    for flags, want in (([], -1.0), (["--time-limit", "300"], 300.0)):
        result = runner.invoke(app, [*argv, *flags])
        assert result.exit_code == 0, result.output
        assert asked.pop() == want
    result = runner.invoke(app, [*argv[:-5], "--choose-mesh", "8", "--profile", "h100",
                                 "--time-limit", "300"])  # fmt: skip
    assert result.exit_code == 2 and "--time-limit does not go with it" in flat(result.output)


@pytest.mark.parametrize(
    ("flags", "said"),
    [(["--auto", "--layout", "n=x"], "--auto and --layout each say"),
     (["--auto", *EXPLAIN_IN], "--auto and --in each say"),
     (["--layout", "n=x", *EXPLAIN_IN], "--layout and --in each say")],
)  # fmt: skip
def test_explain_takes_one_of_auto_layout_and_in(flags, said):
    result = runner.invoke(app, [*EXPLAIN, *flags])
    assert result.exit_code == 2, result.output
    assert said in flat(result.output), result.output


def _npy_inputs(tmp_path):
    rng = np.random.default_rng(0)
    a, b = (rng.random((10_001, 3)).astype(np.float32) for _ in range(2))
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    return ["run", "nd,nd->n", str(tmp_path / "a.npy"), str(tmp_path / "b.npy")], a, b


@pytest.mark.parametrize(("flag", "warns"), [("--host-memory", False), ("--budget", True)])
def test_run_host_memory_and_its_deprecated_name_budget(tmp_path, flag, warns):
    args, a, b = _npy_inputs(tmp_path)
    out = tmp_path / "o.npy"
    result = runner.invoke(app, [*args, "--out", str(out), flag, "64KiB", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["chunks"] > 1 and data["predicted_peak_bytes"] <= 64 * 2**10
    np.testing.assert_allclose(np.load(out), np.einsum("nd,nd->n", a, b), rtol=1e-5)
    assert warned(result, "--budget", "--host-memory", "run") is warns, result.stderr


def test_run_memory_errors_name_the_new_flag(tmp_path):
    args, _, _ = _npy_inputs(tmp_path)
    out = ["--out", str(tmp_path / "o.npy")]
    for flag in ("--host-memory", "--budget"):
        result = runner.invoke(app, [*args, *out, flag, "0"])
        assert result.exit_code == 2
        assert "--host-memory '0' is 0 bytes" in flat(result.output), result.output
    both = runner.invoke(app, [*args, *out, "--host-memory", "1MiB", "--budget", "1MiB"])
    assert both.exit_code == 2 and "give --host-memory only" in flat(both.output)


def _option(command, name):
    click_command = typer.main.get_command(app).commands[command]
    return next(p for p in click_command.params if p.name == name)


@pytest.mark.parametrize(
    ("command", "what"),
    [
        ("plan", "timed runs of each strategy (or plan)"),
        ("bench", "timed runs of each runner (shardwise and each peer)"),
        ("calibrate", "timed runs of each measurement"),
    ],
)
def test_repeat_defaults_to_five_and_says_what_one_repeat_is(command, what):
    repeat = _option(command, "repeat")
    assert repeat.default == 5
    assert what in repeat.help.lower() and "median" in repeat.help


def _dtype_commands(tmp_path, dtype):
    """Every place a dtype is named on the command line, as arguments naming ``dtype``."""
    src = tmp_path / "prog.py"
    src.write_text("def f(x):\n    return x.sum(0)\n")
    planned = ["--mesh", "x=2", "--profile", "h100", "--json"]
    mlp = ["--model", "mlp", "--hidden", "16", "--ffn", "32", "--batch", "8"]
    einsum = ["nd,nd->n", "--shapes", "8x4,8x4", "--mesh", "x=2"]
    return {
        "plan-model": ["plan", *mlp, *planned, "--dtype", dtype],
        "plan-einsum": ["plan", *einsum, "--profile", "h100", "--json", "--dtype", dtype],
        "explain": ["explain", *einsum, "--in", "x", "--in", "x", "--json", "--dtype", dtype],
        "args": ["plan", "--function", f"{src}:f", *planned, "--args", f"x={dtype.lower()}[8,4]"],
    }


@pytest.mark.parametrize("dtype", ["bf16", "F32", "bfloat16", "u8"])
@pytest.mark.parametrize("command", ["plan-model", "plan-einsum", "explain", "args"])
def test_dtype_reads_numpy_names_and_short_forms_everywhere(tmp_path, command, dtype):
    """--dtype of every command, and the dtype of --args, read one vocabulary: NumPy's names and
    the short forms, in any case."""
    if command == "args" and dtype == "bfloat16":
        pytest.skip("--args writes a dtype as a short form in lower case, e.g. bf16[8,4]")
    result = runner.invoke(app, _dtype_commands(tmp_path, dtype)[command])
    assert result.exit_code == 0, result.output
    if command in ("plan-einsum", "explain"):  # (a program's JSON does not name its dtypes)
        name = {"bf16": "bfloat16", "f32": "float32", "u8": "uint8"}.get(dtype.lower(), dtype)
        assert f'"{name}"' in result.stdout, result.stdout


@pytest.mark.parametrize(
    ("flags", "train", "optimizer"),
    [([], False, None), (["--train"], True, "sgd"),
     (["--train", "--optimizer", "adamw"], True, "adamw")],
    ids=["forward", "SGD step", "AdamW step"],
)  # fmt: skip
def test_a_programs_json_says_whether_it_is_a_training_step_and_with_what(flags, train, optimizer):
    """An AdamW step (planned as it is, not differentiated by the planner) had said
    ``"train": false``, as a forward pass does, and named no optimizer."""
    mlp = ["--model", "mlp", "--hidden", "16", "--ffn", "32", "--batch", "8"]
    argv = ["plan", *mlp, "--mesh", "x=2", "--profile", "cpu-2core", "--top", "1", "--json"]
    result = runner.invoke(app, [*argv, *flags])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert (doc["program"], doc["train"], doc["optimizer"]) == ("mlp", train, optimizer)


@pytest.mark.parametrize("command", ["plan-model", "plan-einsum", "explain", "args"])
def test_an_unknown_dtype_is_refused_with_the_valid_names(tmp_path, command):
    result = runner.invoke(app, _dtype_commands(tmp_path, "bf99")[command])
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert "'bf99' is not a dtype (did you mean `bf16`?)" in text, text
    assert "bfloat16" in text and "f32" in text and "This is a bug" not in text


@pytest.mark.parametrize("command", ["explain", "plan"])
def test_empty_dimensions_are_taken_as_the_python_api_takes_them(command):
    """``--shapes 0x8,0x8``: an empty einsum plans and explains (it had been refused as 'a
    size below 1', where the Python API gives NumPy's empty result)."""
    result = runner.invoke(app, [command, "nd,nd->n", "--shapes", "0x8,0x8", "--mesh", "x=2"])
    assert result.exit_code == 0, result.output
    if command == "plan":
        assert "as fast as the next" in " ".join(result.output.split())
    refused = runner.invoke(app, [command, "nd,nd->n", "--shapes", "-1x8,8x8", "--mesh", "x=2"])
    assert refused.exit_code == 2 and "negative size" in refused.output


@pytest.mark.parametrize(
    ("path", "words"),
    [("sweep.txt", "must end in .png or .svg"), ("sweep", "must end in .png or .svg"),
     ("missing/sweep.png", "does not exist")],
)  # fmt: skip
def test_a_plot_that_cannot_be_written_is_refused_before_the_sweep(tmp_path, path, words):
    """They had failed after the sweep as 'unexpected ValueError/FileNotFoundError ... a bug
    in shardwise' (exit 1), and a name without a suffix had been written as NAME.png."""
    result = runner.invoke(app, ["plan", "--model", "mlp", "--mesh", "x=2", "--sweep-batch",
                                 "16..32", "--plot", str(tmp_path / path)])  # fmt: skip
    assert result.exit_code == 2 and words in " ".join(result.output.split())


@pytest.mark.parametrize(
    "argv",
    [
        ["explain", "nd,nd->n", "--shapes", "8x4,8x4", "-q", "--html"],
        ["explain", "nd,nd->n", "--shapes", "8x4,8x4", "-q", "--svg"],
        ["plan", "--model", "mlp", "--mesh", "x=2", "--profile", "cpu-2core", "--html"],
        ["calibrate", "--size", "4KiB", "--repeat", "1", "--devices", "2", "--out"],
    ],
    ids=["explain-html", "explain-svg", "plan-html", "calibrate-out"],
)
def test_an_output_path_that_is_not_a_file_is_refused_and_left_as_it_is(tmp_path, argv):
    # written atomically, a file had been renamed over it: as root, a device (/dev/full)
    # was replaced by the profile, and the command said it had written it
    import os
    import stat

    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    result = runner.invoke(app, [*argv, str(pipe)])
    assert result.exit_code == 2, result.output
    assert "is a named pipe; give the path of a file" in result.output
    assert stat.S_ISFIFO(os.lstat(pipe).st_mode)


def test_write_atomic_never_replaces_a_device_or_a_pipe(tmp_path):
    import os

    from shardwise._files import write_atomic

    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    with pytest.raises(OSError, match="it is a named pipe, not a file that can be replaced"):
        write_atomic(pipe, "{}")
    assert os.listdir(tmp_path) == ["pipe"]  # (and no temporary file left beside it)
    link = tmp_path / "link"  # (as /dev/stdout is a link to a device)
    link.symlink_to(pipe)
    with pytest.raises(OSError, match="it is a named pipe"):
        write_atomic(link, "{}")
    assert link.is_symlink()
    regular = tmp_path / "file"
    regular.write_text("old")
    (tmp_path / "to-file").symlink_to(regular)
    write_atomic(tmp_path / "to-file", "new")  # (a link to a file is replaced, not followed)
    assert regular.read_text() == "old" and (tmp_path / "to-file").read_text() == "new"


def test_an_empty_output_path_is_said_to_name_no_file():
    result = runner.invoke(app, ["calibrate", "--out", ""])
    assert result.exit_code == 2 and "--out names no file" in result.output


def test_plan_shows_each_stage_of_a_programs_planning_on_its_status_line(monkeypatch):
    """The status line under ``plan --model`` follows the planner, stage by stage (the
    spinner had said only "planning" for the minutes a mesh of four axes takes)."""
    import shardwise.cli.plan_program as plan_program

    shown: list[str] = []

    class Status:
        def __enter__(self) -> Status:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def update(self, text: str) -> None:
            shown.append(text)

    real = plan_program.console

    def console(stderr: bool = False):  # type: ignore[no-untyped-def]
        out = real(stderr)
        monkeypatch.setattr(out, "status", lambda text: Status())
        return out

    monkeypatch.setattr(plan_program, "console", console)
    result = runner.invoke(
        app, ["plan", "--model", "mlp", "--batch", "64", "--hidden", "32", "--ffn", "64",
              "--mesh", "data=2,model=4", "--profile", "cpu-2core", "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert shown[0] == "tracing the program"
    assert any(s.startswith("pricing the layouts: step 1 of ") for s in shown)
    assert shown[-1] == "predicting each plan's time and memory"
