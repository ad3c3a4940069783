"""``ProgramPlan.tune`` and ``shardwise plan --tune``: measure every plan, choose the fastest,
and have everything that follows the choice (``chosen``, ``sharded``, the report, the JSON,
the table) follow it."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
from typer.testing import CliRunner

import shardwise
from shardwise._model.profile import BUILTIN
from shardwise._program import verify
from shardwise._program.models import model
from shardwise.cli import app

CPU = BUILTIN["cpu-2core"]
runner = CliRunner()


def _plan(top=2):
    fn, args = model("mlp", batch=64, hidden=32, ffn=64)
    return fn, args, shardwise.plan(fn, *args, mesh="data=2,model=4", profile=CPU, top=top)


def test_tune_chooses_the_plan_that_measured_fastest(monkeypatch):
    fn, args, plan = _plan(top=1)  # (with two, the search's second plan is replicated's twin)
    assert plan.chosen.name == "search" and not plan.tuned
    # the machine's clock decides: say the replicated plan ran fastest, the search's slowest
    fake = {p.name: 1.0 + k for k, p in enumerate(plan.plans)}
    fake["replicated"], fake["search"] = 0.5, 9.0
    monkeypatch.setattr(verify, "alternate", lambda runners, *a, **k: {n: fake[n] for n in runners})
    tuned = plan.tune(repeat=1)
    assert tuned.tuned and tuned.chosen_name == "replicated"
    assert tuned.chosen is tuned.get("replicated")
    assert tuned.in_specs == tuned.specs_tree(tuned.get("replicated"))
    # what runs, what is reported and what the JSON says all follow the measured choice
    out = tuned.to_json()
    assert out["chosen"] == "replicated" and out["tuned"] is True
    assert tuned.report().plan == "replicated"
    leaves = [np.full(a.shape, 0.01, a.dtype) for a in jax.tree.leaves(args)]
    x, params = jax.tree.unflatten(jax.tree.structure(args), leaves)
    program = tuned.sharded()
    placed = jax.tree.leaves(program.lower(x, params).compile().input_shardings[0])
    assert all(s.is_fully_replicated for s in placed)
    searched = tuned.sharded("search").lower(x, params).compile().input_shardings[0]
    assert not all(s.is_fully_replicated for s in jax.tree.leaves(searched))
    result = program(x, params)
    np.testing.assert_allclose(np.asarray(result), np.asarray(fn(x, params)), rtol=1e-5)
    text = str(tuned)
    assert "chosen: replicated, the plan that ran fastest when tuned" in text
    assert "the search's plan took 18.00× its time" in text
    assert "plan 'replicated' op by op" in text
    assert "measured fastest here" not in text  # the chosen one is the fastest
    page = tuned.to_html()
    assert "replicated, the plan that ran fastest here (tuned)" in page
    assert "the plan that ran fastest here" not in plan.to_html()


def test_tune_keeps_the_search_plan_where_it_ran_fastest(monkeypatch):
    _, _, plan = _plan()
    fake = {p.name: 2.0 for p in plan.plans} | {"search": 1.0}
    monkeypatch.setattr(verify, "alternate", lambda runners, *a, **k: {n: fake[n] for n in runners})
    tuned = plan.tune(repeat=1)
    assert tuned.chosen_name == "search" and tuned.tuned
    assert "chosen: search, the plan that ran fastest when tuned" in str(tuned)


def test_a_plan_over_the_budget_is_neither_run_nor_chosen(monkeypatch):
    fn, args = model("mlp", batch=64, hidden=32, ffn=64)
    budget = 25000  # under replicated's 29,696 bytes per device, over the search's 22,528
    plan = shardwise.plan(fn, *args, mesh="data=2,model=4", profile=CPU, budget=budget, top=2)
    assert plan.get("replicated").over_budget
    ran = []

    def alternate(runners, *a, **k):  # the replicated plan would have run fastest
        ran.extend(runners)
        return {n: 0.5 if n == "replicated" else 1.0 + (n != "search") for n in runners}

    monkeypatch.setattr(verify, "alternate", alternate)
    tuned = plan.tune(repeat=1)
    assert "replicated" not in ran and tuned.get("replicated").verified is None
    assert tuned.chosen_name == "search" and not tuned.chosen.over_budget
    assert tuned.fastest_measured() is tuned.get("search")
    assert all(p.verified is not None for p in tuned.plans if not p.over_budget)
    assert tuned.spearman is not None or len(ran) < 3


def _fake(monkeypatch, fastest):
    def alternate(runners, *a, **k):
        return {n: 0.5 if n == fastest else 2.0 for n in runners}

    monkeypatch.setattr(verify, "alternate", alternate)


def test_tune_may_choose_a_runner_up(monkeypatch):
    _, _, plan = _plan()
    _fake(monkeypatch, "search 2")
    tuned = plan.tune(repeat=1)
    assert tuned.chosen_name == "search 2" and tuned.to_json()["chosen"] == "search 2"


def test_tune_keeps_the_inputs_that_fixed_pins(monkeypatch):
    fn, args = model("mlp", batch=64, hidden=32, ffn=64)
    plan = shardwise.plan(fn, *args, mesh="data=2,model=4", profile=CPU, top=2, fixed={"x": "data"})
    assert plan.get("replicated").in_specs[0].describe() == "replicated"  # a baseline's own
    _fake(monkeypatch, "replicated")
    tuned = plan.tune(repeat=1)
    assert tuned.chosen_name != "replicated"
    assert tuned.chosen.in_specs[0].describe() == "data"


def test_the_measured_fastest_hint_names_only_plans_that_keep_the_pins(monkeypatch):
    """After verify, the hint points at the plan tune would choose: a baseline that lays a
    pinned input out its own way is not offered, however fast it ran."""
    fn, args = model("mlp", batch=64, hidden=32, ffn=64)
    plan = shardwise.plan(fn, *args, mesh="data=2,model=4", profile=CPU, top=2, fixed={"x": "data"})
    keeps = [p.name for p in plan.plans if p.in_specs[0].describe() == "data"]
    assert "replicated" not in keeps and "search 2" in keeps

    def alternate(runners, *a, **k):
        return {n: {"replicated": 0.1, "search 2": 0.5}.get(n, 2.0) for n in runners}

    monkeypatch.setattr(verify, "alternate", alternate)
    checked = plan.verify(repeat=1)
    assert checked.fastest_measured() is checked.get("search 2")
    text = str(checked)
    assert "measured fastest here: search 2 ran 4.00× as fast" in text
    assert "measured fastest here: replicated" not in text
    assert checked.tune(repeat=1).chosen_name == "search 2"
    assert plan.fastest_measured() is None  # nothing measured yet


def test_untuned_plans_still_choose_the_search_and_say_so():
    _, _, plan = _plan()
    out = plan.to_json()
    assert out["chosen"] == "search" and out["tuned"] is False
    assert "chosen: the search's plan, predicted" in str(plan)


def test_cli_tune_measures_every_plan_and_chooses_the_fastest():
    r = runner.invoke(app, ["plan", "--model", "mlp", "--batch", "64", "--hidden", "32",
                            "--ffn", "64", "--mesh", "data=2,model=4", "--profile", "cpu-2core",
                            "--top", "2", "--tune", "--repeat", "1", "--json"])  # fmt: skip
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["tuned"] is True and "spearman" in out
    measured = {p["name"]: p["verified"]["seconds"] for p in out["plans"]}
    assert out["chosen"] == min(measured, key=measured.__getitem__)


def test_cli_tune_says_what_it_chose_and_shows_that_plan(monkeypatch):
    _fake(monkeypatch, "fsdp")  # (data-parallel is the search's plan: timed as one program)
    r = runner.invoke(app, ["plan", "--model", "mlp", "--batch", "64", "--hidden", "32",
                            "--ffn", "64", "--mesh", "data=2,model=4", "--profile", "cpu-2core",
                            "--top", "1", "--tune", "--repeat", "1", "-q"],
                      env={"COLUMNS": "200"})  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "chosen: fsdp, the plan that ran fastest when tuned" in r.output
    assert "plan 'fsdp' op by op" in r.output


@pytest.mark.parametrize(
    "argv, message",
    [
        (["plan", "ij,jk->ik", "--shapes", "64x32,32x16", "--mesh", "x=8", "--tune"],
         "--tune chooses among a program's plans"),
        (["plan", "--model", "mlp", "--sweep-batch", "64,128", "--mesh", "x=8",
          "--profile", "cpu-2core", "--tune"], "does not take --tune"),
    ],
)  # fmt: skip
def test_cli_tune_is_refused_where_there_are_no_program_plans_to_choose(argv, message):
    r = runner.invoke(app, argv)
    assert r.exit_code == 2 and message in r.output, r.output
