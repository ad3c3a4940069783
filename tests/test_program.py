"""The program planner: the graph it reads, its search against brute force, its baselines and
plans against compiled HLO, and its results against the unsharded function."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import shardwise
from helpers import brute_force, persistent_cache
from shardwise._model.mesh import MeshSpec
from shardwise._model.profile import BUILTIN
from shardwise._program import verify as verify_module
from shardwise._program.graph import build
from shardwise._program.integer import milp as _milp
from shardwise._program.models import loss_of, mlp, model
from shardwise._program.pricing import build_problem
from shardwise._program.problem import effective_mesh, total
from shardwise._program.program import train_step
from shardwise._program.search import solve
from shardwise._program.verify import same_programs
from shardwise._xla.verified import by_kind
from shardwise.cli import app

S = jax.ShapeDtypeStruct
CPU = BUILTIN["cpu-2core"]
runner = CliRunner()


def _mlp_args(batch=64, hidden=32, ffn=64):
    fn, args = model("mlp", batch=batch, hidden=hidden, ffn=ffn)
    return fn, args


def _residual(x, params):
    return x + jnp.tanh(x @ params["w1"]) @ params["w2"]


def test_graph_counts_ops_of_an_mlp_and_its_training_step():
    fn, args = _mlp_args()
    g = build(fn, args)
    assert [(s.kind, s.op.equation) for s in g.steps] == [("dot", "ab,bc->ac")] * 2
    assert g.names == ("x", "params['w1']", "params['w2']")
    # x, w1, w2, the hidden layer (the dot's result joined with relu's), the output
    assert len(set(g.classes)) == 5
    step = train_step(loss_of(mlp))
    t = build(step, [args[1], args[0], args[0]])
    kinds = [(s.kind, s.prim) for s in t.steps]
    # forward: 2 dots; backward: dW2, dh, dW1 (x is not differentiated) and two transposes;
    # the loss's sum to a scalar is a reduction
    assert kinds.count(("dot", "dot_general")) == 5
    assert kinds.count(("map", "transpose")) == 2
    assert ("map", "reduce_sum") in kinds


def test_a_scan_is_read_once_whatever_its_length():
    sizes = []
    for layers in (1, 8):
        fn, args = model("transformer", batch=2, seq=8, hidden=16, ffn=32, heads=2, layers=layers)
        g = build(fn, args)
        sizes.append((len(g.steps), len(g.values)))
        assert all(s.repeat == layers for s in g.steps if s.kind == "dot")
    assert sizes[0] == sizes[1]


def test_one_dot_plans_like_plan_einsum():
    x, w = S((64, 32), "float32"), S((32, 16), "float32")
    p = shardwise.plan(lambda x, w: x @ w, x, w, mesh="x=2,y=4", profile=CPU, top=1)
    e = shardwise.plan_einsum("ab,bc->ac", [(64, 32), (32, 16)], mesh="x=2,y=4", profile=CPU)
    assert p.chosen.predicted.seconds == pytest.approx(e.best.predicted.seconds)


@pytest.mark.parametrize("fn", [mlp, _residual], ids=["chain", "cycle"])
def test_search_finds_the_brute_force_optimum(fn):
    args = (S((8, 4), "float32"), {"w1": S((4, 4), "float32"), "w2": S((4, 4), "float32")})
    g = build(fn, args)
    problem = build_problem(g, effective_mesh(MeshSpec.parse("x=2")), CPU)
    _, best = brute_force(problem)
    assert solve(problem).seconds == pytest.approx(best)
    found = _milp(problem, [], [], 60)
    assert found is not None and total(problem, found[0]) == pytest.approx(best)


@pytest.mark.parametrize("seed", range(12))
def test_search_equals_brute_force_on_random_problems(seed):
    """Random graphs with cycles, tied costs (integers from a small range), variables with
    one choice (pinned inputs) and dominated choices: elimination, pruning and the integer
    program together must find the exhaustive optimum, and leave the problem's costs as they
    were (elimination reads the edges without copying them)."""
    from shardwise._program.problem import Problem

    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 7))
    sizes = [int(rng.integers(1, 5)) for _ in range(n)]
    unary = [rng.integers(0, 4, k).astype(float) for k in sizes]
    edges = {}
    for u in range(n):
        for v in range(u + 1, n):
            if rng.random() < 0.6:
                edges[(u, v)] = rng.integers(0, 4, (sizes[u], sizes[v])).astype(float)
    for m in [*unary, *edges.values()]:  # read-only, as the planner's are (steps alike
        m.flags.writeable = False  # share them): the search must not write them
    problem = Problem.of([list(range(k)) for k in sizes], unary, edges)
    _, best = brute_force(problem)
    found = solve(problem)
    assert found is not None and found.seconds == pytest.approx(best)
    assert total(problem, found.choice) == pytest.approx(best)


def _check_against_numpy(plan, name, fn, args, tol=2e-5):
    rng = np.random.default_rng(1)
    leaves = [rng.standard_normal(a.shape).astype(a.dtype) for a in jax.tree.leaves(args)]
    real = jax.tree.unflatten(jax.tree.structure(args), leaves)
    got = plan.sharded(name)(*real)
    want = jax.jit(fn)(*real)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tol, atol=tol)


@pytest.mark.parametrize("mesh", ["devices=8", "data=2,model=4", "data=4,model=2"])
def test_baselines_and_search_match_compiled_hlo_and_numpy(mesh):
    fn, args = _mlp_args()
    plan = shardwise.plan(fn, *args, mesh=mesh, profile=CPU, top=1)
    names = {p.name for p in plan.plans}
    assert {"search", "replicated", "data-parallel", "fsdp", "megatron"} <= names
    checked = plan.verify(repeat=1)
    for p in checked.plans:
        _check_against_numpy(plan, p.name, fn, args)
    # every plan's predicted collectives equal the compiled program's, kind by kind
    wrong = [
        (p.name, by_kind(p.predicted.collectives),
         by_kind(p.verified.collectives)) for p in checked.plans if not p.verified.collectives_match
    ]  # fmt: skip
    assert wrong == []
    # and each compiled collective carries the op and the user's line it was predicted for
    assert [p.name for p in checked.plans if not p.verified.sources_match] == []


def test_verify_compiles_and_times_a_plan_that_is_another_once(monkeypatch):
    fn, args = _mlp_args()
    plan = shardwise.plan(fn, *args, mesh="devices=8", profile=CPU, top=1)
    # the search splits the batch: data-parallel is the same program
    assert same_programs(plan.plans) == {"data-parallel": "search"}
    megatron, search = plan.get("megatron"), plan.get("search")
    # the same inputs' layouts and prediction are not enough: the layouts within differ
    alike_inputs = dataclasses.replace(
        megatron, in_specs=search.in_specs, predicted=search.predicted
    )
    assert same_programs([search, alike_inputs]) == {}
    # nor the same layouts, where the collectives predicted for them differ
    sums = megatron.predicted.collectives
    other_sums = dataclasses.replace(
        search, name="other", predicted=dataclasses.replace(search.predicted, collectives=sums)
    )
    assert sums and same_programs([search, other_sums]) == {}
    assert same_programs([search, dataclasses.replace(search, name="twin")]) == {"twin": "search"}
    compiled = []
    real = verify_module.compile_program

    def counted(p, item, *rest):
        compiled.append(item.name)
        return real(p, item, *rest)

    monkeypatch.setattr(verify_module, "compile_program", counted)
    checked = plan.verify(repeat=1)
    assert sorted(compiled) == sorted(p.name for p in plan.plans if p.name != "data-parallel")
    # the twin gets what the one program did: its collectives, memory and time
    assert checked.get("data-parallel").verified is checked.get("search").verified
    rows = {p["name"]: p for p in checked.to_json()["plans"]}
    assert rows["data-parallel"]["same_program_as"] == "search"
    assert all("same_program_as" not in p for n, p in rows.items() if n != "data-parallel")
    assert "data-parallel</a><br><small>the same program as search" in checked.to_html()
    assert checked.chosen_vs_fastest is not None


@contextlib.contextmanager
def _compiles():
    """How many programs XLA compiles inside the block."""
    found = []

    def listen(name, seconds, **kwargs):
        if name.endswith("backend_compile_duration"):
            found.append(name)

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        yield found
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)


def test_planned_programs_sum_every_contraction_they_split_and_the_guard_compiles_nothing():
    from shardwise._program.guard import plan_dots
    from shardwise._xla.check import dot_problems

    fn, args = _mlp_args()
    plan = shardwise.plan(fn, *args, mesh="data=2,model=4", profile=CPU, top=1)
    megatron = plan.get("megatron")
    dots = list(plan_dots(plan, megatron))
    # column-parallel, then row-parallel: the second dot's contracted index is split
    assert [(d.what, d.terms, d.axes) for d in dots] == [
        ("'ab,bc->ac'", 32, ()), ("'ab,bc->ac'", 64, ("data", "model"))
    ]  # fmt: skip
    real = [np.ones(a.shape, a.dtype) for a in jax.tree.leaves(args)]
    real = jax.tree.unflatten(jax.tree.structure(args), real)
    run = plan.sharded("megatron")
    with _compiles() as compiled:
        run(*real)  # checked as it is compiled: one compile, the one jax.jit needs anyway
        run(*real)
    assert len(compiled) == 1
    text = run.lower(*real).compile().as_text()
    assert dot_problems(text, dots, plan.mesh.shape) == ()


def test_a_planned_program_that_leaves_out_a_sum_is_refused(monkeypatch):
    """As if XLA had dropped the all-reduces: ``verify`` and the program's first call
    refuse it, naming the plan, the dot and the axes, and the plans to run instead."""
    fn, args = _mlp_args()
    plan = shardwise.plan(fn, *args, mesh="data=2,model=4", profile=CPU, top=1)
    text = jax.stages.Compiled.as_text
    cut = re.compile(r"all-reduce\((%[\w.\-]+)\)[^\n]*")
    monkeypatch.setattr(jax.stages.Compiled, "as_text", lambda c: cut.sub(r"copy(\1)", text(c)))
    real = jax.tree.map(lambda a: np.ones(a.shape, a.dtype), args)
    with pytest.raises(shardwise.MiscompileError) as info:
        plan.sharded("megatron")(*real)
    said = str(info.value)
    assert said.startswith("plan 'megatron' of mlp on mesh data=2,model=4: "), said
    second = f"models.py:{inspect.getsourcelines(mlp)[1] + 3}"  # mlp's ``h @ params["w2"]``
    assert f"the contraction ('ab,bc->ac') at {second} is split 8 ways" in said, said
    assert "over mesh axes `data`, `model`" in said and "'search'" in said, said
    with pytest.raises(shardwise.MiscompileError, match=rf"at {re.escape(second)}"):
        plan.verify(repeat=1)


def _tanh_mlp(x, w1, w2):
    return jnp.tanh(x @ w1) @ w2


def _tanh_mlp_again(x, w1, w2):  # (the same program at other lines, as if moved by an edit)
    return jnp.tanh(x @ w1) @ w2


_tanh_mlp_again.__name__ = _tanh_mlp.__name__  # (the compiled program is named after it)


def test_a_planned_program_from_the_persistent_cache_is_checked_at_its_own_lines(
    tmp_path, monkeypatch
):
    """JAX's persistent compilation cache gives the same program written elsewhere with the
    lines of where it was compiled first; the guard of ``sharded`` and of ``verify`` reads the
    program with its own lines (else it would match none of its dots and check nothing)."""
    from shardwise._program import guard
    from shardwise._xla import flow

    x, w1, w2 = (np.ones(s, np.float32) for s in [(64, 32), (32, 64), (64, 32)])
    read = []
    checked = guard.dot_problems
    monkeypatch.setattr(
        guard, "dot_problems", lambda text, *a: read.append(text) or checked(text, *a)
    )

    def lines(text):
        return {c.source.split(":")[-1] for c in flow.contractions(flow.parse(text))}

    def own(fn):
        first = inspect.getsourcelines(fn)[1]
        return {str(first + 1)}  # (both dots are on the line after the def)

    with persistent_cache(tmp_path):
        first = shardwise.plan(_tanh_mlp, x, w1, w2, mesh="data=2,model=4", profile=CPU, top=1)
        first.sharded("megatron")(x, w1, w2)
        plan = shardwise.plan(_tanh_mlp_again, x, w1, w2, mesh="data=2,model=4", profile=CPU, top=1)
        run = plan.sharded("megatron")
        assert lines(run.lower(x, w1, w2).compile().as_text()) == own(_tanh_mlp)  # the cache's
        read.clear()
        np.testing.assert_allclose(run(x, w1, w2), _tanh_mlp(x, w1, w2), rtol=1e-5)
        assert [lines(t) for t in read] == [own(_tanh_mlp_again)]
        read.clear()
        done = plan.verify(repeat=1)
        assert read and all(lines(t) == own(_tanh_mlp_again) for t in read)
        said = {c.source.split()[0].rsplit(":", 1)[-1] for p in done.plans if p.verified
                for c in p.verified.collectives if c.source}  # fmt: skip
        assert said and said <= own(_tanh_mlp_again), said  # (the report's lines too)


def _cond_then_dot(x, w1, w2, p):  # (the branch's dot and the dot after it on one line)
    return jax.lax.cond(p, lambda: jnp.tanh(x @ w1), lambda: jax.nn.relu(x @ w1)) @ w2


def _attention_loss(p, x):
    b, t, d = x.shape
    q = (x @ p["wq"]).reshape(b, t, 4, d // 4)
    k = (x @ p["wk"]).reshape(b, t, 4, d // 4)
    v = (x @ p["wv"]).reshape(b, t, 4, d // 4)
    s = jnp.einsum("bthd,bshd->bhts", q, k)
    a = jnp.einsum("bhts,bshd->bthd", jax.nn.softmax(s), v)
    return jnp.mean((x + a.reshape(b, t, d) @ p["wo"]) ** 2)


def test_the_guard_refuses_no_correct_program_it_misreads():
    """Two programs that XLA compiles right and the guard had refused, every plan of them: a
    ``cond`` whose branch's dot shares a line with a dot twice its size (read as that dot split
    in two), and an attention training step whose batched products XLA fuses with a reshape
    and gives the reshape's line, a projection's (read as the projection split four ways)."""
    rng = np.random.default_rng(0)
    x, w1, w2 = (rng.standard_normal(s).astype(np.float32) for s in ((16, 32), (32, 64), (64, 32)))
    args = (x, w1, w2, np.bool_(True))
    plan = shardwise.plan(_cond_then_dot, *args, mesh="data=2,model=4", profile=CPU, top=1)
    for name in ("search", "replicated"):
        got = plan.sharded(name)(*args)
        np.testing.assert_allclose(got, jax.jit(_cond_then_dot)(*args), rtol=1e-5, atol=1e-5)
    params = {k: 0.2 * rng.standard_normal((32, 32)).astype(np.float32) for k in "qkvo"}
    params = {f"w{k}": w for k, w in params.items()}
    x = 0.2 * rng.standard_normal((4, 8, 32)).astype(np.float32)
    plan = shardwise.plan(_attention_loss, params, x, mesh="data=2,model=4", profile=CPU,
                          train=True, top=2)  # fmt: skip
    want = jax.jit(train_step(_attention_loss))(params, x)
    for p in plan.plans:
        got = plan.sharded(p.name)(params, x)
        for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6)


def test_megatron_is_column_then_row_parallel():
    fn, args = _mlp_args(hidden=64, ffn=256)
    plan = shardwise.plan(fn, *args, mesh="model=8", profile=CPU, top=1)
    mega = plan.get("megatron")
    assert [s.describe() for s in mega.in_specs] == ["replicated", "-,model", "model"]
    assert [c.kind for c in mega.predicted.collectives] == ["all-reduce"]


def test_a_budget_that_forbids_replicated_weights_rediscovers_megatron():
    loss, args = model("mlp", batch=8, hidden=256, ffn=1024, train=True)
    weights = 2 * 256 * 1024 * 4  # replicated, a training step holds them three times over
    plan = shardwise.plan(loss, *args, mesh="model=8", profile=CPU, budget=weights, train=True)
    chosen = plan.chosen
    assert chosen.predicted.memory_bytes <= weights
    replicated = plan.get("replicated")  # shown to compare, marked
    assert replicated.over_budget and replicated.predicted.memory_bytes > weights
    assert [s.describe() for s in chosen.in_specs[:2]] == ["-,model", "model"]
    assert chosen.in_specs[:2] == plan.get("megatron").in_specs[:2]


def test_every_plan_returned_fits_the_budget_or_is_a_baseline_marked_over_it():
    fn, args = model("mlp", batch=256, hidden=1024, ffn=4096)  # the command line's defaults
    # 4 of 12 plans, runners-up and baselines, were over such a budget, unmarked (it was
    # 7016284 until the memory model counted a dot's partial sums and arguments' copies on CPU)
    budget = 12_000_000
    plan = shardwise.plan(fn, *args, mesh="x=2,y=4", profile=CPU, budget=budget, top=10)
    searched = [p for p in plan.plans if p.name.startswith("search")]
    assert len(searched) == 10
    assert all(p.predicted.memory_bytes <= budget for p in searched)
    for p in plan.plans:
        assert p.over_budget is (p.predicted.memory_bytes > budget), p.name
    over = [p.name for p in plan.plans if p.over_budget]
    assert set(over) == {"replicated", "data-parallel", "data×tensor"}
    assert plan.budget == budget and not plan.chosen.over_budget
    out = plan.to_json()
    assert out["budget_bytes"] == budget
    assert [p["name"] for p in out["plans"] if p["over_budget"]] == over
    text = " ".join(str(plan).split())
    assert f"over budget {', '.join(over)}: predicted to need more than the budget" in text
    assert "(over budget)" in plan.to_html()
    free = shardwise.plan(fn, *args, mesh="x=2,y=4", profile=CPU, top=1)
    assert free.budget is None and not any(p.over_budget for p in free.plans)
    assert free.to_json()["budget_bytes"] is None


def test_under_a_budget_the_time_limit_bounds_the_runners_up_search(monkeypatch):
    """Under a budget each runner-up is an integer program of its own: they share the time
    limit (each gets what is left of it, none starts past it), and a search cut short says
    so. Each had had the whole limit: Llama-3 8B's AdamW step on 8 v5p chips planned for
    more than 15 minutes."""
    from shardwise._program import top

    fn, args = model("mlp", batch=256, hidden=1024, ffn=4096)
    given: list[float] = []
    solve_within = top.solve_within

    def recorded(problem, constraints, exclude, time_limit, *unbounded):
        if exclude or not given:  # (the search's; the baselines' exclude none)
            given.append(time_limit)
        return solve_within(problem, constraints, exclude, time_limit, *unbounded)

    monkeypatch.setattr(top, "solve_within", recorded)
    kw = {"mesh": "x=2,y=4", "profile": CPU, "budget": 12_000_000, "top": 4}
    plan = shardwise.plan(fn, *args, time_limit=3600.0, **kw)
    searched = [p for p in plan.plans if p.searched]
    assert len(searched) == 4 and "cut short" not in plan.method
    assert given[0] == 3600.0 and len(given) >= 4
    assert all(0 < t < 3600.0 for t in given[1:])  # (what is left, less each time)
    assert given[1:] == sorted(given[1:], reverse=True)
    given.clear()
    cut = shardwise.plan(fn, *args, time_limit=0.0, **kw)
    assert len(given) == 1  # the first plan is searched for whatever the limit; no other
    assert [p.name for p in cut.plans if p.searched] == ["search"]
    assert cut.method.endswith("runners-up cut short by the time limit (0 s)")
    assert cut.chosen.in_specs == plan.chosen.in_specs


def test_the_profiles_memory_is_the_default_budget_and_none_fitting_is_said(monkeypatch):
    """With no budget given, a profile's memory per device bounds the plan: the fastest plan
    where it fits, else the fastest that fits; where none does, the fastest, with
    ``over_memory`` saying so (never an error: the budget was not asked for)."""
    loss, args = model("mlp", batch=512, hidden=256, ffn=1024, train=True)
    kw = {"mesh": "data=8", "train": True, "top": 1}
    free = shardwise.plan(loss, *args, profile=CPU, **kw)  # cpu-2core gives no memory
    assert free.budget is None and free.over_memory is None
    fastest = free.chosen.predicted.memory_bytes
    smallest = min(p.predicted.memory_bytes for p in free.plans)  # FSDP's
    assert smallest < fastest, [(p.name, p.predicted.memory_bytes) for p in free.plans]
    memory = (smallest + fastest) // 2  # binds the fastest plan; a smaller one fits
    small = dataclasses.replace(BUILTIN["cpu-2core"], memory_bytes=memory)
    within = shardwise.plan(loss, *args, profile=small, **kw)
    assert within.budget == memory and within.over_memory is None
    assert within.chosen.predicted.memory_bytes <= memory
    asked = shardwise.plan(loss, *args, profile=small, budget=memory, **kw)
    assert within.chosen.in_specs == asked.chosen.in_specs
    # the plan within the device's memory starts from the search's plan without it, not
    # solving that again (Llama-3 8B's AdamW step on 8 v5p chips: 9 s)
    from shardwise._program import top
    from shardwise._program import within as within_module

    solved: list[int] = []  # each problem solved without constraints

    def counted(problem, constraints=(), exclude=(), time_limit=60.0):
        if not constraints and not exclude:
            solved.append(id(problem))
        return solve(problem, constraints, exclude, time_limit)

    monkeypatch.setattr(top, "solve", counted)
    monkeypatch.setattr(within_module, "solve", counted)
    again = shardwise.plan(loss, *args, profile=small, **kw)
    assert again.chosen.in_specs == within.chosen.in_specs and again.method == within.method
    assert solved and len(solved) == len(set(solved))
    roomy = dataclasses.replace(small, memory_bytes=2**40)
    assert shardwise.plan(loss, *args, profile=roomy, **kw).chosen.in_specs == free.chosen.in_specs
    # where the fastest fits, a baseline that does not is still marked (it had been shown
    # unmarked, 131 GiB on a 95 GiB chip, whenever the search's plan fitted)
    largest = max(p.predicted.memory_bytes for p in free.plans)
    assert largest > fastest
    snug = shardwise.plan(loss, *args, profile=dataclasses.replace(small, memory_bytes=fastest),
                          **kw)  # fmt: skip
    assert snug.budget == fastest and not snug.chosen.over_budget
    assert [p.over_budget for p in snug.plans] == [
        p.predicted.memory_bytes > fastest for p in snug.plans
    ] and any(p.over_budget for p in snug.plans)
    tiny = dataclasses.replace(small, memory_bytes=1024)
    over = shardwise.plan(loss, *args, profile=tiny, **kw)
    assert over.chosen.in_specs == free.chosen.in_specs and over.budget == 1024
    # every plan is marked over it, as where one fits (they had all read "not over budget",
    # and --json's budget_bytes null, beside plans of 1.6 TiB)
    assert all(p.over_budget for p in over.plans) and over.to_json()["budget_bytes"] == 1024
    checked = over.verify(repeat=1)  # (every plan runs, as none fits: it had run none)
    assert all(p.verified is not None for p in checked.plans)
    assert checked.fastest_measured() is not None
    assert over.over_memory is not None and "fits in 1.0 KiB" in over.over_memory
    assert "cpu-2core profile's memory" in over.over_memory
    assert "over memory:" in " ".join(str(over).split())
    assert over.to_json()["over_memory"] == over.over_memory
    unbounded = shardwise.plan(loss, *args, profile=tiny, budget=None, **kw)
    assert unbounded.over_memory is None and unbounded.budget is None


def test_where_the_search_finds_no_plan_within_the_budget_a_baseline_that_fits_is_chosen(
    monkeypatch,
):
    """The integer program's memory rows count the fullest points' arrays, not every buffer:
    a plan within them can be over the budget by its peak and is set aside. Where the search
    then finds none (here: allowed no second try) but a baseline fits, that baseline's plan is
    the search's, not an error (FSDP fit in half the budget where a Llama's AdamW step on a
    TPU was refused)."""
    from shardwise._program import top

    loss, args = model("mlp", batch=512, hidden=256, ffn=1024, train=True)
    kw = {"mesh": "data=8", "profile": CPU, "train": True, "top": 1}
    free = shardwise.plan(loss, *args, **kw)
    fsdp = free.get("fsdp").predicted.memory_bytes
    assert fsdp < free.chosen.predicted.memory_bytes
    monkeypatch.setattr(top, "TRIES_PAST_TOP", 0)
    plan = shardwise.plan(loss, *args, budget=fsdp, **kw)
    assert plan.chosen.name == "search" and not plan.optimal
    assert plan.chosen.in_specs == plan.get("fsdp").in_specs
    assert plan.chosen.predicted.memory_bytes <= fsdp and "fsdp's plan" in plan.method


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 7), st.integers(1, 7), st.data())
def test_unique_rows_of_an_edge_are_numpys(rows, cols, data):
    """Whatever an edge's costs (repeated rows and columns, ties, infinities, -0.0, NaN): the
    same groups, in the same order, as ``np.unique``, so the integer program is the one it
    was."""
    from shardwise._program.integer import _unique_rows

    values = st.sampled_from([0.0, -0.0, 1.0, 2.5, 1e-9, np.inf, -np.inf, np.nan])
    m = np.array(data.draw(st.lists(st.lists(values, min_size=cols, max_size=cols),
                                    min_size=rows, max_size=rows)))  # fmt: skip
    got, of = _unique_rows(m)
    want, want_of = np.unique(m, axis=0, return_inverse=True)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert np.array_equal(got, want, equal_nan=True) and of.tolist() == want_of.ravel().tolist()


def test_memory_rows_no_plan_can_keep_are_infeasible_without_a_search():
    from shardwise._program.integer import Constraint
    from shardwise._program.within import least, solve_within

    row = Constraint(((0, 0, 8.0), (0, 1, 2.0), (1, 0, 5.0)), 6.0)
    assert least(row) == 7.0  # 2 (variable 0's smallest) + 5
    args = (S((8, 4), "float32"), {"w1": S((4, 4), "float32"), "w2": S((4, 4), "float32")})
    problem = build_problem(build(mlp, args), effective_mesh(MeshSpec.parse("x=2")), CPU)
    assert solve_within(problem, [row], [], 1.0) is None
    assert solve_within(problem, [dataclasses.replace(row, limit=7.0)], [], 1.0) is not None


def test_memory_priced_into_the_costs_finds_the_plan_the_rows_allow_without_branch_and_bound():
    """Where the cheapest plan breaks the memory rows, memory priced into each choice's cost
    (a Lagrangian relaxation) finds a plan that keeps them by dynamic programming alone: here
    the integer program's optimum, one variable made smaller, not the two a higher price
    gives."""
    from shardwise._program.integer import Constraint
    from shardwise._program.problem import Problem
    from shardwise._program.search import solve
    from shardwise._program.within import priced, solve_within

    costs = [np.array([1.0, 2.0]), np.array([1.0, 3.0]), np.array([1.0, 1.5])]
    problem = Problem.of([("A", "B")] * 3, costs, {})
    row = Constraint(tuple((v, k, (10.0, 1.0)[k]) for v in range(3) for k in range(2)), 21.0)
    exact = solve(problem, [row], [], 1.0)
    assert exact is not None and exact.choice == (0, 0, 1) and exact.seconds == 3.5
    got = solve_within(problem, [row], [], 1.0)
    assert got is not None and got.choice == exact.choice and got.seconds == 3.5
    assert not got.optimal and "memory priced in" in got.method
    free = solve(problem)
    assert free is not None and free.choice == (0, 0, 0)  # (30 bytes at the row: over it)
    assert priced(problem, [dataclasses.replace(row, limit=2.0)], free, 1.0) is None


def test_the_cli_says_when_no_plan_fits_the_profiles_memory():
    """A model no plan of which fits a v5e's 16 GB on two chips: planned all the same, the
    fastest plan shown, a line saying none fits, ``over_memory`` in the JSON; exit 0 (no
    budget was asked for; ``--device-memory`` makes it an error)."""
    args = ["plan", "--model", "mlp", "--batch", "64", "--hidden", "16384", "--ffn", "262144",
            "--mesh", "x=2", "--profile", "tpu-v5e", "--top", "1"]  # fmt: skip
    shown = runner.invoke(app, args)
    assert shown.exit_code == 0, shown.output
    said = " ".join(shown.output.split())
    assert "over memory: no plan of" in said and "tpu-v5e profile's memory" in said, said
    doc = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    assert "tpu-v5e profile's memory" in doc["over_memory"]
    asked = runner.invoke(app, [*args, "--device-memory", "16GB"])
    assert asked.exit_code == 2 and "Traceback" not in asked.output, asked.output


@pytest.mark.parametrize("budget", [0, -1, float("nan"), float("inf"), True, "garbage", 2**63])
def test_plan_reads_its_budget_as_plan_einsum_does(budget):
    fn, args = _mlp_args()
    with pytest.raises(shardwise.ArgumentError, match="budget"):  # 0 and nan were ignored
        shardwise.plan(fn, *args, mesh="x=8", profile=CPU, budget=budget, top=1)


def test_plan_takes_a_budget_as_text():
    fn, args = _mlp_args()
    given = shardwise.plan(fn, *args, mesh="x=8", profile=CPU, budget="64KiB", top=1)
    assert given.budget == 65536 and given.to_json()["budget_bytes"] == 65536


def test_a_budget_no_plan_fits_names_the_smallest_plan_and_the_budget():
    fn, args = _mlp_args()
    free = shardwise.plan(fn, *args, mesh="x=8", profile=CPU, top=1)
    smallest = min(p.predicted.memory_bytes for p in free.plans)
    with pytest.raises(shardwise.ArgumentError) as e:
        shardwise.plan(fn, *args, mesh="x=8", profile=CPU, budget="1KiB", top=1)
    said = str(e.value)
    assert "fits in 1.0 KiB (1,024 bytes) per device on mesh x=8" in said, said
    assert f"({smallest:,} bytes)" in said and "--device-memory" in said, said
    r = runner.invoke(app, ["plan", "--model", "mlp", "--batch", "64", "--hidden", "32",
                            "--ffn", "64", "--mesh", "x=8", "--profile", "cpu-2core",
                            "--device-memory", "1KiB"])  # fmt: skip
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert f"({smallest:,} bytes)" in " ".join(r.output.split()), r.output


def test_training_step_plans_run_and_equal_the_unsharded_step():
    loss, args = model("mlp", batch=32, hidden=16, ffn=32, train=True)
    plan = shardwise.plan(loss, *args, mesh="data=2,model=4", profile=CPU, train=True, top=2)
    step = train_step(loss)
    for name in ("search", "megatron", "data-parallel"):
        _check_against_numpy(plan, name, step, args)


def test_fixed_pins_an_input_and_bad_names_are_refused():
    fn, args = _mlp_args(batch=6)
    plan = shardwise.plan(fn, *args, mesh="data=2,model=4", profile=CPU, fixed={"x": "data"})
    assert plan.chosen.in_specs[0].describe() == "data"
    with pytest.raises(shardwise.ArgumentError, match="the inputs are x, params"):
        shardwise.plan(fn, *args, mesh="data=2,model=4", profile=CPU, fixed={"y": "data"})
    with pytest.raises(shardwise.IndivisibleError):
        shardwise.plan(fn, *args, mesh="data=2,model=4", profile=CPU, fixed={"x": "model"})


def test_a_pin_whose_axes_are_out_of_the_meshs_order_says_so_not_that_it_does_not_divide():
    """(model,data) on a data=2,model=4 mesh divides a (64, 256) weight 8 ways, but plans order
    the axes of a dimension as the mesh does: it had been refused as "does not divide"."""
    f = lambda x, w: x @ w  # noqa: E731
    args = (S((32, 64), "float32"), S((64, 256), "float32"))
    p = shardwise.plan(f, *args, mesh="data=2,model=4", profile=CPU, top=1,
                       fixed={"w": "(data,model)"})  # fmt: skip
    assert p.chosen.in_specs[1].describe() == "(data,model)"
    with pytest.raises(shardwise.SpecError, match=r"another order than the mesh's axes "
                       r"\(data, model\).*Write \(data,model\)"):  # fmt: skip
        shardwise.plan(f, *args, mesh="data=2,model=4", profile=CPU, fixed={"w": "(model,data)"})


def test_a_pin_that_names_an_axis_of_size_1_plans_every_baseline():
    """An axis of size 1 splits nothing and the baselines plan on the mesh without it: a data
    input pinned to (model,one) had crashed them with KeyError: 'one'."""
    f = lambda x, w: jnp.tanh(x @ w)  # noqa: E731
    args = (S((64, 32), "float32"), S((32, 16), "float32"))
    p = shardwise.plan(f, *args, mesh="one=1,model=8", profile=CPU, top=1,
                       fixed={"x": "(model,one),-"})  # fmt: skip
    assert p.chosen.in_specs[0].describe() == "model"
    assert {"data-parallel", "fsdp", "megatron"} <= {q.name for q in p.plans}


def test_two_pins_of_inputs_laid_out_as_one_must_agree():
    """A weight and its AdamW moment, which the update reads together, are one layout: pinned
    apart (ZeRO-1 on a float32 step), the moment's pin had been dropped silently while
    ``pinned`` listed both; now that is refused, and pins that agree are kept."""
    optax = pytest.importorskip("optax")
    opt = optax.adamw(1e-2)

    def step(p, s, x):
        g = jax.grad(lambda p: jnp.mean(jax.nn.relu(x @ p["w1"]) @ p["w2"]))(p)
        u, s = opt.update(g, s, p)
        return optax.apply_updates(p, u), s

    params = {"w1": S((64, 128), "float32"), "w2": S((128, 64), "float32")}
    args = (params, jax.eval_shape(opt.init, params), S((32, 64), "float32"))
    plan = functools.partial(shardwise.plan, step, *args, mesh="data=2,model=4",
                             profile="cpu-2core", top=1)  # fmt: skip
    with pytest.raises(shardwise.SpecError, match=r"p\['w1'\] \(replicated\) and s\[0\]"):
        plan(fixed={"p['w1']": "-", "s[0].mu['w1']": "data"})
    p = plan(fixed={"p['w1']": "data", "s[0].mu['w1']": "data"})
    assert str(p.in_specs[0]["w1"]) == str(p.in_specs[1][0].mu["w1"]) == "P('data',)"


def test_baselines_pin_inputs_laid_out_as_one_without_refusing_them():
    """A bias added to the batch shares its class with it: data-parallel pins the batch on
    ``data`` and the bias whole, and the check that pins of one class agree (for pins a user
    gives) had skipped data-parallel and FSDP, telling the user to pin them alike."""

    def f(p, x):
        return jnp.tanh((x + p["bias"]) @ p["w"]).sum()

    params = {"bias": S((32, 64), "float32"), "w": S((64, 64), "float32")}
    p = shardwise.plan(f, params, S((32, 64), "float32"), mesh="data=4", profile="cpu-2core")
    assert {"data-parallel", "fsdp"} <= {q.name for q in p.plans}, p.skipped


def test_fixed_takes_an_inputs_path_with_dots_as_args_writes_it():
    fn, args = _mlp_args(batch=6)
    plan = shardwise.plan(fn, *args, mesh="data=2,model=4", profile=CPU,
                          fixed={"params.w1": "-,model"})  # fmt: skip
    assert plan.chosen.in_specs[1].describe() == "-,model"  # (x, params['w1'], …)
    with pytest.raises(shardwise.ArgumentError, match=r"fixed names params\['w1'\] twice"):
        shardwise.plan(fn, *args, mesh="data=2,model=4", profile=CPU,
                       fixed={"params.w1": "-", "params['w1']": "-"})  # fmt: skip
    r = runner.invoke(app, ["plan", "--model", "mlp", "--batch", "64", "--hidden", "32",
                            "--ffn", "64", "--mesh", "data=2,model=4", "--profile", "cpu-2core",
                            "--fixed", "params.w1=-,model", "--json", "--top", "1"])  # fmt: skip
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    chosen = next(p for p in out["plans"] if p["name"] == out["chosen"])
    assert chosen["in_specs"][1]["w1"] == [None, "model"]


def test_cli_plan_model_json_keeps_the_contract():
    r = runner.invoke(app, ["plan", "--model", "mlp", "--batch", "64", "--hidden", "32",
                            "--ffn", "64", "--mesh", "data=2,model=4", "--profile", "cpu-2core",
                            "--json", "--top", "2"])  # fmt: skip
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    for key in ("program", "mesh", "profile", "train", "ops", "considered", "solve_seconds",
                "optimal", "chosen", "plans"):  # fmt: skip
        assert key in out
    assert out["mesh"] == {"data": 2, "model": 4} and out["chosen"] == "search"
    seconds = [p["predicted"]["seconds"] for p in out["plans"]]
    assert seconds == sorted(seconds)
    first = out["plans"][0]
    assert isinstance(first["in_specs"][1], dict) and set(first["in_specs"][1]) == {"w1", "w2"}


def test_cli_plan_function_reads_args(tmp_path):
    src = tmp_path / "prog.py"
    src.write_text("def f(x, w):\n    return (x @ w).sum(0)\n")
    r = runner.invoke(app, ["plan", "--function", f"{src}:f", "--args", "x=f32[64,32]",
                            "--args", "w=f32[32,16]", "--mesh", "x=8", "--profile", "cpu-2core",
                            "--top", "1"])  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "search" in r.output
    bad = runner.invoke(app, ["plan", "--function", f"{src}:f", "--args", "x=float[64]",
                              "--mesh", "x=8", "--profile", "cpu-2core"])  # fmt: skip
    assert bad.exit_code == 2 and "'float' is not a dtype (did you mean `float64`?)" in bad.output
    shapeless = runner.invoke(app, ["plan", "--function", f"{src}:f", "--args", "x=64",
                                    "--mesh", "x=8", "--profile", "cpu-2core"])  # fmt: skip
    assert shapeless.exit_code == 2 and "f32[256,1024]" in shapeless.output
    none = runner.invoke(app, ["plan", "--mesh", "x=8"])
    assert none.exit_code == 2 and "--model mlp" in none.output


def test_every_reshard_emits_exactly_the_predicted_collectives():
    """Each pair of layouts of a 2-D array on a 2×4 mesh, moved one step at a time."""
    from jax.sharding import NamedSharding

    from shardwise._model.reshard import reshard_collectives, reshard_moves
    from shardwise._program.problem import spec_choices
    from shardwise._xla.hlo import collectives
    from shardwise._xla.meshes import jax_mesh

    spec = MeshSpec.parse("x=2,y=4")
    mesh = jax_mesh(spec)
    shape = (16, 8)
    layouts = spec_choices(shape, spec)[1]
    wrong = []
    for a in layouts:
        for b in layouts:

            def move(x, a=a, b=b):
                for m in reshard_moves(a, b, 2):
                    x = jax.lax.with_sharding_constraint(
                        x, NamedSharding(mesh, m.spec.to_partition_spec())
                    )
                return x

            compiled = (
                jax.jit(move, in_shardings=NamedSharding(mesh, a.to_partition_spec()))
                .lower(S(shape, "float32"))
                .compile()
            )
            got = by_kind(collectives(compiled.as_text(), spec.shape))
            want = by_kind(reshard_collectives(a, b, shape, "float32", spec, CPU))
            if got != want:
                wrong.append((a.describe(), b.describe(), want, got))
    assert len(layouts) == 9 and wrong == []


@pytest.mark.slow
def test_transformer_plans_match_compiled_hlo_and_numpy():
    """Attention, LayerNorm (its mean broadcast along size-1 dimensions) and a scan over
    stacked layers: every plan's collectives are the compiled program's."""
    fn, args = model("transformer", batch=8, seq=8, hidden=32, ffn=64, heads=4, layers=2)
    plan = shardwise.plan(fn, *args, mesh="data=2,model=4", profile=CPU, top=2)
    checked = plan.verify(repeat=1)
    assert len(checked.plans) == 7
    wrong = [p.name for p in checked.plans if not p.verified.collectives_match]
    assert wrong == []
    assert [p.name for p in checked.plans if not p.verified.sources_match] == []
    # two blocks of LayerNorm, softmax and six contractions each, summed in another order
    # on each device: float32 rounding reaches about 1e-4 (a wrong block would be off by O(1))
    for name in ("search", "megatron", "data×tensor"):
        _check_against_numpy(plan, name, fn, args, tol=1e-3)


@pytest.mark.slow
def test_transformer_training_step_plans_match_compiled_hlo():
    """The backward pass: a reversed scan whose stacked gradients leave the loop split and are
    gathered after it, and stacks split along the layer dimension sliced inside it; each move
    is applied one step at a time, as predicted (the replicated baseline at these sizes moves
    stacks both ways; XLA had merged a two-step gather into one where a stack left the loop)."""
    loss, args = model(
        "transformer", batch=16, seq=64, hidden=256, ffn=1024, heads=8, layers=2, train=True
    )
    plan = shardwise.plan(loss, *args, mesh="data=2,model=4", profile=CPU, train=True, top=1)
    some = dataclasses.replace(plan, plans=(plan.get("replicated"), plan.get("fsdp")))
    checked = some.verify(repeat=1)
    assert [p.name for p in checked.plans if not p.verified.collectives_match] == []
    assert [p.name for p in checked.plans if not p.verified.sources_match] == []


def test_what_native_code_prints_while_solving_goes_to_stderr(capfd):
    """SciPy's HiGHS can print from branch and bound whatever its options say; a command's
    ``--json`` on stdout must stay JSON, so the solve's stdout, C's buffer included, goes to
    stderr."""
    import ctypes
    import os

    from shardwise._program.integer import stdout_to_stderr

    libc = ctypes.CDLL(None)
    print("before", flush=True)
    with stdout_to_stderr():
        libc.printf(b"tmpSolver.run();\n")  # buffered by C: a file is not a terminal
        os.write(1, b"raw\n")
    print("after", flush=True)
    out, err = capfd.readouterr()
    assert out == "before\nafter\n", out
    assert "tmpSolver.run();" in err and "raw" in err, err


@pytest.mark.parametrize(
    ("loss", "params", "words"),
    [
        (lambda w, x: (jnp.mean(x @ w), {"acc": jnp.mean(x)}), jnp.ones((16, 4)), "one scalar"),
        (lambda w, x: (x @ w).mean(0), jnp.ones((16, 4)), "one scalar"),
        (lambda p, x: jnp.mean(x @ p["w"]) * p["step"], {"w": jnp.ones((16, 4)),
                                                         "step": jnp.int32(1)},
         r"\['step'\] is int32"),
    ],
)  # fmt: skip
def test_a_training_step_of_what_is_not_a_loss_over_float_parameters_says_what_to_do(
    loss, params, words
):
    with pytest.raises(shardwise.ArgumentError, match=words) as caught:
        shardwise.plan(loss, params, jnp.ones((8, 16)), mesh="x=2", train=True)
    assert "without train" in str(caught.value)
    assert "cannot trace" not in str(caught.value)
    assert "Tracer" not in str(caught.value)  # (JAX's dump of every output leaf is left out)


def test_a_pure_callbacks_result_sent_to_every_device_is_predicted():
    """XLA runs a ``jax.pure_callback`` on one device and sums its result over the mesh so
    every device holds it: every plan predicts that all-reduce (none had, and verify found
    one more collective than predicted in every plan)."""

    def fn(w, x):  # type: ignore[no-untyped-def]
        h = x @ w
        return jax.pure_callback(np.tanh, jax.ShapeDtypeStruct(h.shape, h.dtype), h)

    w, x = np.ones((16, 12), np.float32), np.ones((8, 16), np.float32)
    plan = shardwise.plan(fn, w, x, mesh="data=2,model=4", profile="cpu-2core", top=2)
    np.testing.assert_allclose(np.asarray(plan.sharded()(w, x)), np.tanh(x @ w), rtol=1e-6)
    checked = plan.verify(repeat=1)
    for p in checked.plans:
        assert p.verified is not None and p.verified.collectives_match, p.name
        assert p.verified.sources_match, p.name
        assert any(c.op_name == "pure_callback" for c in p.predicted.collectives), p.name


def test_the_chosen_plan_is_the_fastest_predicted_of_the_searchs_plans_within_a_budget():
    """Under a budget the search prices memory into its costs, which are not the
    prediction's: its runners-up are predicted too, and the fastest within the budget is the
    chosen one, the search's plans named in the order of their predicted times (the search's
    best had been chosen at 123 µs where its runner-up was predicted at 121 µs)."""
    fn, args = shardwise.model("mlp", batch=16, hidden=32, ffn=64)
    for budget in (9000, 10_000, 12_000, None):
        p = shardwise.plan(fn, *args, mesh="data=2,model=4", profile="cpu-2core", budget=budget,
                           top=3)  # fmt: skip
        searched = [q for q in p.plans if q.name == "search" or q.name.startswith("search ")]
        assert [q.name for q in searched] == ["search"] + [f"search {k}" for k in
                                                           range(2, len(searched) + 1)]  # fmt: skip
        times = [q.predicted.seconds for q in searched]
        assert times == sorted(times) and p.chosen.name == "search", budget
        assert not p.chosen.over_budget


def test_fixed_given_otherwise_than_as_a_dict_of_names_says_how():
    """fixed as a tuple of specs, or keyed by position, had raised Python's own errors; the
    word the reports print for a whole array, 'replicated', pins it whole."""
    S = jax.ShapeDtypeStruct
    args = (S((8, 16), "float32"), S((16, 4), "float32"))
    fn = lambda x, w: x @ w  # noqa: E731
    for bad, words in [(("data", None), "a dict of input name"), ({0: "data"}, "not by int 0")]:
        with pytest.raises(shardwise.ArgumentTypeError, match=words):
            shardwise.plan(fn, *args, mesh="data=2,model=4", fixed=bad, top=1)
    p = shardwise.plan(fn, *args, mesh="data=2,model=4", fixed={"w": "replicated"}, top=1)
    assert p.chosen.in_specs[1].canonical() == shardwise.Spec()
    with pytest.raises(shardwise.ArgumentTypeError, match="as a tuple, fn"):
        shardwise.choose_mesh(fn, {"x": args[0], "w": args[1]}, 8, "cpu-2core")


def test_fixed_on_the_command_line_refuses_a_name_pinned_twice():
    from typer.testing import CliRunner

    from shardwise.cli import app

    runner = CliRunner()
    base = ["plan", "--model", "mlp", "--batch", "16", "--hidden", "32", "--ffn", "64",
            "--mesh", "data=2,model=4", "--top", "1", "--profile", "cpu-2core"]  # fmt: skip
    twice = runner.invoke(app, [*base, "--fixed", "x=data", "--fixed", "x=-,model"])
    assert twice.exit_code == 2 and "pins x twice" in twice.output
    once = runner.invoke(app, [*base, "--fixed", "x=data", "--json"])
    assert once.exit_code == 0, once.output


def test_a_partial_is_named_after_its_function():
    import functools

    def layer(x, w, scale):  # type: ignore[no-untyped-def]
        return (x @ w) * scale

    S = jax.ShapeDtypeStruct
    p = shardwise.plan(functools.partial(layer, scale=2.0), S((8, 16), "float32"),
                       S((16, 4), "float32"), mesh="x=2", profile="cpu-2core", top=1)  # fmt: skip
    assert p.program == "layer"


def test_a_plans_program_runs_inside_jit_grad_and_vmap():
    # the check for arguments already donated asked a tracer whether it was deleted, and JAX
    # raised ConcretizationTypeError: a plan's program could not be composed
    def g(w, x):
        return jnp.tanh(x @ w).sum()

    w, x = jnp.ones((16, 8)), jnp.ones((32, 16))
    step = shardwise.plan(g, w, x, mesh="data=2,model=4", profile="cpu-2core", top=1).sharded()
    np.testing.assert_allclose(jax.jit(step)(w, x), g(w, x), rtol=1e-5)
    np.testing.assert_allclose(jax.grad(step)(w, x), jax.grad(g)(w, x), rtol=1e-5)
    batched = jax.vmap(step, in_axes=(None, 0))(w, jnp.ones((2, 32, 16)))
    np.testing.assert_allclose(batched, [g(w, x)] * 2, rtol=1e-5)


def test_a_number_where_the_plan_has_an_array_is_refused_saying_so():
    w, x = jnp.ones((16, 8)), jnp.ones((32, 16))
    step = shardwise.plan(lambda w, x: x @ w, w, x, mesh="x=2", profile="cpu-2core").sharded()
    with pytest.raises(shardwise.ArgumentError, match=r"x is a float, but the plan was made"):
        step(w, 2.0)  # (JAX's "only valid for values of rank at least 1" had escaped raw)


def test_to_json_of_a_plan_over_nnx_state_holds_plain_specs():
    """An NNX variable compares equal to its value, so ``plain`` took a ``Param`` holding a
    spec for a leaf, and ``json.dumps(plan.to_json())`` failed on ``Param``."""
    nnx = pytest.importorskip("flax.nnx")

    class MLP(nnx.Module):
        def __init__(self, rngs):
            self.l1 = nnx.Linear(16, 64, rngs=rngs)

        def __call__(self, x):
            return jax.nn.relu(self.l1(x))

    graphdef, state = nnx.split(MLP(nnx.Rngs(0)))
    p = shardwise.plan(lambda s, x: nnx.merge(graphdef, s)(x), state, jnp.ones((32, 16)),
                       mesh="data=2,model=4", profile=CPU, top=1)  # fmt: skip
    found = json.loads(json.dumps(p.to_json()))
    kernel = found["plans"][0]["in_specs"][0]["l1"]["kernel"]
    assert isinstance(kernel, list) and len(kernel) == 2


def test_a_key_folded_with_a_constant_runs_step_after_step_on_a_mesh_given_as_text():
    """``jax.random.fold_in(key, 7)``, as Flax's dropout calls it: the traced literal kept the
    abstract mesh the plan traced on, and binding it beside the key the previous step made on
    the devices failed in JAX ("Mesh for all inputs should be equal"), at the second step, or
    the first after ``place``."""

    def step(key, w, x):
        k = jax.random.fold_in(key, 7)
        return key, w - 0.1 * jnp.mean((x + jax.random.normal(k, x.shape)) @ w)

    args = (jax.random.key(0), jnp.ones((32, 64)), jnp.ones((16, 32)))
    p = shardwise.plan(step, *args, mesh="data=2,model=4", profile=CPU, top=1)
    run, want = p.sharded(), jax.jit(step)
    for start in (args, p.place(args)):
        key, w, x = start
        wkey, ww = args[:2]
        for _ in range(3):
            key, w = run(key, w, x)
            wkey, ww = want(wkey, ww, x)
            np.testing.assert_allclose(np.asarray(w), np.asarray(ww), rtol=1e-5, atol=1e-6)


def test_pricing_layouts_past_the_time_limit_stops_and_says_what_to_do(monkeypatch):
    """A mesh of four axes gives an array thousands of layouts, and pricing each step between
    every two had run for many minutes with no word (``time_limit`` bounded the solver
    only). It stops at the limit (at least two minutes: a short one is the solver's),
    saying how far it got and what to do."""
    from shardwise._program import program as planning

    fn, args = _mlp_args(batch=16)
    assert shardwise.plan(fn, *args, mesh="a=2,b=2,c=2", profile=CPU, time_limit=0.0).chosen
    monkeypatch.setattr(planning, "PRICING_S", 0.0)  # (the least a pricing gets)
    with pytest.raises(shardwise.ArgumentError, match=r"pricing the layouts on mesh "
                       r"a=2,b=2,c=2 takes longer than the time limit \(0 s; 0 of \d+ steps "
                       r"priced\).*merge axes.*fixed=.*time_limit="):  # fmt: skip
        shardwise.plan(fn, *args, mesh="a=2,b=2,c=2", profile=CPU, time_limit=0.0)


def test_planning_says_each_stage_as_it_starts_and_the_pricing_step_by_step():
    """A listener hears the stages in order (the command's status line shows them: a mesh of
    four axes prices for most of a minute), the pricing's steps in order up to the last, a
    hundred times at most (a Python loop of 120 layers has more steps), and nothing is
    said where no one listens."""
    from shardwise._program import stages

    def layers(x, ws):
        for w in ws:
            x = jnp.tanh(x @ w)
        return x

    for depth in (2, 120):
        w = jax.ShapeDtypeStruct((32, 32), jnp.float32)
        args = (jax.ShapeDtypeStruct((64, 32), jnp.float32), [w] * depth)
        heard: list[str] = []
        with stages.told(heard.append):
            p = shardwise.plan(layers, *args, mesh="data=2,model=4", profile="cpu-2core", top=2)
        steps = len(p.graph.steps)
        priced = heard[1:-3]
        assert heard[0] == "tracing the program"
        numbers = [int(re.fullmatch(rf"pricing the layouts: step (\d+) of {steps}", s)[1])
                   for s in priced]  # fmt: skip
        assert numbers == sorted(set(numbers)) and numbers[0] == 1 and numbers[-1] == steps
        assert len(numbers) == steps if steps <= 100 else len(numbers) <= 101
        assert heard[-3:] == [
            "searching for the fastest plans",
            "solving the baselines",
            "predicting each plan's time and memory",
        ]
    assert steps > 100
    with stages.told(heard.append):  # (under a budget, the search says it)
        shardwise.plan(layers, *args, mesh="data=2,model=4", profile="cpu-2core", top=1,
                       budget="1GiB")  # fmt: skip
    assert "searching for the fastest plans within 1.0 GiB per device" in heard
    assert stages.listener() is None
