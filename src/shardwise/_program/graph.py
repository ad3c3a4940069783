"""A JAX function as a graph the program planner can search: its arrays, and the steps between
them that decide or change a layout.

:func:`build` traces a function to a jaxpr and reads each equation as one of:

- a **dot** (``dot_general``), written as the einsum it computes, whose strategies come from
  the einsum enumerator;
- an **elementwise** op, whose non-scalar operands and result share one layout: they join one
  *class* of arrays that the search gives a single layout;
- a **map**: an op with one operand that carries each dimension's layout to a dimension of its
  result (transpose, broadcast, reshape, reductions, slices, scan's stacking), where some
  dimensions must be whole on each device and reduced ones leave partial sums;
- an **opaque** op shardwise does not model, planned as needing its operands whole.

Calls (``jit``, ``custom_jvp``, ``custom_vjp``, remat) are inlined. A ``scan``'s body is read
once, with its steps marked as repeated ``length`` times, so that a model of L layers written
with ``lax.scan`` plans as fast as one layer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import jax
import numpy as np

from shardwise._errors import ArgumentError
from shardwise._program.nodes import Step, Value
from shardwise._program.rules import (
    ELEMENTWISE,
    INLINED,
    REDUCTIONS,
    abstract,
    dot_op,
    is_var,
    layout_map,
    named,
    source_of,
)
from shardwise._xla.names import argument_names

Key: TypeAlias = tuple[tuple[int, ...], Any]
"""Where a jaxpr variable lives: the path of equation numbers through inlined calls, and the
variable itself (one inner jaxpr may be inlined at several places)."""


@dataclass(slots=True)
class Graph:
    """A traced program: its arrays, steps, inputs and outputs, and which arrays share a layout.

    Attributes:
        values: every non-scalar array.
        steps: every op that is not elementwise, in program order.
        inputs: the arrays of the argument leaves, in ``jax.tree`` order.
        names: each input's name (``x``, ``params['w1']``), from ``signature`` if given.
        data: the arguments that are one array each (not containers), by position.
        outputs: the arrays of the result's leaves (``None`` for a scalar or constant).
        classes: each array's class: arrays joined by elementwise ops share a layout.
        elementwise: per class, how many elementwise ops it runs (weighted by repeats).
        keys: each jaxpr variable's array.
        born, last: the program position where each array is made and last read.
        fed: arrays that a step reads (so they are materialised, not fused away).
        looped: arrays a scan's loop takes in or carries round (XLA writes them each time,
            even where only elementwise ops read them).
        carries: each scan's initial carries, with the path of the scan's body.
        closed: the traced jaxpr.
        tree: the arguments' pytree structure; ``out_tree`` the result's.
        elementwise_ops: elementwise ops in the program.
        context: while a call's body is read, the user's line the call is on.
        backward: while a call's or scan's body is read, whether JAX made the call by
            transposing a forward one.
    """

    values: list[Value] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    inputs: list[int] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    data: list[int] = field(default_factory=list)
    outputs: list[int | None] = field(default_factory=list)
    parent: list[int] = field(default_factory=list)
    elementwise: dict[int, int] = field(default_factory=dict)
    keys: dict[Key, int] = field(default_factory=dict)
    born: list[int] = field(default_factory=list)
    last: list[int] = field(default_factory=list)
    fed: set[int] = field(default_factory=set)
    looped: set[int] = field(default_factory=set)
    carries: list[tuple[int, tuple[int, ...]]] = field(default_factory=list)
    clock: int = 0
    context: str = ""
    backward: bool = False
    closed: Any = None
    tree: Any = None
    out_tree: Any = None
    elementwise_ops: int = 0

    def find(self, v: int) -> int:
        """The class of array ``v`` (union-find root)."""
        while self.parent[v] != v:
            self.parent[v] = self.parent[self.parent[v]]
            v = self.parent[v]
        return v

    def join(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)

    def add(self, value: Value) -> int:
        self.values.append(value)
        self.parent.append(len(self.parent))
        self.born.append(self.clock)
        self.last.append(self.clock)
        return len(self.values) - 1

    @property
    def classes(self) -> list[int]:
        """The class of every array."""
        return [self.find(v) for v in range(len(self.values))]

    @property
    def ops(self) -> int:
        """Ops in the program: steps plus elementwise ops."""
        return len(self.steps) + self.elementwise_ops


def _where(graph: Graph, eqn: Any) -> str:
    """``eqn``'s line in the user's code, or else that of the call it is inlined from (the
    ``max`` inside ``jax.nn.relu`` is the user's ``relu`` line)."""
    return source_of(eqn) or graph.context


def _backward(graph: Graph, eqn: Any) -> bool:
    """Whether JAX made ``eqn`` by transposing a forward op (a training step's backward pass),
    or it is in the body of a call or scan that JAX made so."""
    return graph.backward or "transpose(" in str(eqn.source_info.name_stack)


def build(
    fn: Callable[..., Any], args: Sequence[Any], name: str = "", signature: Any = None
) -> Graph:
    """Trace ``fn(*args)`` and read it as a :class:`Graph`.

    >>> import jax.numpy as jnp
    >>> S = jax.ShapeDtypeStruct
    >>> g = build(lambda x, w: jnp.tanh(x @ w).sum(), [S((8, 4), "float32"), S((4, 2), "float32")])
    >>> [(s.kind, s.prim) for s in g.steps], g.names
    ([('dot', 'dot_general'), ('map', 'reduce_sum')], ['x', 'w'])
    """
    shapes = [jax.tree.map(abstract, a) for a in args]
    try:
        closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*shapes)
    except (TypeError, ValueError, OverflowError) as e:
        raise ArgumentError(
            f"cannot trace {name or 'the function'} with these arguments: {e}"
        ) from None
    graph = Graph(closed=closed, tree=jax.tree.structure(tuple(shapes)))
    graph.out_tree = jax.tree.structure(out_shape)
    graph.names = argument_names(signature or fn, shapes)
    graph.data = [k for k, a in enumerate(shapes) if isinstance(a, jax.ShapeDtypeStruct)]
    jaxpr = closed.jaxpr
    for var, label in zip(jaxpr.invars, graph.names, strict=True):
        graph.inputs.append(_define(graph, ((), var), label, ""))
    _walk(graph, jaxpr, (), 1)
    graph.clock += 1
    for var in jaxpr.outvars:
        out = graph.keys.get(((), var)) if is_var(var) else None
        graph.outputs.append(out)
        if out is not None:
            _use(graph, out, True)
    for v in graph.inputs:
        graph.last[v] = graph.clock
    return graph


