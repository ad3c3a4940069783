"""Plans that keep the layouts a program's code asks for (``plan(..., respect="constraints")``):
``jax.lax.with_sharding_constraint`` and Flax's ``nn.with_logical_constraint`` read off the
trace, every plan of the search and every baseline held to them, and the plans checked against
XLA; by default (``respect="none"``) the search lays those arrays out as it likes."""

from __future__ import annotations

import functools
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import shardwise
from library_models import linen_constrained_attention, linen_constrained_mlp, linen_logical
from shardwise._errors import ArgumentError, ShardwiseWarning, SpecError
from shardwise._model.spec import Spec

PROFILE = "cpu-2core"
S = jax.ShapeDtypeStruct
MEMORY_RANGE = (0.8, 1.25)
"""Compiled over predicted memory per device, for every plan."""
MESH = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
ARGS = (S((64, 32), "float32"), S((32, 256), "float32"), S((256, 32), "float32"))


def two_dots(asked: P) -> Any:
    """``tanh(x @ w1) @ w2`` with the hidden activation constrained to ``asked`` on MESH."""

    def fn(x: jax.Array, w1: jax.Array, w2: jax.Array) -> jax.Array:
        h = jax.lax.with_sharding_constraint(x @ w1, NamedSharding(MESH, asked))
        return jnp.tanh(h) @ w2

    return fn


def _hidden(p: shardwise.ProgramPlan, layout: Any) -> Spec:
    """A plan's layout of the (one) constrained array."""
    (asked,) = p.graph.placed
    spec: Spec = layout.layouts.specs[asked.value]
    return spec


def test_the_graph_records_each_layout_the_code_asks_for_and_where():
    fn = two_dots(P("model", None))
    (asked,) = shardwise.plan(fn, *ARGS, mesh=MESH, profile=PROFILE, top=1).graph.placed
    assert asked.spec == Spec((("model",), ()))
    assert asked.free == frozenset()
    assert asked.mesh == (("data", 2), ("model", 4))
    assert asked.source == f"test_program_constraints.py:{fn.__code__.co_firstlineno + 1}"


def test_every_plan_keeps_the_constraint_where_the_free_search_would_not():
    asked = P("model", None)
    free = shardwise.plan(two_dots(asked), *ARGS, mesh=MESH, profile=PROFILE, top=3)
    held = shardwise.plan(
        two_dots(asked), *ARGS, mesh=MESH, profile=PROFILE, top=3, respect="constraints"
    )
    want = Spec.parse(asked).canonical()
    assert free.respect == "none" and held.respect == "constraints"
    assert _hidden(free, free.chosen) != want  # the search alone lays it out otherwise
    assert held.to_json()["respect"] == "constraints"
    assert len(held.plans) > 1
    assert all(_hidden(held, q) == want for q in held.plans)
    assert held.chosen.predicted.seconds >= free.chosen.predicted.seconds
    x, w1, w2 = (np.random.default_rng(k).standard_normal(a.shape, np.float32) for k, a in
                 enumerate(ARGS))  # fmt: skip
    np.testing.assert_allclose(
        held.sharded()(x, w1, w2), two_dots(asked)(x, w1, w2), rtol=1e-4, atol=1e-5
    )


def test_a_bare_partition_spec_is_read_on_a_mesh_given_as_text():
    def fn(x: jax.Array, w1: jax.Array, w2: jax.Array) -> jax.Array:
        h = jax.lax.with_sharding_constraint(x @ w1, P(None, "data"))
        return h @ w2

    p = shardwise.plan(fn, *ARGS, mesh="data=2,model=4", profile=PROFILE, top=2,
                       respect="constraints")  # fmt: skip
    assert all(_hidden(p, q) == Spec(((), ("data",))) for q in p.plans)


