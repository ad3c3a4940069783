"""A ``lax.cond`` in a training step, planned as XLA partitions it: each branch runs on the
operands in their own layouts (read as a call's body), the results one buffer in one layout.
Read whole (its operands gathered), the step had been predicted 1.3 to 1.7 times the memory
XLA gives it (``optax.MultiSteps``), every plan of it is now within 20% and its collectives
are those the compiled program has."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import shardwise
from shardwise._program.graph import build
from shardwise._program.reading import train_step
from shardwise._versions import heap_release

PROFILE = "cpu-2core"
MESH = "data=2,model=4"


def _params() -> dict[str, jax.Array]:
    rng = np.random.default_rng(0)
    return {
        "w1": jnp.asarray(0.1 * rng.standard_normal((32, 64), np.float32)),
        "b1": jnp.zeros(64, jnp.float32),
        "w2": jnp.asarray(0.1 * rng.standard_normal((64, 8), np.float32)),
    }


def _loss(p, x, y):  # type: ignore[no-untyped-def]
    return jnp.mean((jnp.tanh(x @ p["w1"] + p["b1"]) @ p["w2"] - y) ** 2)


def _data() -> tuple[jax.Array, jax.Array]:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((16, 32), np.float32)
    return jnp.asarray(x), jnp.asarray(rng.standard_normal((16, 8), np.float32))


def _accumulating():  # type: ignore[no-untyped-def]
    """A training step under ``optax.MultiSteps`` (an update every 2 steps: a ``lax.cond``
    between the accumulation and the update)."""
    tx = optax.MultiSteps(optax.adamw(1e-2), every_k_schedule=2)

    def step(params, opt_state, x, y):  # type: ignore[no-untyped-def]
        loss, g = jax.value_and_grad(_loss)(params, x, y)
        updates, opt_state = tx.update(g, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    params = _params()
    return step, (params, tx.init(params), *_data())


def _skipping():  # type: ignore[no-untyped-def]
    """A step that skips the update (``lax.cond`` on a flag) where the loss is not finite."""
    tx = optax.adamw(1e-2)

    def step(state, x, y):  # type: ignore[no-untyped-def]
        loss, g = jax.value_and_grad(_loss)(state["params"], x, y)
        ok = jnp.isfinite(loss) & (loss < 1e3)

        def update(s):  # type: ignore[no-untyped-def]
            u, o = tx.update(g, s["opt_state"], s["params"])
            return optax.apply_updates(s["params"], u), o

        params, opt_state = jax.lax.cond(ok, update, lambda s: (s["params"], s["opt_state"]), state)
        skipped = state["skipped"] + (~ok).astype(jnp.int32)
        return {"params": params, "opt_state": opt_state, "skipped": skipped}, loss

    params = _params()
    state = {"params": params, "opt_state": tx.init(params), "skipped": jnp.int32(0)}
    return step, (state, *_data())


def _verified(plan: shardwise.ProgramPlan) -> shardwise.ProgramPlan:
    """Every plan compiled and run once, not timed."""
    return plan.verify(repeat=1)


def _every_plan(plan, fn, args, rtol=1e-4, atol=1e-5):  # type: ignore[no-untyped-def]
    """Run every plan against ``jax.jit(fn)``; verify each one's collectives; its compiled
    over predicted memory, by plan."""
    want = jax.jit(fn)(*args)
    for p in plan.plans:
        got = plan.sharded(p.name)(*args)
        for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=p.name)
    ratios = {}
    for p in _verified(plan).plans:
        assert p.verified is not None and p.verified.collectives_match, p.name
        ratios[p.name] = p.verified.memory_bytes / p.predicted.memory_bytes
    return ratios


@pytest.mark.parametrize("make", [_accumulating, _skipping], ids=["multisteps", "skip-on-flag"])
def test_every_plan_of_a_step_with_a_cond_predicts_its_memory_and_collectives(make) -> None:  # type: ignore[no-untyped-def]
    step, args = make()
    plan = shardwise.plan(step, *args, mesh=MESH, profile=PROFILE)
    ratios = _every_plan(plan, step, args, rtol=1e-5, atol=1e-6)
    assert {"fsdp", "megatron", "data×tensor"} <= set(ratios)
    # (from jaxlib 0.12.0 XLA's heap leaves 512 bytes more between the same buffers in four
    # plans of the 13 KB skip-on-flag step: its FSDP plan at 1.24x, 1.19x before)
    most = 1.25 if heap_release() >= (0, 12, 0) else 1.2
    assert all(0.8 <= r <= most for r in ratios.values()), ratios


def test_a_conds_branches_are_read_as_steps_on_operands_in_their_own_layouts() -> None:
    """The dot in a branch is a dot of the graph (not an opaque cond needing ``w`` whole),
    and a branch that returns its operand puts the result in that operand's layout."""

    def f(p, x, w):  # type: ignore[no-untyped-def]
        return jax.lax.cond(p, lambda: jnp.tanh(x @ w), lambda: x[:, :16]) + 1.0

    S = jax.ShapeDtypeStruct
    graph = build(f, [S((), "bool"), S((64, 32), "float32"), S((32, 16), "float32")])
    assert [(s.kind, s.prim) for s in graph.steps if s.prim != "slice"] == [("dot", "dot_general")]
    assert not graph.not_modelled
    dot = next(s for s in graph.steps if s.kind == "dot")
    assert graph.find(dot.output) == graph.find(graph.outputs[0])


