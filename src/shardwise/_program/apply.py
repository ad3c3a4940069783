"""Run a traced program with a plan's layouts: every array is constrained to the layout the plan
gives it, and every dot's operands and result to its strategy's, so that XLA's partitioner
follows the plan rather than choosing its own.

The program is the jaxpr :func:`~shardwise._program.graph.build` read, walked by the same
:class:`~shardwise._program.walk.Walker` (calls inlined, a scan's body run by ``lax.scan``, a
``cond``'s branches by ``lax.switch``), so each array meets the layout the search chose for it
under the key the graph gave it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax._src import source_info_util
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from shardwise._model.spec import Spec
from shardwise._program.explain import stacked_as_read
from shardwise._program.graph import Graph
from shardwise._program.rules import rule_of
from shardwise._program.solution import Layouts
from shardwise._program.walk import Key, Path, Walker, is_var, source_of
from shardwise._versions import literal_here, scan_counts
from shardwise._xla.lower import Mover


def constrained(graph: Graph, mesh: Mesh, layouts: Layouts) -> Callable[..., Any]:
    """``fn`` as a function of the original arguments that follows ``layouts``: each array's
    layout, the layouts each step reads its operands in and makes its result in, and how a
    scan's stacks are sliced and stacked. Every change of layout goes one step at a time
    (:class:`~shardwise._xla.lower.Mover`), so XLA emits exactly the collectives the cost
    model predicts."""

    def program(*args: Any) -> Any:
        jaxpr = graph.closed.jaxpr
        walk = _Applier(graph, layouts, Mover(mesh))
        outs = walk.run(jaxpr, graph.closed.consts, (), jax.tree.leaves(args))
        return jax.tree.unflatten(graph.out_tree, outs)

    return program


class _Applier(Walker[Any]):
    """The walk that runs a plan: each value is a traced array, put in its layout as it is
    bound."""

    def __init__(self, graph: Graph, layouts: Layouts, mover: Mover) -> None:
        super().__init__()
        self.graph, self.layouts, self.mover = graph, layouts, mover
        self.arguments = frozenset(graph.closed.jaxpr.invars)
        self.stacks = {s.output: s for s in graph.steps if s.role == "scan stack"}
        self.traceback: Any = None  # while a call's body is walked, the call's user frames

    def constant(self, value: Any) -> Any:
        return value

    def spec_of(self, key: Key) -> Spec | None:
        v = self.graph.keys.get(key) if is_var(key[1]) else None
        return self.layouts.specs.get(v) if v is not None else None

    def bind(self, key: Key, value: Any) -> None:
        spec = self.spec_of(key)
        if key[0] == () and key[1] in self.arguments:
            spec = None  # an argument: jit's in_shardings lay it out (with no op to name)
        if spec is not None and jnp.ndim(value):
            value = self.mover.constrain(value, spec)
        self.env[key] = value

    def read(self, path: Path, var: Any) -> Any:
        return literal_here(var.val) if not is_var(var) else self.env[(path, var)]

    @contextlib.contextmanager
    def scope(self, eqn: Any) -> Iterator[None]:
        """Trace under ``eqn``'s source line and name stack, as :func:`jax.core.eval_jaxpr`
        does, so the compiled program's ops, and the collectives XLA makes for them or for the
        layout changes around them, carry the user's ``file:line`` in their metadata; an
        equation with no line in the user's code (the ``lt`` inside ``jnp.take``, whose
        derivative JAX traced apart) takes the line of the call it is inlined from, as the
        graph names it (:meth:`~shardwise._program.graph.Graph.where`)."""
        outer = self.traceback
        if source_of(eqn) or outer is None:
            self.traceback = eqn.source_info.traceback
        stack = source_info_util.current_name_stack() + eqn.source_info.name_stack
        try:
            with source_info_util.user_context(self.traceback, name_stack=stack):
                yield
        finally:
            self.traceback = outer

    def equation(self, eqn: Any, path: Path, here: Path, ins: list[Any]) -> list[Any]:
        """A step's operands moved to the layouts it reads them in, its result made in its
        layout and moved on to the result's own; a layout the user's code asks for gives way
        to the plan's; any other equation as it is."""
        if rule_of(eqn.primitive.name).placement:
            return ins
        # (as jax.core.eval_jaxpr binds: a higher-order primitive, shard_map, takes its body
        # as a function, not as the jaxpr its params hold)
        params = eqn.primitive.get_bind_params(_unsharded(eqn.params))
        if here not in self.layouts.steps:
            out = eqn.primitive.bind(*ins, **params)
            if eqn.primitive.name == "iota" and _shaped(eqn):
                # (made whole on each device: each op that reads it takes its part, with no
                # collective; left to itself XLA had split a causal mask's iota on the axis
                # that splits the keys and gathered it again for the queries. Not `empty`,
                # which an accelerator allocates: whole, it would take the whole buffer)
                out = self.mover.constrain(out, Spec())
            return list(out) if eqn.primitive.multiple_results else [out]
        reads, makes = self.layouts.steps[here]
        wanted = iter(reads)
        src = [self.spec_of((path, v)) for v in eqn.invars]
        moved = [
            self.mover.move(x, s, next(wanted)) if s is not None and jnp.ndim(x) else x
            for x, s in zip(ins, src, strict=True)
        ]
        out = eqn.primitive.bind(*moved, **params)
        results = list(out) if eqn.primitive.multiple_results else [out]
        dst = [self.spec_of((path, v)) for v in eqn.outvars]
        return [
            self.mover.move(self.mover.constrain(r, makes), makes, d)
            if d is not None and jnp.ndim(r)
            else r
            for r, d in zip(results, dst, strict=True)
        ]

    def cond(self, eqn: Any, path: Path, here: Path, ins: list[Any]) -> list[Any]:
        """A ``cond`` whose branches run as the graph read them (branch ``k`` at path
        ``(*here, k)``), each array in a branch put in its layout, under ``lax.switch`` on the
        cond's index (which is in range: the clamp ``lax.switch`` adds changes nothing)."""

        def branch(k: int, closed: Any) -> Callable[..., list[Any]]:
            def run(*operands: Any) -> list[Any]:
                outer, self.env = self.env, dict(self.env)
                try:
                    return self.run(closed.jaxpr, closed.consts, (*here, k), list(operands))
                finally:
                    self.env = outer

            return run

        branches = [branch(k, closed) for k, closed in enumerate(eqn.params["branches"])]
        return list(jax.lax.switch(ins[0], branches, *ins[1:]))

    def stacked(self, scan: Path, key: Key) -> tuple[Spec, Spec, Spec] | None:
        """For the stack at ``key`` of the scan at ``scan``: its own layout, the layout it is
        read in (slicing) or made in (stacking), and each slice's (slicing only)."""
        v = self.graph.keys.get(key)
        if v is None or (scan, v) not in self.layouts.scans:
            return None
        whole, mapped = self.layouts.scans[(scan, v)]
        return self.layouts.specs[v], whole, mapped

    def _stacked(self, ys: Any, v: int, made: Spec) -> Any:
        """Stack ``ys`` (array ``v``) held as it is ``made`` where the plan moves it after the
        loop: else XLA may take the layout it moves to back into the loop and move each slice
        there, in every iteration (seen: two all-to-alls of a layer's slice in the while body
        where the plan moves the stack once). Where the plan makes it from a copy of its slice
        that the loop moves anyway (:func:`~shardwise._program.explain.stacked_as_read`), it
        is left to XLA, which stacks that copy."""
        step = self.stacks.get(v)
        if step is None or stacked_as_read(self.graph, self.layouts, step):
            return ys
        return self.mover.constrain(ys, made)

    def scan(self, eqn: Any, path: Path, here: Path, ins: list[Any]) -> list[Any]:
        """A scan whose slices of ``xs`` move to their layouts one step at a time."""
        p = eqn.params
        body = p["jaxpr"]
        n_consts, n_carry = scan_counts(p)
        n_in = n_consts + n_carry
        consts, init, xs = ins[:n_consts], ins[n_consts:n_in], ins[n_in:]
        # each stack moves to the layout it is sliced in, and each slice on from its layout
        sliced: list[Spec | None] = []
        for k, v in enumerate(eqn.invars[n_in:]):
            found = self.stacked(here, (path, v)) if is_var(v) else None
            sliced.append(found[2] if found else None)
            if found:
                xs[k] = self.mover.move(xs[k], found[0], found[1])
        invars = body.jaxpr.invars[n_in:]

        def step(carry: list[Any], x: Sequence[Any]) -> tuple[list[Any], list[Any]]:
            outer, self.env = self.env, dict(self.env)
            try:
                moved = [
                    value if src is None or (dst := self.spec_of((here, var))) is None
                    else self.mover.move(value, src, dst)
                    for var, value, src in zip(invars, x, sliced, strict=True)
                ]  # fmt: skip
                outs = self.run(body.jaxpr, body.consts, here, [*consts, *carry, *moved])
            finally:
                self.env = outer
            return outs[:n_carry], outs[n_carry:]

        carry, ys = jax.lax.scan(
            step, init, xs, length=p["length"], reverse=p["reverse"], unroll=p["unroll"]
        )
        for k, v in enumerate(eqn.outvars[n_carry:]):  # each from the layout it is made in
            found = self.stacked(here, (path, v)) if is_var(v) else None
            if found:
                held = self._stacked(ys[k], self.graph.keys[(path, v)], found[2])
                ys[k] = self.mover.move(held, found[2], found[0])
        return [*carry, *ys]


def _shaped(eqn: Any) -> bool:
    """Whether ``eqn`` makes one array of one or more dimensions."""
    return len(eqn.outvars) == 1 and bool(getattr(eqn.outvars[0].aval, "shape", ()))


def _unsharded(params: dict[str, Any]) -> dict[str, Any]:
    """An equation's parameters without the result's sharding the user's code gave it
    (``out_sharding=`` under explicit sharding): the plan lays out every result itself, and
    runs with the mesh's axes Auto, where such a sharding is refused."""
    if not any(isinstance(v, NamedSharding | PartitionSpec) for v in params.values()):
        return params
    return {
        k: None if isinstance(v, NamedSharding | PartitionSpec) else v for k, v in params.items()
    }
