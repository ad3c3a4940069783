"""Run a traced program with a plan's layouts: every array is constrained to the layout the plan
gives it, and every dot's operands and result to its strategy's, so that XLA's partitioner
follows the plan rather than choosing its own.

The program is the jaxpr :func:`~shardwise._planner.graph.build` read, evaluated equation by
equation the same way (calls inlined, a scan's body run by ``lax.scan``), so each array meets
the layout the search chose for it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding

from shardwise._model.spec import Spec
from shardwise._planner.graph import Graph, Key
from shardwise._planner.ops import INLINED, is_var


def constrained(
    graph: Graph,
    mesh: Mesh,
    specs: Mapping[int, Spec],
    dots: Mapping[tuple[int, ...], tuple[tuple[Spec, ...], Spec]],
) -> Callable[..., Any]:
    """``fn`` as a function of the original arguments that follows ``specs`` (array → layout)
    and ``dots`` (a dot's place in the jaxpr → its operands' and result's layouts)."""

    def put(key: Key, x: Any) -> Any:
        v = graph.keys.get(key)
        if v is None or v not in specs or not getattr(x, "ndim", 0):
            return x
        return _constrain(x, mesh, specs[v])

    def run(jaxpr: Any, consts: Any, path: tuple[int, ...], env: dict[Key, Any]) -> list[Any]:
        for var, c in zip(jaxpr.constvars, consts, strict=True):
            env[(path, var)] = c
        for k, eqn in enumerate(jaxpr.eqns):
            here = (*path, k)
            ins = [v.val if not is_var(v) else env[(path, v)] for v in eqn.invars]
            outs = _equation(eqn, here, ins, env, run, put, mesh, dots)
            for var, x in zip(eqn.outvars, outs, strict=True):
                if is_var(var):
                    env[(path, var)] = put((path, var), x)
        return [v.val if not is_var(v) else env[(path, v)] for v in jaxpr.outvars]

    def program(*args: Any) -> Any:
        leaves = jax.tree.leaves(args)
        jaxpr = graph.closed.jaxpr
        env: dict[Key, Any] = {
            ((), var): put(((), var), x) for var, x in zip(jaxpr.invars, leaves, strict=True)
        }
        outs = run(jaxpr, graph.closed.consts, (), env)
        return jax.tree.unflatten(graph.out_tree, outs)

    return program


def _constrain(x: Any, mesh: Mesh, spec: Spec) -> Any:
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec.to_partition_spec()))


def _equation(
    eqn: Any,
    here: tuple[int, ...],
    ins: list[Any],
    env: dict[Key, Any],
    run: Callable[..., list[Any]],
    put: Callable[[Key, Any], Any],
    mesh: Mesh,
    dots: Mapping[tuple[int, ...], tuple[tuple[Spec, ...], Spec]],
) -> list[Any]:
    prim = eqn.primitive.name
    if prim in INLINED and INLINED[prim] in eqn.params:
        inner = eqn.params[INLINED[prim]]
        jaxpr, consts = getattr(inner, "jaxpr", inner), getattr(inner, "consts", ())
        for var, x in zip(jaxpr.invars, ins, strict=True):
            env[(here, var)] = put((here, var), x)
        return run(jaxpr, consts, here, env)
    if prim == "scan":
        return _scan(eqn, here, ins, env, run, put)
    if here in dots:
        in_specs, out_spec = dots[here]
        ins = [_constrain(x, mesh, s) for x, s in zip(ins, in_specs, strict=True)]
        out = eqn.primitive.bind(*ins, **eqn.params)
        return [_constrain(out, mesh, out_spec)]
    out = eqn.primitive.bind(*ins, **eqn.params)
    return list(out) if eqn.primitive.multiple_results else [out]


def _scan(
    eqn: Any,
    here: tuple[int, ...],
    ins: list[Any],
    env: dict[Key, Any],
    run: Callable[..., list[Any]],
    put: Callable[[Key, Any], Any],
) -> list[Any]:
    p = eqn.params
    body = p["jaxpr"]
    n_consts, n_carry = p["num_consts"], p["num_carry"]
    consts, init, xs = ins[:n_consts], ins[n_consts : n_consts + n_carry], ins[n_consts + n_carry :]
    invars = body.jaxpr.invars

    def step(carry: list[Any], x: list[Any]) -> tuple[list[Any], list[Any]]:
        local = dict(env)
        for var, value in zip(invars, [*consts, *carry, *x], strict=True):
            local[(here, var)] = put((here, var), value)
        outs = run(body.jaxpr, body.consts, here, local)
        return outs[:n_carry], outs[n_carry:]

    carry, ys = jax.lax.scan(
        step, init, xs, length=p["length"], reverse=p["reverse"], unroll=p["unroll"]
    )
    return [*carry, *ys]