# A cond under vmap, under grad, checkpointed, nested and through Flax: each program planned
# with every plan's result checked against jax.jit and its collectives and memory against the
# compiled program. Before, a vmapped cond with a batched predicate was planned as its selects
# read (collectives XLA never runs, memory 0.78x to 2.1x), and every cond's memory was
# counted past XLA's: a result passed through a branch, a branch's result beside the cond's
# (0.52x to 0.86x).


def _normal(seed: int, *shape: int) -> jax.Array:
    return jnp.asarray(0.1 * np.random.default_rng(seed).standard_normal(shape, np.float32))


def _vmapped(batched: bool, batch: int = 16, n: int = 256):  # type: ignore[no-untyped-def]
    """``jax.vmap`` of a cond: a predicate of each row (JAX runs both branches and selects
    their results, each operand first selected against its ``stop_gradient``), or one for the
    batch (a cond over the batched operands)."""

    def f(x, w, s):  # type: ignore[no-untyped-def]
        def one(x):  # type: ignore[no-untyped-def]
            p = x.sum() > 0 if batched else s > 0
            return jax.lax.cond(p, lambda: x @ w, lambda: (x * 2) @ w)

        return jax.vmap(one)(x)

    return f, (_normal(0, batch, 64, 256), _normal(1, 256, n), jnp.float32(1.0)), {}


def _vmapped_loss(batched: bool):  # type: ignore[no-untyped-def]
    """A training step (``train=True``) of a loss that vmaps a cond over the batch."""

    def loss(params, x, y):  # type: ignore[no-untyped-def]
        def one(x):  # type: ignore[no-untyped-def]
            w1 = params["w1"]
            p = x.sum() > 0 if batched else params["s"] > 0
            h = jax.lax.cond(p, lambda: jnp.tanh(x @ w1), lambda: jnp.tanh(2 * x @ w1))
            return h @ params["w2"]

        return jnp.mean((jax.vmap(one)(x) - y) ** 2)

    params = {"w1": _normal(0, 256, 256), "w2": _normal(1, 256, 32), "s": jnp.float32(1.0)}
    return loss, (params, _normal(2, 16, 64, 256), _normal(3, 16, 64, 32)), {"train": True}


def _differentiated(checkpointed: bool):  # type: ignore[no-untyped-def]
    """The gradient of a loss through a cond (its backward cond reads ``x`` as a residual:
    JAX 0.10's forward cond returns it from both branches, JAX 0.12's passes ``x`` itself),
    the cond inside ``jax.checkpoint`` or not."""

    def f(w, x, s):  # type: ignore[no-untyped-def]
        def out(w):  # type: ignore[no-untyped-def]
            return jax.lax.cond(s > 0, lambda: jnp.tanh(x @ w), lambda: x @ w * 2)

        body = jax.checkpoint(out) if checkpointed else out
        return jax.grad(lambda w: jnp.mean(body(w) ** 2))(w)

    return f, (_normal(0, 256, 256), _normal(1, 1024, 256), jnp.float32(1.0)), {}


def _nested():  # type: ignore[no-untyped-def]
    """A cond in a cond's branch, each branch's result a dot or made from one."""

    def f(x, w, p, q):  # type: ignore[no-untyped-def]
        def inner(x, w):  # type: ignore[no-untyped-def]
            return jax.lax.cond(q > 0, lambda: x @ w, lambda: jnp.tanh(x @ w))

        return jax.lax.cond(p > 0, inner, lambda x, w: (x * 2) @ w, x, w)

    args = (_normal(0, 1024, 256), _normal(1, 256, 256), jnp.float32(1.0), jnp.float32(-1.0))
    return f, args, {}


