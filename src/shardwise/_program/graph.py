"""A JAX function as a graph the program planner can search: its arrays, and the steps between
them that decide or change a layout.

:func:`build` traces a function to a jaxpr and walks it (:class:`~shardwise._program.walk.
Walker`), reading each equation by its primitive's rule (:mod:`~shardwise._program.rules`):

- a **dot**, written as the einsum it computes or is read as (a convolution, a gather), whose
  strategies come from the einsum enumerator;
- an **elementwise** op, whose non-scalar operands and result share one layout: they join one
  *class* of arrays that the search gives a single layout;
- a **map**: one operand whose dimensions carry their layout to the result's;
- an **opaque** op, planned as needing its operands whole (one with no rule: not modelled).

Calls are inlined, and a ``cond``'s branches (:mod:`~shardwise._program.control`). A layout the
code asks for (``with_sharding_constraint``) is its operand's array, the layout recorded
(:attr:`Graph.placed`). A ``scan``'s body is read once, its steps marked as repeated ``length``
times: L layers under ``lax.scan`` plan as fast as one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax

from shardwise._errors import ArgumentError, ShardwiseError
from shardwise._program import drawn, nodes, rules
from shardwise._program.control import read_cond, scan_results
from shardwise._program.nodes import Asked, Classes, Loop, Role, Step, Value, fused_reads, in_kernel
from shardwise._program.rules import IDENTITIES, REDUCTIONS, Rule, rule_of, whole_dot_flops
from shardwise._program.selects import unselected
from shardwise._program.walk import Key, Path, Walker, abstract_args, is_var, named, rank, source_of
from shardwise._program.walk import asked as layouts_asked
from shardwise._program.walk import module_of as library_module
from shardwise._versions import live_only, scan_counts
from shardwise._xla.dtypes import storage_name
from shardwise._xla.names import argument_names, top_names


@dataclass(frozen=True, slots=True)
class Graph:
    """A traced program: its arrays, steps, inputs and outputs, and which arrays share a layout.

    Attributes:
        values: every non-scalar array.
        steps: every op that is not elementwise, in program order.
        inputs: the arrays of the argument leaves, in ``jax.tree`` order.
        names: each input's name (``x``, ``params['w1']``), from ``signature`` if given.
        data: the arguments that are one array each (not containers), by position.
        outputs: the arrays of the result's leaves (``None`` for a constant).
        classes: each array's class: arrays joined by elementwise ops share a layout.
        elementwise: per array an elementwise op makes, how many times those ops run.
        keys: each jaxpr variable's array.
        born, last, clock: where each array is made and last read; the last program point.
        fed: arrays that a step reads (so they are materialised, not fused away).
        looped: arrays a scan's loop takes in or carries round (XLA writes each every time).
        carries: each scan's initial carries, with the path of the scan's body.
        closed, tree: the traced jaxpr; the arguments' pytree (``out_tree``: the result's).
        parameters: each top-level argument's name (one with no leaves too, ``None``).
        elementwise_ops: elementwise ops in the program.
        drawn: each draw of random bits (``random_bits``): its program point, shape and array
            (``None``: drawn by an opaque op, from keys that are an array).
        placed: each layout the code asks an array to have, in program order.
        loops: each scan, nested ones too, in the order their bodies end.
        donated: the inputs whose buffers the results may take (``jax.jit``'s donation).
        recomputed: each result of an elementwise op with an operand broadcast in it
            (``x - mean``) that no step reads, and the arrays XLA computes it from in each
            op that reads it (:func:`.nodes.recomputed`).
        branched: each array a ``cond``'s branch makes and returns: the cond's result it is
            returned as, and the program point the branch starts at.
        taken: the arrays a ``cond`` takes as operands (buffers of their own, in their layouts).
        made_from: each elementwise result made from one array of its shape alone (and
            arrays broadcast in it, or scalars), with that array.
        entered: each call's and scan's body and cond's branch, by path: the program point it
            starts at and the user's line it is entered from.
    """

    values: tuple[Value, ...]
    steps: tuple[Step, ...]
    inputs: tuple[int, ...]
    names: tuple[str, ...]
    outputs: tuple[int | None, ...]
    classes: tuple[int, ...]
    elementwise: Mapping[int, int]
    keys: Mapping[Key, int]
    born: tuple[int, ...]
    last: tuple[int, ...]
    clock: int
    fed: frozenset[int]
    looped: frozenset[int]
    carries: tuple[tuple[int, Path], ...]
    closed: Any
    elementwise_ops: int
    drawn: tuple[tuple[int, tuple[int, ...], int | None], ...] = ()
    placed: tuple[Asked, ...] = ()
    loops: tuple[Loop, ...] = ()
    donated: frozenset[int] = frozenset()
    recomputed: tuple[tuple[int, tuple[int, ...]], ...] = ()
    parameters: tuple[str, ...] = ()
    data: tuple[int, ...] = ()
    tree: Any = None
    out_tree: Any = None
    branched: tuple[tuple[int, int, int], ...] = ()
    taken: frozenset[int] = frozenset()
    made_from: Mapping[int, int] = dataclasses.field(default_factory=dict)
    entered: Mapping[Path, tuple[int, str]] = dataclasses.field(default_factory=dict)

    def find(self, v: int) -> int:
        """The class of array ``v``."""
        return self.classes[v]

    @property
    def ops(self) -> int:
        """Ops in the program: steps plus elementwise ops."""
        return len(self.steps) + self.elementwise_ops

    @property
    def not_modelled(self) -> tuple[str, ...]:  # (planned whole, costed by their bytes)
        return tuple(dict.fromkeys(s.prim for s in self.steps if not s.modelled))


def build(
    fn: Callable[..., Any], args: Sequence[Any], name: str = "", signature: Any = None,
    sharded: bool = False,
) -> Graph:  # fmt: skip
    """Trace ``fn(*args)`` (``sharded``: arrays with their shardings) as a :class:`Graph`.

    >>> import jax.numpy as jnp
    >>> S = jax.ShapeDtypeStruct
    >>> g = build(lambda x, w: jnp.tanh(x @ w).sum(), [S((8, 4), "float32"), S((4, 2), "float32")])
    >>> [(s.kind, s.prim) for s in g.steps], g.names
    ([('dot', 'dot_general'), ('map', 'reduce_sum')], ('x', 'w'))
    """
    shapes = abstract_args(args, signature or fn, sharded)
    try:
        closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*shapes)
    except ShardwiseError:
        raise
    except (TypeError, ValueError, OverflowError) as e:
        why = f"cannot trace {name or 'the function'} with these arguments: {e}"
        raise ArgumentError(why) from None
    graph = read_jaxpr(closed, argument_names(signature or fn, shapes))
    return dataclasses.replace(
        graph,
        data=tuple(k for k, a in enumerate(shapes) if isinstance(a, jax.ShapeDtypeStruct)),
        tree=jax.tree.structure(tuple(shapes)),
        out_tree=jax.tree.structure(out_shape),
        parameters=tuple(top_names(signature or fn, len(shapes))),
    )


def read_jaxpr(closed: Any, names: Sequence[str] = ()) -> Graph:
    """A traced jaxpr read as a :class:`Graph` (its inputs named ``names``, else ``x0, x1…``);
    :func:`build` traces a function and reads its jaxpr so.

    >>> closed = jax.make_jaxpr(lambda x: jax.numpy.cumsum(x * 2, axis=0))(jax.numpy.ones((4, 3)))
    >>> [(s.kind, s.prim, s.local) for s in read_jaxpr(closed).steps]
    [('map', 'cumsum', (0,))]
    """
    b = _Builder()
    closed = live_only(unselected(closed))  # (what nothing reads XLA never computes)
    jaxpr = closed.jaxpr
    names = tuple(names) or tuple(f"x{k}" for k in range(len(jaxpr.invars)))
    inputs = [
        b.define(((), var), label, "") for var, label in zip(jaxpr.invars, names, strict=True)
    ]
    b.run(jaxpr, [None] * len(jaxpr.constvars), (), inputs)
    b.clock += 1
    outputs = [b.env.get(((), var)) if is_var(var) else None for var in jaxpr.outvars]
    for out in (o for o in outputs if o is not None):
        b.use(out, True)
    fused_reads(b.sources, b.fed | {step.output for step in b.steps}, b.last)
    for v in inputs:
        b.last[v] = b.clock
    outs = {o for o in outputs if o is not None}
    return Graph(
        values=tuple(b.values),
        steps=tuple(b.steps),
        inputs=tuple(inputs),
        names=names,
        outputs=tuple(outputs),
        classes=tuple(b.classes.find(v) for v in range(len(b.values))),
        elementwise=types.MappingProxyType(b.elementwise),
        keys=types.MappingProxyType(b.env),
        born=tuple(b.born), last=tuple(b.last), clock=b.clock,
        fed=frozenset(b.fed), looped=frozenset(b.looped), carries=tuple(b.carries),
        closed=closed,
        elementwise_ops=b.elementwise_ops,
        drawn=tuple(b.drawn),
        placed=tuple(b.placed),
        loops=tuple(b.loops),
        recomputed=nodes.recomputed(b.steps, b.sources, b.fed | outs),
        branched=tuple(b.branched),
        taken=frozenset(b.taken),
        made_from=types.MappingProxyType({v: s[0] for v, s in b.sources.items() if len(s) == 1}),
        entered=types.MappingProxyType(b.entered),
    )  # fmt: skip


class _Builder(Walker[int]):
    """The walk that makes a :class:`Graph`: each value is an array's index."""

    def __init__(self) -> None:
        super().__init__()
        self.values: list[Value] = []
        self.steps: list[Step] = []
        self.classes = Classes()  # arrays joined by elementwise ops, scans' carries
        self.elementwise: dict[int, int] = {}
        self.sources: dict[int, list[int]] = {}  # each elementwise result's operands
        self.born: list[int] = []
        self.last: list[int] = []
        self.fed: set[int] = set()
        self.looped: set[int] = set()
        self.carries: list[tuple[int, Path]] = []
        self.clock = 0
        self.elementwise_ops = 0
        self.drawn: list[tuple[int, tuple[int, ...], int | None]] = []
        self.random: set[int] = set()  # random bits and what is made from them alone
        self.placed: list[Asked] = []
        self.loops: list[Loop] = []
        self.context = ""  # while a call's body is walked, the user's line the call is on
        self.scoped: Any = None  # the equation walked now (:meth:`scope`), whose line it is
        self.backward = False  # ... and whether JAX made the call by transposing a forward one
        self.repeat = 1  # how many times the equations walked now run (a scan's length)
        self.branch: Path = ()  # the path of the cond branch walked now (``()``: none)
        self.branched: list[tuple[int, int, int]] = []  # (made in a branch, result, start)
        self.taken: set[int] = set()  # (a cond's operands)
        self.entered: dict[Path, tuple[int, str]] = {}  # (each body: its start and line)

    def define(self, key: Key, name: str, source: str) -> int:
        aval = key[1].aval
        value = Value(tuple(int(n) for n in aval.shape), storage_name(aval.dtype), name, source)
        self.values.append(value)
        self.classes.add()
        self.born.append(self.clock)
        self.last.append(self.clock)
        v = len(self.values) - 1
        self.env[key] = v
        return v

    def use(self, v: int, by_step: bool) -> None:
        self.last[v] = self.clock
        if by_step:
            self.fed.add(v)

    def array(self, path: Path, var: Any) -> int | None:
        """The array behind a jaxpr operand (``None`` for literals and scalars)."""
        return self.env.get((path, var)) if is_var(var) and rank(var) else None

    def where(self, eqn: Any) -> str:
        """``eqn``'s line in the user's code, or else that of the call it is inlined from
        (the ``max`` inside ``jax.nn.relu`` is the user's ``relu`` line); for the equation
        walked now, the line :meth:`scope` found (its traceback is read once)."""
        return self.context if eqn is self.scoped else source_of(eqn) or self.context

    def is_backward(self, eqn: Any) -> bool:
        """Whether JAX made ``eqn`` by transposing a forward op (a training step's backward
        pass), or it is in the body of a call or scan that JAX made so."""
        return self.backward or (  # (the equation walked now: as :meth:`scope` found it)
            eqn is not self.scoped and "transpose(" in str(eqn.source_info.name_stack)
        )

    @contextlib.contextmanager
    def scope(self, eqn: Any) -> Iterator[None]:
        outer = self.context, self.backward, self.scoped
        self.context, self.backward, self.scoped = self.where(eqn), self.is_backward(eqn), eqn
        try:
            yield
        finally:
            self.context, self.backward, self.scoped = outer

    def call(
        self, eqn: Any, here: Path, body: Any, consts: Sequence[Any], ins: list[int | None]
    ) -> list[int | None]:
        # a result made from nothing (a jnp.tril mask, a checkpoint's) is free, as an iota
        self.entered[here] = (self.clock, self.context)
        return self.run(body, [None] * len(body.constvars), here, ins)

    def cond(self, eqn: Any, path: Path, here: Path, ins: list[int | None]) -> list[Any]:
        return read_cond(self, eqn, path, here, ins)

    def step(self, kind: Any, prim: str, inputs: Sequence[int], out: int, key: Path,
             eqn: Any, role: Role = "op", **more: Any) -> None:  # fmt: skip
        """A step of ``eqn`` that reads ``inputs`` and makes ``out`` (each input read there)."""
        self.steps.append(Step(kind, prim, tuple(inputs), out, self.where(eqn), self.repeat, key,
                               role=role, backward=self.is_backward(eqn),
                               module=library_module(eqn), branch=self.branch, **more))  # fmt: skip
        for a in inputs:
            self.use(a, True)

    def equation(self, eqn: Any, path: Path, here: Path, ins: list[int | None]) -> list[int | None]:
        self.clock += 1
        prim, source = rules.positional_sum(eqn), self.where(eqn)
        rule = rule_of(prim)
        operands = [self.array(path, v) for v in eqn.invars]
        inputs = [a for a in operands if a is not None]
        outs: list[int | None] = [None] * len(eqn.outvars)
        if (bits := drawn.read(self, eqn, path, inputs)) is not None:
            return bits
        if rule.placement:  # one buffer: the plan's layout stands in for the one asked for
            self.placed += [Asked(a, spec, free, mesh, source)
                            for k, spec, free, mesh in layouts_asked(eqn)
                            if (a := operands[k]) is not None]  # fmt: skip
            self.env.update({(path, o): a for o, a in zip(eqn.outvars, operands, strict=False)
                             if a is not None})  # fmt: skip
            return [self.env.get((path, o)) if is_var(o) else None for o in eqn.outvars]
        if prim in IDENTITIES and inputs:
            self.env[(path, eqn.outvars[0])] = inputs[0]
            return [inputs[0]]
        if not inputs:
            return outs  # made on each device from nothing (iota, a constant): free to follow
        for k, o in enumerate(eqn.outvars):
            if is_var(o) and (rank(o) or prim in REDUCTIONS or rule.kind == "dot"):
                outs[k] = self.define((path, o), named(prim, source), source)
        made = [v for v in outs if v is not None]
        if rule.kind == "elementwise" and len(made) == 1:
            self._elementwise(eqn, here, inputs, made[0])
        else:
            for out in made:
                self._op(eqn, rule, here, operands, out)
        return outs

    def _elementwise(self, eqn: Any, here: Path, inputs: list[int], out: int) -> None:
        self.elementwise_ops += 1  # (in a fused kernel, none through HBM: counted no times)
        runs = 0 if in_kernel(library_module(eqn)) else self.repeat
        self.elementwise[out] = self.elementwise.get(out, 0) + runs
        shape = self.values[out].shape
        for a in inputs:
            held = self.values[a].shape
            if held == shape and a not in self.random:  # (random bits: moved as a broadcast)
                self.classes.join(a, out)
                self.use(a, False)
                self.sources.setdefault(out, []).append(a)
            else:  # (4, 8, 1) - (4, 8, 16): the operand is broadcast to the result's layout
                dim_map = tuple(d if held[d] == n else None for d, n in enumerate(shape))
                local = tuple(d for d, n in enumerate(shape) if held[d] != n)
                self.step("map", f"{eqn.primitive.name} (broadcast)", (a,), out, here, eqn,
                          "broadcast", dim_map=dim_map, local=local)  # fmt: skip

    def _op(self, eqn: Any, rule: Rule, here: Path, operands: list[int | None], out: int) -> None:
        """A dot, map or opaque op making ``out`` from ``operands`` (``None``: no array)."""
        prim, params = rules.positional_sum(eqn), eqn.params
        shapes = [None if a is None else self.values[a].shape for a in operands]
        inputs = [a for a in operands if a is not None]
        out_shape = self.values[out].shape
        read = rule.einsum(params, shapes, out_shape) if rule.einsum is not None else None
        if rule.kind == "dot" and read is not None:
            self.step("dot", prim, inputs, out, here, eqn, op=read.op, whole=read.whole,
                      flops=read.flops)  # fmt: skip
            return
        if rule.kind == "map" and rule.layout is not None and len(inputs) == 1:
            mapped = rule.layout(params, self.values[inputs[0]].shape, out_shape)
            if mapped is not None:
                dim_map, local, reduced = mapped
                self.step("map", prim, inputs, out, here, eqn, dim_map=dim_map, local=local,
                          reduced=reduced)  # fmt: skip
                return
        whole = [tuple(v.aval.shape) for v in eqn.invars]  # (a dot with a constant operand)
        self.step("opaque", prim, inputs, out, here, eqn, modelled=rule.modelled,
                  flops=whole_dot_flops(prim, params, whole))  # fmt: skip

    def scan(self, eqn: Any, path: Path, here: Path, ins: list[int | None]) -> list[int | None]:
        """Read a scan's body once, marked as running ``length`` times: constants are the outer
        arrays, the carry keeps one layout across iterations, and each ``xs``/``ys`` slice is a
        map of the stacked array without its first dimension."""
        p = eqn.params
        body = p["jaxpr"].jaxpr
        n_in = sum(scan_counts(p))
        source = self.where(eqn)
        taken = [self.array(path, v) for v in eqn.invars[:n_in]]
        first = len(self.steps)
        self.looped |= {a for a in taken if a is not None}
        slices: list[int | None] = []
        for outer, inner in zip(eqn.invars[n_in:], body.invars[n_in:], strict=True):
            x = self.define((here, inner), named("scan slice", source), source)
            slices.append(x)
            src = self.array(path, outer)
            if src is not None and self.values[x].shape:
                r = len(self.values[x].shape)
                self.step("map", "scan slice", (src,), x, here, eqn, "scan slice",
                          dim_map=(*range(1, r + 1),), local=(0,), length=p["length"])  # fmt: skip
        repeat, self.repeat = self.repeat, self.repeat * p["length"]
        self.entered[here] = (self.clock, source)
        start, n_consts = self.clock, scan_counts(p)[0]
        carries = [  # (one that starts as a constant may take values from arrays)
            self.define((here, v), named("scan carry", source), source)
            if a is None and k >= n_consts and rank(v) else a
            for k, (a, v) in enumerate(zip(ins[:n_in], body.invars, strict=False))
        ]  # fmt: skip
        self.run(body, [None] * len(body.constvars), here, [*carries, *slices])
        carried = frozenset(a for a in ins[n_consts:n_in] if a is not None)
        body_steps = (first, len(self.steps))
        self.loops.append(Loop(start, self.clock, p["length"], carried, body_steps, p["unroll"]))
        self.repeat = repeat
        return scan_results(self, eqn, path, here)
