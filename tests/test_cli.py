"""The command line: demo and explain, through typer's CliRunner."""

from __future__ import annotations

import json

import pytest
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
    assert data["devices"] == {"platform": "cpu", "count": 8, "processes": 1}
    assert [s["name"] for s in data["scenarios"]] == ["S1", "S2", "S3", "S4", "S5"]
    s5 = data["scenarios"].pop()
    assert s5["ok"] and [p["name"] for p in s5["parts"]] == [
        "data.mean()",
        "dot(data, data).mean()",
    ]
    assert all(p["max_abs_error"] <= 1e-9 * abs(p["dask_value"]) for p in s5["parts"])
    for s in data["scenarios"]:
        assert s["ok"] is True
        assert 0 <= s["max_abs_error"] <= s["tolerance"]
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


def test_demo_bad_size():
    result = runner.invoke(app, ["demo", "--size", "huge"])
    assert result.exit_code == 2
    assert "not one of tutorial, small" in result.output


@pytest.mark.parametrize(
    ("argv", "collectives", "shard"),
    [
        (
            ["--mesh", "x=2,y=4", "--in", "x,y", "--in", "x,y", "--out", "x"],
            [{"kind": "all-reduce", "mesh_axes": ["y"], "bytes": 8000}],
            [2000, 2500],
        ),
        (["--mesh", "devices=8", "--in", "devices", "--in", "devices"], [], [500, 10000]),
        (
            ["--mesh", "devices=8", "--layout", "d=devices", "--out", "", "--mode", "manual"],
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
