"""Run a traced program with a plan's layouts: every array is constrained to the layout the plan
gives it, and every dot's operands and result to its strategy's, so that XLA's partitioner
follows the plan rather than choosing its own.

The program is the jaxpr :func:`~shardwise._program.graph.build` read, evaluated equation by
equation the same way (calls inlined, a scan's body run by ``lax.scan``), so each array meets
the layout the search chose for it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax._src import source_info_util
from jax.sharding import Mesh, NamedSharding

from shardwise._model.reshard import reshard_moves
from shardwise._model.spec import Spec
from shardwise._program.graph import Graph, Key
from shardwise._program.rules import INLINED, is_var
from shardwise._program.solution import Layouts


def constrained(graph: Graph, mesh: Mesh, layouts: Layouts) -> Callable[..., Any]:
    """``fn`` as a function of the original arguments that follows ``layouts``: each array's
    layout, the layouts each step reads its operands in and makes its result in, and how a
    scan's stacks are sliced and stacked. Every change of layout goes one
    :func:`reshard_moves` step at a time, so XLA emits exactly the collectives the cost model
    predicts."""
    specs, steps = layouts.specs, layouts.steps

    def spec_of(key: Key) -> Spec | None:
        v = graph.keys.get(key) if is_var(key[1]) else None
        return specs.get(v) if v is not None else None

    def put(key: Key, x: Any) -> Any:
        v = graph.keys.get(key)
        if v is None or v not in specs or not getattr(x, "ndim", 0):
            return x
        return _constrain(x, mesh, specs[v])

    def run(
        jaxpr: Any, consts: Any, path: tuple[int, ...], env: dict[Key, Any], mover: _Mover
    ) -> list[Any]:
        for var, c in zip(jaxpr.constvars, consts, strict=True):
            env[(path, var)] = c
        for k, eqn in enumerate(jaxpr.eqns):
            here = (*path, k)
            ins = [v.val if not is_var(v) else env[(path, v)] for v in eqn.invars]
            with _where(eqn):
                if here in steps:
                    src = [spec_of((path, v)) for v in eqn.invars]
                    dst = [spec_of((path, v)) for v in eqn.outvars]
                    outs = _step(eqn, ins, src, dst, steps[here], mover)
                else:
                    outs = _equation(eqn, here, ins, env, run, put, spec_of, mover)
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
        outs = run(jaxpr, graph.closed.consts, (), env, _Mover(mesh, graph, layouts))
        return jax.tree.unflatten(graph.out_tree, outs)

    return program


def _where(eqn: Any) -> Any:
    """Trace under ``eqn``'s source line and name stack, as :func:`jax.core.eval_jaxpr` does,
    so the compiled program's ops, and the collectives XLA makes for them or for the layout
    changes around them, carry the user's ``file:line`` in their metadata."""
    stack = source_info_util.current_name_stack() + eqn.source_info.name_stack
    return source_info_util.user_context(eqn.source_info.traceback, name_stack=stack)


def _constrain(x: Any, mesh: Mesh, spec: Spec) -> Any:
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec.to_partition_spec()))


class _Mover:
    """Moves of arrays between layouts while one program is traced. Each step of a move is
    made once per array: two moves of one array that begin alike (for two readers, or a
    forward and a backward pass) share their first steps, as the cost model counts them
    (XLA merges only the first step of two such chains by itself). Entries hold their input
    alive, so an ``id`` is not reused while its entry exists."""

    def __init__(self, mesh: Mesh, graph: Graph, layouts: Layouts) -> None:
        self.mesh, self.graph, self.layouts = mesh, graph, layouts
        self.memo: dict[tuple[int, Spec, Spec], tuple[Any, Any]] = {}

    def scan_layouts(self, scan: tuple[int, ...], key: Key) -> tuple[Spec, Spec, Spec] | None:
        """For the stack at ``key`` of the scan at ``scan``: its own layout, the layout it is
        read in (slicing) or made in (stacking), and each slice's (slicing only)."""
        v = self.graph.keys.get(key)
        if v is None or (scan, v) not in self.layouts.scans:
            return None
        whole, mapped = self.layouts.scans[(scan, v)]
        return self.layouts.specs[v], whole, mapped

    def constrain(self, x: Any, spec: Spec) -> Any:
        return _constrain(x, self.mesh, spec)

    def move(self, x: Any, src: Spec, dst: Spec) -> Any:
        """``x`` moved from ``src`` to ``dst`` one step of :func:`reshard_moves` at a time,
        each step made once for ``x`` (keyed by the layouts it goes between)."""
        if src == dst:
            return self._once(x, (src, dst), lambda: self.constrain(x, dst))
        out, before = x, src.canonical()
        for move in reshard_moves(src, dst, x.ndim):
            out = self._once(
                x, (before, move.spec), functools.partial(self.constrain, out, move.spec)
            )
            before = move.spec
        return out

    def _once(self, x: Any, step: tuple[Spec, Spec], make: Callable[[], Any]) -> Any:
        key = (id(x), *step)
        if key not in self.memo:
            self.memo[key] = (x, make())
        return self.memo[key][1]