def _rank(var: Any) -> int:
    return len(getattr(var.aval, "shape", None) or ())


def _define(graph: Graph, key: Key, name: str, source: str) -> int:
    aval = key[1].aval
    value = Value(tuple(int(n) for n in aval.shape), np.dtype(aval.dtype).name, name, source)
    v = graph.add(value)
    graph.keys[key] = v
    return v


def _array(graph: Graph, path: tuple[int, ...], var: Any) -> int | None:
    """The array behind a jaxpr operand (``None`` for literals and scalars)."""
    if not is_var(var) or not getattr(var.aval, "shape", ()):
        return None
    return graph.keys.get((path, var))


def _alias(
    graph: Graph, outer: tuple[int, ...], inner: tuple[int, ...], outs: Any, ins: Any
) -> None:
    for o, i in zip(outs, ins, strict=True):
        if is_var(o) and (outer, o) in graph.keys:
            graph.keys[(inner, i)] = graph.keys[(outer, o)]


def _walk(graph: Graph, jaxpr: Any, path: tuple[int, ...], repeat: int) -> None:
    for k, eqn in enumerate(jaxpr.eqns):
        here = (*path, k)
        prim = eqn.primitive.name
        if prim in INLINED and INLINED[prim] in eqn.params:
            inner = eqn.params[INLINED[prim]]
            inner = getattr(inner, "jaxpr", inner)
            _alias(graph, path, here, eqn.invars, inner.invars)
            outer = graph.context, graph.backward
            graph.context, graph.backward = _where(graph, eqn), _backward(graph, eqn)
            _walk(graph, inner, here, repeat)
            graph.context, graph.backward = outer
            for o, i in zip(eqn.outvars, inner.outvars, strict=True):
                if is_var(o) and is_var(i) and (here, i) in graph.keys:
                    graph.keys[(path, o)] = graph.keys[(here, i)]
                elif is_var(o) and _rank(o):
                    where = _where(graph, eqn)
                    _define(graph, (path, o), named(prim, where), where)
            continue
        if prim == "scan":
            _scan(graph, eqn, path, here, repeat)
            continue
        _equation(graph, eqn, path, here, repeat)


def _equation(
    graph: Graph, eqn: Any, path: tuple[int, ...], here: tuple[int, ...], repeat: int
) -> None:
    graph.clock += 1
    prim, source = eqn.primitive.name, _where(graph, eqn)
    inputs = [a for v in eqn.invars if (a := _array(graph, path, v)) is not None]
    if not inputs:
        return  # made on each device from nothing (iota, a broadcast constant): free to follow
    outs = []
    for o in eqn.outvars:
        if is_var(o) and (_rank(o) or prim in REDUCTIONS):
            outs.append(_define(graph, (path, o), named(prim, source), source))
    if not outs:
        return
    shape = graph.values[outs[0]].shape
    if prim in ELEMENTWISE and len(outs) == 1:
        graph.elementwise_ops += 1
        graph.elementwise[outs[0]] = graph.elementwise.get(outs[0], 0) + repeat
        for a in inputs:
            if graph.values[a].shape == shape:
                graph.join(a, outs[0])
                _use(graph, a, False)
            else:  # (4, 8, 1) - (4, 8, 16): the operand is broadcast to the result's layout
                held = graph.values[a].shape
                dim_map = tuple(d if held[d] == n else None for d, n in enumerate(shape))
                local = tuple(d for d, n in enumerate(shape) if held[d] != n)
                graph.steps.append(
                    Step(
                        "map",
                        f"{prim} (broadcast)",
                        (a,),
                        outs[0],
                        source,
                        repeat,
                        here,
                        dim_map=dim_map,
                        local=local,
                        implicit=True,
                        backward=_backward(graph, eqn),
                    )
                )
                _use(graph, a, True)
        return
    for out in outs:
        step = _step(graph, eqn, inputs, out, source, repeat, here)
        graph.steps.append(step)
        for a in step.inputs:
            _use(graph, a, True)