def _flax():  # type: ignore[no-untyped-def]
    """``flax.nnx.cond``."""
    from flax import nnx

    def f(x, w, s):  # type: ignore[no-untyped-def]
        return nnx.cond(s > 0, lambda x, w: jnp.tanh(x @ w), lambda x, w: x @ w * 2, x, w)

    return f, (_normal(0, 1024, 256), _normal(1, 256, 256), jnp.float32(1.0)), {}


CASES = {
    "vmap-batched-predicate": lambda: _vmapped(True, n=512),
    "vmap-one-predicate": lambda: _vmapped(False),
    "vmap-batched-predicate-step": lambda: _vmapped_loss(True),
    "vmap-one-predicate-step": lambda: _vmapped_loss(False),
    "grad": lambda: _differentiated(False),
    "checkpoint": lambda: _differentiated(True),
    "nested": _nested,
    "nnx": _flax,
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_plan_of_a_cond_under_a_transformation_predicts_what_xla_compiles(case) -> None:  # type: ignore[no-untyped-def]
    fn, args, kw = CASES[case]()
    plan = shardwise.plan(fn, *args, mesh=MESH, profile=PROFILE, **kw)
    ratios = _every_plan(plan, train_step(fn) if kw.get("train") else fn, args)
    assert all(0.8 <= r <= 1.2 for r in ratios.values()), ratios


def test_a_vmapped_conds_selects_of_an_operand_against_itself_are_read_as_the_operand() -> None:
    """JAX's ``select_n(p, stop_gradient(x), x)`` of each operand is ``x``: no select, no mask
    broadcast for it (XLA compiles none), only the results' select."""
    f, args, _ = _vmapped(True, batch=4)
    graph = build(f, list(args))
    assert [s.prim for s in graph.steps if s.kind == "dot"] == ["dot_general"] * 2
    closed = graph.closed.jaxpr
    assert [e.primitive.name for e in closed.eqns].count("select_n") == 1


def test_a_result_every_branch_returns_as_an_operand_is_that_operand() -> None:
    """XLA gives it the operand's buffer. ``lax.cond`` itself forwards such a result out of
    the cond, and from JAX 0.12 so does the gradient of a cond (next test): the cond here has
    its branches made to return their operand ``x`` as JAX 0.10's gradient returns it."""
    import jax.extend.core as jcore

    from shardwise._program.graph import read_jaxpr

    def f(x, w, s):  # type: ignore[no-untyped-def]
        return jax.lax.cond(
            s > 0, lambda x, w: (jnp.tanh(x @ w), x * 2), lambda x, w: (x @ w, x * 3), x, w
        )

    closed = jax.make_jaxpr(f)(_normal(0, 64, 32), _normal(1, 32, 32), jnp.float32(1.0))
    eqns = list(closed.jaxpr.eqns)
    k = next(k for k, e in enumerate(eqns) if e.primitive.name == "cond")
    cond = eqns[k]
    assert cond.invars[1] is closed.jaxpr.invars[0]  # (the branches' first operand is x)
    branches = tuple(
        jcore.ClosedJaxpr(
            b.jaxpr.replace(outvars=[b.jaxpr.outvars[0], b.jaxpr.invars[0]]), b.consts
        )
        for b in cond.params["branches"]
    )
    eqns[k] = cond.replace(params={**cond.params, "branches": branches})
    graph = read_jaxpr(jcore.ClosedJaxpr(closed.jaxpr.replace(eqns=eqns), closed.consts))
    assert graph.keys.get(((), cond.outvars[1])) == graph.inputs[0]
    assert graph.keys.get(((), cond.outvars[0])) not in graph.inputs


def test_the_residual_x_of_a_conds_gradient_is_x() -> None:
    """The backward cond of a cond's gradient reads ``x`` as a residual: JAX 0.10's forward
    cond returns it from both branches (a result that is its operand, the test above), JAX
    0.12.1's hands ``x`` to the backward cond itself. Either way it is ``x``'s array."""
    f, args, _ = _differentiated(False)
    graph = build(f, list(args))
    backward = [e for e in graph.closed.jaxpr.eqns if e.primitive.name == "cond"][-1]
    assert graph.inputs[1] in [graph.keys.get(((), v)) for v in backward.invars]