def test_an_unconstrained_dimension_stays_free_and_two_partial_asks_meet():
    def fn(x: jax.Array, w1: jax.Array, w2: jax.Array) -> jax.Array:
        h = jax.lax.with_sharding_constraint(
            x @ w1, NamedSharding(MESH, P(P.UNCONSTRAINED, "model"))
        )
        h = jax.lax.with_sharding_constraint(h, NamedSharding(MESH, P("data", P.UNCONSTRAINED)))
        return h @ w2

    p = shardwise.plan(fn, *ARGS, mesh=MESH, profile=PROFILE, top=2, respect="constraints")
    first, second = p.graph.placed
    assert first.free == {0} and second.free == {1}
    assert all(q.layouts.specs[first.value] == Spec.parse("data,model") for q in p.plans)


def test_two_contradicting_constraints_on_one_array_hold_the_first_and_say_so():
    def fn(x: jax.Array, w1: jax.Array, w2: jax.Array) -> jax.Array:
        h = jax.lax.with_sharding_constraint(x @ w1, NamedSharding(MESH, P("data", None)))
        h = jax.lax.with_sharding_constraint(jnp.tanh(h), NamedSharding(MESH, P(None, "model")))
        return h @ w2

    with pytest.warns(ShardwiseWarning, match="the first asked holds") as caught:
        p = shardwise.plan(fn, *ARGS, mesh=MESH, profile=PROFILE, top=2, respect="constraints")
    assert f"test_program_constraints.py:{fn.__code__.co_firstlineno + 2}" in str(caught[0].message)
    first = p.graph.placed[0]
    assert all(q.layouts.specs[first.value] == Spec.parse("data") for q in p.plans)


def test_a_layout_on_another_mesh_is_not_held():
    other = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)

    def fn(x: jax.Array, w1: jax.Array, w2: jax.Array) -> jax.Array:
        return jax.lax.with_sharding_constraint(x @ w1, NamedSharding(other, P("model"))) @ w2

    free = shardwise.plan(fn, *ARGS, mesh=MESH, profile=PROFILE, top=1)
    held = shardwise.plan(fn, *ARGS, mesh=MESH, profile=PROFILE, top=1, respect="constraints")
    assert _hidden(held, held.chosen) == _hidden(free, free.chosen)


def test_a_bad_respect_names_the_accepted_values():
    with pytest.raises(ArgumentError, match=r"respect is 'all'.*'none'.*'constraints'"):
        shardwise.plan(two_dots(P()), *ARGS, mesh=MESH, profile=PROFILE, respect="all")


def test_a_constraint_that_does_not_divide_names_its_line():
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto,) * 2)

    def fn(x: jax.Array, w1: jax.Array, w2: jax.Array) -> jax.Array:
        h = jax.lax.with_sharding_constraint(x @ w1, NamedSharding(mesh, P(None, "model")))
        return h @ w2

    shapes = (S((64, 32), "float32"), S((32, 30), "float32"), S((30, 32), "float32"))
    line = f"test_program_constraints.py:{fn.__code__.co_firstlineno + 1}"
    with pytest.raises(SpecError, match=rf"{re.escape(line)} has size 30.*respect='none'"):
        shardwise.plan(fn, *shapes, mesh=mesh, profile=PROFILE, respect="constraints")


def test_a_fixed_input_against_a_constraint_says_which_line_holds_it():
    def fn(x: jax.Array, w1: jax.Array, w2: jax.Array) -> jax.Array:
        w1 = jax.lax.with_sharding_constraint(w1, NamedSharding(MESH, P(None, "model")))
        return (x @ w1) @ w2

    line = f"test_program_constraints.py:{fn.__code__.co_firstlineno + 1}"
    with pytest.raises(SpecError, match=rf"w1 cannot be laid out as data: .*{re.escape(line)}"):
        shardwise.plan(fn, *ARGS, mesh=MESH, profile=PROFILE, fixed={"w1": "data"},
                       respect="constraints")  # fmt: skip