def _use(graph: Graph, v: int, by_step: bool) -> None:
    graph.last[v] = graph.clock
    if by_step:
        graph.fed.add(v)


def _step(
    graph: Graph,
    eqn: Any,
    inputs: list[int],
    out: int,
    source: str,
    repeat: int,
    key: tuple[int, ...],
) -> Step:
    prim, params = eqn.primitive.name, eqn.params
    in_shape = graph.values[inputs[0]].shape if inputs else ()
    out_shape = graph.values[out].shape
    common = {
        "prim": prim,
        "output": out,
        "source": source,
        "repeat": repeat,
        "key": key,
        "backward": _backward(graph, eqn),
    }
    if prim == "dot_general" and len(inputs) == 2:
        return Step(
            "dot",
            inputs=tuple(inputs),
            op=dot_op(
                params["dimension_numbers"], len(in_shape), len(graph.values[inputs[1]].shape)
            ),
            **common,
        )
    mapped = layout_map(prim, params, in_shape, out_shape) if len(inputs) == 1 else None
    if mapped is None:
        return Step("opaque", inputs=tuple(inputs), **common)
    dim_map, local, reduced = mapped
    return Step(
        "map", inputs=tuple(inputs), dim_map=dim_map, local=local, reduced=reduced, **common
    )


def _scan(
    graph: Graph, eqn: Any, path: tuple[int, ...], here: tuple[int, ...], repeat: int
) -> None:
    """Read a scan's body once, marked as running ``length`` times: constants are the outer
    arrays, the carry keeps one layout across iterations, and each ``xs``/``ys`` slice is a map
    of the stacked array without its first dimension."""
    p = eqn.params
    body = p["jaxpr"].jaxpr
    n_consts, n_carry, length = p["num_consts"], p["num_carry"], p["length"]
    source = _where(graph, eqn)
    ins = body.invars
    _alias(graph, path, here, eqn.invars[: n_consts + n_carry], ins[: n_consts + n_carry])
    taken = [_array(graph, path, v) for v in eqn.invars[: n_consts + n_carry]]
    graph.looped |= {a for a in taken if a is not None}
    for outer, inner in zip(
        eqn.invars[n_consts + n_carry :], ins[n_consts + n_carry :], strict=True
    ):
        x = _define(graph, (here, inner), named("scan slice", source), source)
        src = _array(graph, path, outer)
        if src is not None and graph.values[x].shape:
            rank = len(graph.values[x].shape)
            graph.steps.append(
                Step(
                    "map",
                    "scan slice",
                    (src,),
                    x,
                    source,
                    repeat,
                    here,
                    dim_map=tuple(range(1, rank + 1)),
                    local=(0,),
                    backward=_backward(graph, eqn),
                )
            )
            _use(graph, src, True)
    outer = graph.context, graph.backward
    graph.context, graph.backward = source, _backward(graph, eqn)
    _walk(graph, body, here, repeat * length)
    graph.context, graph.backward = outer
    for v in eqn.invars[n_consts : n_consts + n_carry]:  # even where the result is dropped
        init = _array(graph, path, v)
        if init is not None and graph.values[init].shape:
            graph.carries.append((init, here))
    outs = body.outvars
    for k, (outer, inner) in enumerate(zip(eqn.outvars, outs, strict=True)):
        if not is_var(outer) or not _rank(outer):
            continue
        y = _define(graph, (path, outer), named("scan", source), source)
        got = _array(graph, here, inner)
        if got is None:
            continue
        if k < n_carry:
            graph.looped.add(got)
            graph.join(got, y)
            init = _array(graph, path, eqn.invars[n_consts + k])
            carried = _array(graph, here, ins[n_consts + k])
            for other in (init, carried):
                if other is not None:
                    graph.join(got, other)
        else:
            rank = len(graph.values[got].shape)
            graph.steps.append(
                Step(
                    "map",
                    "scan stack",
                    (got,),
                    y,
                    source,
                    repeat,
                    here,
                    dim_map=(None, *range(rank)),
                    backward=_backward(graph, eqn),
                )
            )
            _use(graph, got, True)
