"""The batch-size sweep: plans across batch sizes, the switch from tensor- to data-parallel
plans against the scaling book's point, its table, its plot, and the CLI around it."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from shardwise._errors import ArgumentError
from shardwise._model.mesh import MeshSpec
from shardwise._model.profile import BUILTIN
from shardwise._program.sweep import sweep
from shardwise.cli import app
from shardwise.cli.program import parse_batches
from shardwise.render.sweep import device_sweep_view, save_sweep, sweep_view
from shardwise.render.terminal import plain_text

runner = CliRunner()
V5P = BUILTIN["tpu-v5p"]
SMALL = ["--model", "mlp", "--hidden", "256", "--ffn", "1024", "--train", "--dtype", "bfloat16"]


def test_parse_batches():
    assert parse_batches("256..2048") == [256, 512, 1024, 2048]
    assert parse_batches("256..1000") == [256, 512]
    assert parse_batches("8,3") == [8, 3]
    for bad in ("", "a..b", "64..8", "0..8", "1,,2"):
        with pytest.raises(ArgumentError, match="--sweep-batch"):
            parse_batches(bad)


def test_the_sweep_moves_to_data_parallel_plans_past_the_scaling_book_point():
    """A 16×16 v5p mesh (not here): below C / W_ici ≈ 2550 tokens per device a
    tensor-parallel baseline is ahead, from a few times it on a data-parallel one, for good."""
    mesh = MeshSpec.parse("data=16,model=16")
    batches = [256 * 2**p for p in (0, 4, 8, 14, 16)]
    result = sweep("mlp", batches, mesh=mesh, profile=V5P, train=True, hidden=8192, ffn=32768,
                   dtype="bfloat16")  # fmt: skip
    assert result.threshold == pytest.approx(2550, rel=0.01)
    assert [r.tokens_per_device for r in result.rows] == [1, 16, 256, 16384, 65536]
    assert [r.family for r in result.rows] == ["tensor"] * 3 + ["data"] * 2
    assert result.switch == 16384
    # MFU: an MLP step's 10·B·h·f FLOPs (the input needs no gradient) over 256 chips' time
    for r in result.rows:
        flops = 10 * r.batch * 8192 * 32768
        assert r.mfu == pytest.approx(flops / (256 * r.seconds * 459e12), rel=0.02)
    assert result.rows[-1].mfu > result.rows[0].mfu
    data = result.to_json()
    assert data["switch_tokens_per_device"] == 16384 and len(data["rows"]) == 5
    text = plain_text(sweep_view(result), width=200)
    assert "C / W_ici ≈ 2550" in text and "16,384" in text


def test_a_transformer_counts_tokens_as_batch_times_sequence():
    result = sweep("transformer", [16], mesh=MeshSpec.parse("data=4,model=4"), profile=V5P,
                   seq=64, hidden=64, ffn=128, heads=4)  # fmt: skip
    assert result.rows[0].tokens_per_device == 16 * 64 / 16


def test_save_sweep_writes_a_png(tmp_path):
    result = sweep("mlp", [16, 4096], mesh=MeshSpec.parse("data=4,model=4"), profile=V5P,
                   hidden=256, ffn=1024)  # fmt: skip
    path = save_sweep(result, tmp_path / "s.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_cli_sweep_json_table_and_plot(tmp_path):
    base = [*SMALL, "--mesh", "data=4,model=4", "--profile", "tpu-v5p"]
    out = runner.invoke(app, ["plan", *base, "--sweep-batch", "16..256", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert [r["batch"] for r in data["rows"]] == [16, 32, 64, 128, 256]
    assert {"tokens_per_device", "search_seconds", "in_specs", "family"} <= set(data["rows"][0])
    png = tmp_path / "sweep.png"
    out = runner.invoke(app, ["plan", *base, "--sweep-batch", "16,4096", "--plot", str(png)])
    assert out.exit_code == 0, out.output
    assert "tokens/device" in out.output and f"wrote {png}" in out.output.replace("\n", "")
    assert png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    "extra, says",
    [
        (["--plot", "x.png"], "--sweep-batch"),
        (["--sweep-batch", "16..64", "--mesh", "data=4,model=4"], "--profile"),
        (
            ["--sweep-batch", "64..16", "--mesh", "data=4,model=4", "--profile", "tpu-v5p"],
            "cannot read --sweep-batch",
        ),
    ],
)
def test_cli_sweep_errors_say_what_to_give(extra, says):
    out = runner.invoke(app, ["plan", *SMALL, *extra])
    assert out.exit_code == 2 and says in out.output, out.output


def test_cli_sweep_needs_a_built_in_model():
    out = runner.invoke(
        app,
        [
            "plan",
            "--function",
            "m:f",
            "--sweep-batch",
            "16",
            "--mesh",
            "x=4",
            "--profile",
            "tpu-v5p",
        ],
    )
    assert out.exit_code == 2 and "--model" in out.output


def test_the_device_sweep_chooses_a_mesh_at_each_count_and_counts_model_flops():
    """Each device count gets a mesh of exactly that many devices; MFU is the model's FLOPs
    (an MLP training step: two products forward, three backward, as the input needs no
    gradient: 5 × 2·B·h·f, up to its elementwise work) over
    devices × step time × peak; on a count no split divides the batch over, the most devices
    a split can use (4096 rows × 16 ways of tensor), MFU still counting every device."""
    from shardwise._program.device_sweep import sweep_devices

    batch, hidden, ffn = 4096, 1024, 4096
    result = sweep_devices("mlp", [16, 4, 2**20], profile=V5P, batch=batch, hidden=hidden,
                           ffn=ffn, dtype="bfloat16", train=True)  # fmt: skip
    assert [p.devices for p in result.points] == [4, 16, 2**20]
    assert result.model_flops == pytest.approx(10 * batch * hidden * ffn, rel=0.01)
    for p in result.points[:2]:
        assert math.prod(int(a.split("=")[1]) for a in p.mesh.split(",")) == p.devices
        assert p.mfu == pytest.approx(result.model_flops / (p.devices * p.seconds * 459e12))
        assert 0 < p.mfu <= 1 and p.fits and p.remat is None
    many = result.points[2]
    assert (many.used, many.mesh, many.skipped) == (4096 * 16, "fsdp=4096,tensor=16", None)
    assert many.mfu == pytest.approx(result.model_flops / (2**20 * many.seconds * 459e12))
    assert result.to_json()["points"][2]["used"] == 4096 * 16
    doc = result.to_json()
    assert doc["points"][0]["mesh"] == result.points[0].mesh and len(doc["points"]) == 3
    text = plain_text(device_sweep_view(result), width=200)
    assert "fsdp=4096,tensor=16 (983,040 idle)" in text and "MFU" in text


def test_cli_device_sweep_json_table_and_plot(tmp_path):
    """``--sweep-devices`` with a Llama and ``--remat auto``: each point names its mesh and
    remat policy; the plot is written; a mesh or a missing profile is refused."""
    tiny = [
        "--model",
        "llama",
        "--batch",
        "16",
        "--seq",
        "16",
        "--hidden",
        "64",
        "--layers",
        "2",
        "--heads",
        "4",
        "--kv-heads",
        "2",
        "--ffn",
        "128",
        "--vocab",
        "64",
        "--train",
    ]
    png = tmp_path / "devices.png"
    sweep = ["--sweep-devices", "2,8", "--roles", "fsdp", "--remat", "auto"]
    out = runner.invoke(app, ["plan", *tiny, "--profile", "tpu-v5p", *sweep, "--plot", str(png),
                              "--json"])  # fmt: skip
    assert out.exit_code == 0, out.output
    points = json.loads(out.stdout)["points"]
    assert [p["devices"] for p in points] == [2, 8]
    assert all(p["remat"] in ("none", "full", "minimal", "save_dots") for p in points)
    assert png.read_bytes()[:4] == b"\x89PNG"
    out = runner.invoke(app, ["plan", *tiny, "--sweep-devices", "2,8"])
    assert out.exit_code == 2 and "--profile" in out.output
    out = runner.invoke(app, ["plan", *tiny, "--profile", "tpu-v5p", "--sweep-devices", "2",
                              "--mesh", "data=2"])  # fmt: skip
    assert out.exit_code == 2 and "does not take --mesh" in out.output
