"""The tutorial's scenarios S1–S4: every shard against NumPy, collectives from the compiled HLO."""

from __future__ import annotations

import numpy as np
import pytest

import shardwise
from helpers import assert_shards, tolerance
from shardwise._demo import run_scenario, scenarios
from shardwise._model.mesh import build_mesh
from shardwise._xla.explain import compile_plan, explain_compiled

SMALL = {s.name: s for s in scenarios("small")}
TUTORIAL = {s.name: s for s in scenarios("tutorial")}
EXPECTED = {
    "S1": [],
    "S2": [],
    "S3": [("all-reduce", ("devices",))],
    "S4": [("all-reduce", ("y",))],
}


@pytest.mark.parametrize("name", ["S1", "S2", "S3", "S4"])
def test_tutorial_sizes_compile_to_the_expected_shards_and_collectives(name):
    plan = TUTORIAL[name].plan()
    expl = explain_compiled(plan, compile_plan(plan, build_mesh(plan.mesh)))
    assert [(c.kind, c.mesh_axes) for c in expl.collectives] == EXPECTED[name]
    shards = [o.shard_shape for o in expl.operands]
    assert (
        shards
        == {
            "S1": [(1250000, 3), (10_000_000, 3)],
            "S2": [(1250000, 3), (1250000, 3)],
            "S3": [(1000, 1250), (1000, 1250)],
            "S4": [(2000, 2500), (2000, 2500)],
        }[name]
    )
    assert (
        expl.output.shard_shape
        == {
            "S1": (1250000,),
            "S2": (1250000,),
            "S3": (1000,),
            "S4": (2000,),
        }[name]
    )


def test_s4_all_reduce_is_over_y_with_the_tutorials_groups_and_bytes():
    plan = TUTORIAL["S4"].plan()
    expl = explain_compiled(plan, compile_plan(plan, build_mesh(plan.mesh)))
    (ar,) = expl.collectives
    assert sorted(ar.groups) == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert ar.bytes == 2000 * 4


@pytest.mark.parametrize("name", ["S1", "S2", "S3", "S4"])
def test_every_shard_matches_numpy(name):
    scenario = SMALL[name]
    plan = scenario.plan()
    mesh = build_mesh(plan.mesh)
    rng = np.random.default_rng(1)
    a, b = (rng.standard_normal(s).astype(np.float32) for s in plan.shapes)
    out = shardwise.einsum(
        scenario.equation,
        a,
        b,
        mesh=mesh,
        in_specs=scenario.in_specs,
        out_specs=scenario.out_spec,
        mode=scenario.mode,
    )
    expected = np.einsum("nd,nd->n", a.astype(np.float64), b.astype(np.float64))
    assert_shards(out, expected, mesh, plan.out_spec, **tolerance(np.float32, a.shape[1]))


@pytest.mark.parametrize("name", ["S1", "S2", "S3", "S4"])
def test_run_scenario_reports_a_correct_run(name):
    outcome = run_scenario(SMALL[name], repeat=1)
    assert outcome.ok
    assert outcome.check.max_abs_error <= outcome.check.tolerance
    data = outcome.to_json()
    assert data["name"] == name
    assert [(c["kind"], tuple(c["mesh_axes"])) for c in data["explain"]["collectives"]] == (
        EXPECTED[name]
    )


def test_check_catches_a_wrong_result():
    from shardwise._xla.check import check_einsum

    op = shardwise.Op.parse("nd,nd->n")
    a = np.ones((8, 3), np.float32)
    good = check_einsum(op, [a, a], np.full(8, 3.0, np.float32))
    bad = check_einsum(op, [a, a], np.full(8, 3.001, np.float32))
    assert good.ok and not bad.ok