def _step(
    eqn: Any,
    ins: list[Any],
    src: list[Spec | None],
    dst: list[Spec | None],
    layouts: tuple[tuple[Spec, ...], Spec],
    mover: _Mover,
) -> list[Any]:
    """A dot, map or opaque op: operands moved to the layouts it reads them in, its result
    made in its layout and moved on to the result's own."""
    wanted = iter(layouts[0])
    moved = [
        mover.move(x, s, next(wanted)) if s is not None and jnp.ndim(x) else x
        for x, s in zip(ins, src, strict=True)
    ]
    out = eqn.primitive.bind(*moved, **eqn.params)
    results = list(out) if eqn.primitive.multiple_results else [out]
    return [
        mover.move(mover.constrain(r, layouts[1]), layouts[1], d)
        if d is not None and jnp.ndim(r)
        else r
        for r, d in zip(results, dst, strict=True)
    ]


def _equation(
    eqn: Any,
    here: tuple[int, ...],
    ins: list[Any],
    env: dict[Key, Any],
    run: Callable[..., list[Any]],
    put: Callable[[Key, Any], Any],
    spec_of: Callable[[Key], Spec | None],
    mover: _Mover,
) -> list[Any]:
    prim = eqn.primitive.name
    if prim in INLINED and INLINED[prim] in eqn.params:
        inner = eqn.params[INLINED[prim]]
        jaxpr, consts = getattr(inner, "jaxpr", inner), getattr(inner, "consts", ())
        for var, x in zip(jaxpr.invars, ins, strict=True):
            env[(here, var)] = put((here, var), x)
        return run(jaxpr, consts, here, env, mover)
    if prim == "scan":
        return _scan(eqn, here, ins, env, run, put, spec_of, mover)
    out = eqn.primitive.bind(*ins, **eqn.params)
    return list(out) if eqn.primitive.multiple_results else [out]


def _scan(
    eqn: Any,
    here: tuple[int, ...],
    ins: list[Any],
    env: dict[Key, Any],
    run: Callable[..., list[Any]],
    put: Callable[[Key, Any], Any],
    spec_of: Callable[[Key], Spec | None],
    mover: _Mover,
) -> list[Any]:
    """A scan whose slices of ``xs`` move to their layouts one step at a time."""
    p = eqn.params
    body = p["jaxpr"]
    n_consts, n_carry = p["num_consts"], p["num_carry"]
    consts, init, xs = ins[:n_consts], ins[n_consts : n_consts + n_carry], ins[n_consts + n_carry :]
    invars = body.jaxpr.invars
    n_in = n_consts + n_carry
    # each stack moves to the layout it is sliced in, and each slice on from its layout
    sliced: list[Spec | None] = []
    for k, v in enumerate(eqn.invars[n_in:]):
        found = mover.scan_layouts(here, (here[:-1], v)) if is_var(v) else None
        sliced.append(found[2] if found else None)
        if found:
            xs[k] = mover.move(xs[k], found[0], found[1])

    def step(carry: list[Any], x: list[Any]) -> tuple[list[Any], list[Any]]:
        local = dict(env)
        for var, value in zip(invars[:n_in], [*consts, *carry], strict=True):
            local[(here, var)] = put((here, var), value)
        for var, value, src in zip(invars[n_in:], x, sliced, strict=True):
            dst = spec_of((here, var))
            moved = value if src is None or dst is None else mover.move(value, src, dst)
            local[(here, var)] = put((here, var), moved)
        outs = run(body.jaxpr, body.consts, here, local, mover)
        return outs[:n_carry], outs[n_carry:]

    carry, ys = jax.lax.scan(
        step, init, xs, length=p["length"], reverse=p["reverse"], unroll=p["unroll"]
    )
    for k, v in enumerate(eqn.outvars[n_carry:]):  # each stack from the layout it is made in
        found = mover.scan_layouts(here, (here[:-1], v)) if is_var(v) else None
        if found:
            ys[k] = mover.move(ys[k], found[2], found[0])
    return [*carry, *ys]