RULES = {
    "data=2,model=4": (
        ("batch", "data"), ("hidden", "model"), ("heads", "model"), ("embed", None),
        ("length", None), ("kv", None),
    ),
    "data=2,fsdp=2,tensor=2": (
        ("batch", "data"), ("hidden", "tensor"), ("heads", "tensor"), ("embed", "fsdp"),
        ("length", None), ("kv", None),
    ),
}  # fmt: skip
"""Logical axis rules for each mesh: on three axes the weights' ``embed`` is split over
``fsdp``, their ``hidden`` (and the heads) over ``tensor``."""
FLAX = {
    "dot-relu-dot": linen_logical,
    "mlp": linen_constrained_mlp,
    "attention": linen_constrained_attention,
}


@functools.cache
def _model(name: str, mesh: str) -> Any:
    return FLAX[name](RULES[mesh])


def _loss(fn: Any) -> Any:
    def loss(params: Any, x: jax.Array) -> jax.Array:
        return jnp.mean(fn(params, x) ** 2)

    return loss


@pytest.mark.parametrize("mesh", list(RULES))
@pytest.mark.parametrize("name", [*FLAX, "dot-relu-dot-step"])
def test_flax_logical_constraints_held_and_verified(name: str, mesh: str) -> None:
    pytest.importorskip("flax")
    fn, args = _model(name.removesuffix("-step"), mesh)
    if name.endswith("-step"):
        fn = _loss(fn)
    p = shardwise.plan(fn, *args, mesh=mesh, profile=PROFILE, top=3, respect="constraints",
                       train=name.endswith("-step"))  # fmt: skip
    assert p.graph.placed
    for asked in p.graph.placed:
        want = asked.spec.canonical()
        assert all(q.layouts.specs[asked.value] == want for q in p.plans), asked
    checked = p.verify(repeat=1)
    assert all(q.verified is not None for q in checked.plans)
    assert [q.name for q in checked.plans if not q.verified.collectives_match] == []
    low, high = MEMORY_RANGE
    ratios = {q.name: q.verified.memory_bytes / q.predicted.memory_bytes for q in checked.plans}
    assert {n: r for n, r in ratios.items() if not low <= r <= high} == {}
    # a baseline that lays out a constrained input otherwise is left out, and says why
    assert all("asks for its layout at" in why for _, why in p.skipped if "cannot be" in why)


def test_flax_logical_constraints_held_on_an_explicit_mesh():
    pytest.importorskip("flax")
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
    fn, args = _model("dot-relu-dot", "data=2,model=4")
    p = shardwise.plan(fn, *args, mesh=mesh, profile=PROFILE, top=2, respect="constraints")
    assert len(p.graph.placed) == 3  # both kernels, and the hidden activation
    for asked in p.graph.placed:
        assert all(q.layouts.specs[asked.value] == asked.spec.canonical() for q in p.plans)
    np.testing.assert_allclose(p.sharded()(*args), jax.jit(fn)(*args), rtol=1e-4, atol=1e-5)


def test_reshard_and_device_put_are_read_and_held_too():
    explicit = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)

    def fn(x: jax.Array, w1: jax.Array, w2: jax.Array) -> jax.Array:
        h = jax.sharding.reshard(x @ w1, P("model", None))
        return jax.device_put(jnp.tanh(h), NamedSharding(explicit, P("model", None))) @ w2

    p = shardwise.plan(fn, *ARGS, mesh=explicit, profile=PROFILE, top=2, respect="constraints")
    assert [a.spec for a in p.graph.placed] == [Spec.parse("model,-")] * 2
    first = p.graph.placed[0].value
    assert all(q.layouts.specs[first] == Spec.parse("model") for q in p.plans)


def _named_mlp(x: jax.Array, hidden: int) -> tuple[Any, Any, jax.Array]:
    """A Linen MLP whose kernels carry logical names and whose input, hidden activation and
    output are held by ``nn.with_logical_constraint`` (``batch``, ``embed``, ``mlp``): its
    forward, its parameters for ``x``, and ``x``."""
    import flax.linen as nn

    part, init = nn.with_logical_partitioning, nn.initializers.lecun_normal()

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x: jax.Array) -> jax.Array:
            x = nn.with_logical_constraint(x, ("batch", "embed"))
            h = nn.Dense(hidden, use_bias=False, kernel_init=part(init, ("embed", "mlp")))(x)
            h = nn.with_logical_constraint(nn.relu(h), ("batch", "mlp"))
            y = nn.Dense(x.shape[-1], use_bias=False, kernel_init=part(init, ("mlp", "embed")))(h)
            return nn.with_logical_constraint(y, ("batch", "embed"))

    module = MLP()
    return (lambda params, x: module.apply(params, x)), module.init(jax.random.key(0), x), x


def test_rules_given_to_plan_are_in_force_while_the_code_is_traced():
    """``plan(..., rules=R)`` is ``plan`` under ``nn.logical_axis_rules(R)``: the code's
    ``nn.with_logical_constraint`` names resolve by R. They had resolved by no rules, so every
    constraint was dropped: ``respect="constraints"`` held nothing, and the rules handed back
    had no rule for the activations' ``batch``."""
    nn = pytest.importorskip("flax.linen")
    rules = (("batch", "data"), ("embed", None), ("mlp", "model"))
    forward, params, x = _named_mlp(jnp.ones((512, 32)), hidden=256)
    given = shardwise.plan(forward, params, x, mesh="data=2,model=4", profile=PROFILE, top=1,
                           rules=rules, respect="constraints")  # fmt: skip
    assert len(given.graph.placed) >= 3  # the three constraints (and the kernels unboxed)
    with nn.logical_axis_rules(rules):
        context = shardwise.plan(forward, params, x, mesh="data=2,model=4", profile=PROFILE,
                                 top=1, respect="constraints")  # fmt: skip
    assert given.in_specs == context.in_specs and given.in_specs[1] == P("data")
    assert ("batch", "data") in given.logical_rules().to_flax()


def test_respecting_names_writes_the_activations_the_code_names_too():
    """respect="names" with activations named by nn.with_logical_constraint: every plan of
    the search has exact rules (the activations' names were left out of the agreement, so
    a plan split `batch` one way in the input and another in an activation)."""
    pytest.importorskip("flax.linen")
    forward, params, x = _named_mlp(jnp.ones((16, 256)), hidden=1024)
    plan = shardwise.plan(forward, params, x, mesh="data=2,model=4", profile=PROFILE, top=3,
                          rules=(("batch", "data"), ("embed", None), ("mlp", "model")),
                          respect="names")  # fmt: skip
    assert plan.annotations.activations
    searched = [q.name for q in plan.plans if q.name.startswith("search")]
    assert len(searched) == 3
    for name in searched:
        made = plan.logical_rules(name)
        assert made.exact, (name, [c.describe() for c in made.conflicts])


def test_a_shard_map_inside_a_planned_function_runs_and_is_said_not_modelled():
    """``jax.shard_map`` in the user's function: ``sharded()`` had crashed binding it
    (``KeyError: 'subfuns'``: a higher-order primitive takes its body as a function). It runs
    as jax.jit runs it; its layouts and collectives are its own, so it is named not
    modelled."""
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto,) * 2)

    def fn(x: jax.Array, w: jax.Array, w2: jax.Array) -> jax.Array:
        local = lambda h, v: jax.lax.psum(h @ v, "model")  # noqa: E731
        specs = (P("data", "model"), P("model"))
        o = jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=P("data"))(x @ w, w2)
        return jnp.tanh(o)

    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s).astype(np.float32) for s in ((32, 64), (64, 128), (128, 64))]
    plan = shardwise.plan(fn, *args, mesh=mesh, profile=PROFILE, top=1)
    assert plan.report().not_modelled == ("shard_map",)
    want = jax.jit(fn)(*args)
    for name in ("search", "megatron"):
        np.testing.assert_allclose(plan.sharded(name)(*args), want, rtol=1e-4, atol=1e-4)
