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

import inspect
import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

import jax
import jax.extend.core as jcore
import numpy as np
from jax._src import source_info_util

from shardwise._errors import ArgumentError, ArgumentTypeError
from shardwise._model.op import Op

Kind: TypeAlias = Literal["dot", "map", "opaque"]
Key: TypeAlias = tuple[tuple[int, ...], Any]
"""Where a jaxpr variable lives: the path of equation numbers through inlined calls, and the
variable itself (one inner jaxpr may be inlined at several places)."""

ELEMENTWISE = frozenset(
    [
        "abs",
        "acos",
        "acosh",
        "add",
        "add_any",
        "and",
        "asin",
        "asinh",
        "atan",
        "atan2",
        "atanh",
        "cbrt",
        "ceil",
        "clamp",
        "conj",
        "copy",
        "copy_p",
        "convert_element_type",
        "cos",
        "cosh",
        "digamma",
        "div",
        "eq",
        "erf",
        "erf_inv",
        "erfc",
        "exp",
        "exp2",
        "expm1",
        "floor",
        "ge",
        "gt",
        "igamma",
        "imag",
        "integer_pow",
        "is_finite",
        "le",
        "lgamma",
        "log",
        "log1p",
        "logistic",
        "lt",
        "max",
        "min",
        "mul",
        "ne",
        "neg",
        "nextafter",
        "not",
        "or",
        "pow",
        "real",
        "reduce_precision",
        "rem",
        "round",
        "rsqrt",
        "select_n",
        "sign",
        "sin",
        "sinh",
        "sqrt",
        "square",
        "stop_gradient",
        "sub",
        "tan",
        "tanh",
        "xor",
    ]
)
REDUCTIONS = frozenset(
    [
        "reduce_sum",
        "reduce_max",
        "reduce_min",
        "reduce_prod",
        "reduce_and",
        "reduce_or",
    ]
)
"""Reductions whose partial results along a split dimension an all-reduce combines."""
INLINED = {
    "pjit": "jaxpr",
    "jit": "jaxpr",
    "closed_call": "call_jaxpr",
    "remat": "jaxpr",
    "checkpoint": "jaxpr",
    "custom_jvp_call": "call_jaxpr",
    "custom_vjp_call": "call_jaxpr",
    "custom_vjp_call_jaxpr": "fun_jaxpr",
}


@dataclass(frozen=True, slots=True)
class Value:
    """One array of the program: shape, dtype, a name from the user's code, where it is made."""

    shape: tuple[int, ...]
    dtype: str
    name: str
    source: str = ""

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize


@dataclass(frozen=True, slots=True)
class Step:
    """One op between arrays that needs a decision (a dot) or maps layouts (everything else).

    Attributes:
        kind: ``dot``, ``map`` or ``opaque``.
        prim: the JAX primitive.
        inputs: the arrays it reads (scalars left out).
        output: the array it makes.
        op: a dot's einsum.
        dim_map: a map's source dimension of each result dimension (``None``: new).
        local: a map's operand dimensions that must be whole on each device.
        reduced: a map's operand dimensions summed away (split ones leave partial sums).
        source: ``file:line`` of the user's code.
        repeat: how many times it runs (a scan's length).
        key: where it is in the jaxpr, for applying a plan.
    """

    kind: Kind
    prim: str
    inputs: tuple[int, ...]
    output: int
    source: str
    repeat: int
    key: tuple[int, ...]
    op: Op | None = None
    dim_map: tuple[int | None, ...] = ()
    local: tuple[int, ...] = ()
    reduced: tuple[int, ...] = ()


@dataclass(slots=True)
class Graph:
    """A traced program: its arrays, steps, inputs and outputs, and which arrays share a layout.

    Attributes:
        values: every non-scalar array.
        steps: every op that is not elementwise, in program order.
        inputs: the arrays of the argument leaves, in ``jax.tree`` order.
        names: each input's name (``x``, ``params['w1']``).
        outputs: the arrays of the result's leaves (``None`` for a scalar or constant).
        classes: each array's class: arrays joined by elementwise ops share a layout.
        elementwise: per class, how many elementwise ops it runs (weighted by repeats).
        keys: each jaxpr variable's array.
        born, last: the program position where each array is made and last read.
        fed: arrays that a step reads (so they are materialised, not fused away).
        closed: the traced jaxpr.
        tree: the arguments' pytree structure; ``out_tree`` the result's.
        elementwise_ops: elementwise ops in the program.
    """

    values: list[Value] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    inputs: list[int] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    outputs: list[int | None] = field(default_factory=list)
    parent: list[int] = field(default_factory=list)
    elementwise: dict[int, int] = field(default_factory=dict)
    keys: dict[Key, int] = field(default_factory=dict)
    born: list[int] = field(default_factory=list)
    last: list[int] = field(default_factory=list)
    fed: set[int] = field(default_factory=set)
    clock: int = 0
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


def _source(eqn: Any) -> str:
    frame = source_info_util.user_frame(eqn.source_info.traceback)
    if frame is None:
        return ""
    return f"{frame.file_name.rsplit('/', 1)[-1]}:{frame.start_line}"


def argument_names(fn: Callable[..., Any], args: Sequence[Any]) -> list[str]:
    """A name for every leaf of ``args``: the parameter's name and the leaf's pytree path.

    >>> argument_names(lambda x, params: None, [1, {"w1": 2, "w2": 3}])
    ['x', "params['w1']", "params['w2']"]
    """
    try:
        params = [
            p.name
            for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        params = []
    names = []
    for k, arg in enumerate(args):
        base = params[k] if k < len(params) else f"args[{k}]"
        for path, _ in jax.tree_util.tree_flatten_with_path(arg)[0]:
            names.append(base + jax.tree_util.keystr(path))
    return names


def _abstract(x: Any) -> jax.ShapeDtypeStruct:
    if isinstance(x, jax.ShapeDtypeStruct):
        return x
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return jax.ShapeDtypeStruct(tuple(x.shape), x.dtype)
    raise ArgumentTypeError(
        f"an argument leaf is {type(x).__name__} {x!r:.60}, not an array; plan takes arrays or "
        "jax.ShapeDtypeStruct leaves, e.g. jax.ShapeDtypeStruct((256, 1024), 'float32')."
    )


def build(fn: Callable[..., Any], args: Sequence[Any], name: str = "") -> Graph:
    """Trace ``fn(*args)`` and read it as a :class:`Graph`.

    >>> import jax.numpy as jnp
    >>> S = jax.ShapeDtypeStruct
    >>> g = build(lambda x, w: jnp.tanh(x @ w).sum(), [S((8, 4), "float32"), S((4, 2), "float32")])
    >>> [(s.kind, s.prim) for s in g.steps], g.names
    ([('dot', 'dot_general'), ('map', 'reduce_sum')], ['x', 'w'])
    """
    abstract = [jax.tree.map(_abstract, a) for a in args]
    try:
        closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*abstract)
    except (TypeError, ValueError) as e:
        raise ArgumentError(
            f"cannot trace {name or 'the function'} with these arguments: {e}"
        ) from None
    graph = Graph(closed=closed, tree=jax.tree.structure(tuple(abstract)))
    graph.out_tree = jax.tree.structure(out_shape)
    graph.names = argument_names(fn, abstract)
    jaxpr = closed.jaxpr
    for var, label in zip(jaxpr.invars, graph.names, strict=True):
        graph.inputs.append(_define(graph, ((), var), label, ""))
    _walk(graph, jaxpr, (), 1)
    graph.clock += 1
    for var in jaxpr.outvars:
        out = graph.keys.get(((), var)) if _is_var(var) else None
        graph.outputs.append(out)
        if out is not None:
            _use(graph, out, True)
    for v in graph.inputs:
        graph.last[v] = graph.clock
    return graph


def _is_var(v: Any) -> bool:
    return not isinstance(v, jcore.Literal) and not isinstance(v, jcore.DropVar)


def _define(graph: Graph, key: Key, name: str, source: str) -> int:
    aval = key[1].aval
    value = Value(tuple(int(n) for n in aval.shape), np.dtype(aval.dtype).name, name, source)
    v = graph.add(value)
    graph.keys[key] = v
    return v


def _array(graph: Graph, path: tuple[int, ...], var: Any) -> int | None:
    """The array behind a jaxpr operand (``None`` for literals and scalars)."""
    if not _is_var(var) or not getattr(var.aval, "shape", ()):
        return None
    return graph.keys.get((path, var))


def _alias(
    graph: Graph, outer: tuple[int, ...], inner: tuple[int, ...], outs: Any, ins: Any
) -> None:
    for o, i in zip(outs, ins, strict=True):
        if _is_var(o) and (outer, o) in graph.keys:
            graph.keys[(inner, i)] = graph.keys[(outer, o)]


def _walk(graph: Graph, jaxpr: Any, path: tuple[int, ...], repeat: int) -> None:
    for k, eqn in enumerate(jaxpr.eqns):
        here = (*path, k)
        prim = eqn.primitive.name
        if prim in INLINED and INLINED[prim] in eqn.params:
            inner = eqn.params[INLINED[prim]]
            inner = getattr(inner, "jaxpr", inner)
            _alias(graph, path, here, eqn.invars, inner.invars)
            _walk(graph, inner, here, repeat)
            for o, i in zip(eqn.outvars, inner.outvars, strict=True):
                if _is_var(o) and _is_var(i) and (here, i) in graph.keys:
                    graph.keys[(path, o)] = graph.keys[(here, i)]
                elif _is_var(o) and o.aval.shape if hasattr(o.aval, "shape") else ():
                    _define(graph, (path, o), f"{prim}@{_source(eqn)}", _source(eqn))
            continue
        if prim == "scan":
            _scan(graph, eqn, path, here, repeat)
            continue
        _equation(graph, eqn, path, here, repeat)


def _equation(
    graph: Graph, eqn: Any, path: tuple[int, ...], here: tuple[int, ...], repeat: int
) -> None:
    graph.clock += 1
    prim, source = eqn.primitive.name, _source(eqn)
    inputs = [a for v in eqn.invars if (a := _array(graph, path, v)) is not None]
    if not inputs:
        return  # made on each device from nothing (iota, a broadcast constant): free to follow
    outs = []
    for o in eqn.outvars:
        if _is_var(o) and (o.aval.shape if hasattr(o.aval, "shape") else () or prim in REDUCTIONS):
            outs.append(_define(graph, (path, o), f"{prim}@{source}", source))
    if not outs:
        return
    shape = graph.values[outs[0]].shape
    if prim in ELEMENTWISE and len(outs) == 1:
        graph.elementwise_ops += 1
        graph.elementwise[outs[0]] = graph.elementwise.get(outs[0], 0) + repeat
        for a in inputs:
            if graph.values[a].shape == shape:
                graph.join(a, outs[0])
        for a in inputs:
            _use(graph, a, False)
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
    common = {"prim": prim, "output": out, "source": source, "repeat": repeat, "key": key}
    if prim == "dot_general" and len(inputs) == 2:
        return Step(
            "dot",
            inputs=tuple(inputs),
            op=dot_op(
                params["dimension_numbers"], len(in_shape), len(graph.values[inputs[1]].shape)
            ),
            **common,
        )
    mapped = _map(prim, params, in_shape, out_shape) if len(inputs) == 1 else None
    if mapped is None:
        return Step("opaque", inputs=tuple(inputs), **common)
    dim_map, local, reduced = mapped
    return Step(
        "map", inputs=tuple(inputs), dim_map=dim_map, local=local, reduced=reduced, **common
    )


def dot_op(dimension_numbers: Any, lhs_rank: int, rhs_rank: int) -> Op:
    """The einsum a ``dot_general`` computes: output is batch, then lhs free, then rhs free.

    >>> dot_op((([1], [0]), ([], [])), 2, 2).equation
    'ab,bc->ac'
    >>> dot_op((([2], [1]), ([0], [0])), 3, 3).equation
    'abc,acd->abd'
    """
    (lc, rc), (lb, rb) = dimension_numbers
    letters = iter("abcdefghijklmnopqrstuvwxyz")
    lhs = [next(letters) for _ in range(lhs_rank)]
    rhs = ["" for _ in range(rhs_rank)]
    for i, j in itertools.chain(zip(lc, rc, strict=True), zip(lb, rb, strict=True)):
        rhs[j] = lhs[i]
    rhs = [r or next(letters) for r in rhs]
    out = [lhs[i] for i in lb]
    out += [lhs[i] for i in range(lhs_rank) if i not in lc and i not in lb]
    out += [rhs[j] for j in range(rhs_rank) if j not in rc and j not in rb]
    return Op(("".join(lhs), "".join(rhs)), "".join(out))


MapParts: TypeAlias = tuple[tuple[int | None, ...], tuple[int, ...], tuple[int, ...]]


def _map(
    prim: str, params: Any, in_shape: tuple[int, ...], out_shape: tuple[int, ...]
) -> MapParts | None:
    rank = len(in_shape)
    ident = tuple(range(rank))
    if prim == "transpose":
        return tuple(params["permutation"]), (), ()
    if prim == "broadcast_in_dim":
        dims = params["broadcast_dimensions"]
        dim_map: list[int | None] = [None] * len(out_shape)
        for i, d in enumerate(dims):
            if in_shape[i] == out_shape[d]:
                dim_map[d] = i
        return (
            tuple(dim_map),
            tuple(i for i, d in enumerate(dims) if in_shape[i] != out_shape[d]),
            (),
        )
    if prim in REDUCTIONS or prim in ("argmax", "argmin"):
        axes = tuple(params["axes"])
        kept = tuple(i for i in ident if i not in axes)
        return (kept, (), axes) if prim in REDUCTIONS else (kept, axes, ())
    if prim == "squeeze":
        return tuple(i for i in ident if i not in params["dimensions"]), (), ()
    if prim == "reshape":
        return reshape_map(in_shape, out_shape)
    if prim in ("cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp"):
        return ident, (params["axis"],), ()
    if (
        prim in ("slice", "pad", "rev", "dynamic_slice", "sort")
        and out_shape
        and rank == len(out_shape)
    ):
        if prim == "rev":
            return ident, tuple(params["dimensions"]), ()
        if prim == "sort":
            return ident, (params["dimension"],), ()
        return ident, tuple(i for i in ident if in_shape[i] != out_shape[i]), ()
    return None


def reshape_map(in_shape: Sequence[int], out_shape: Sequence[int]) -> MapParts:
    """A reshape as a map: each group of dimensions that merge or split carries its major
    (first) dimension's layout to the result's major dimension of the group; the others must
    be whole on each device.

    >>> reshape_map((8, 4, 6), (32, 6))
    ((0, 2), (1,), ())
    >>> reshape_map((32, 6), (8, 4, 6))
    ((0, None, 1), (), ())
    """
    dim_map: list[int | None] = [None] * len(out_shape)
    local: list[int] = []
    for ins, outs in _groups(in_shape, out_shape):
        big_in = [i for i in ins if in_shape[i] > 1]
        big_out = [o for o in outs if out_shape[o] > 1]
        if big_in and big_out:
            dim_map[big_out[0]] = big_in[0]
            local.extend(big_in[1:])
    return tuple(dim_map), tuple(local), ()


def _groups(a: Sequence[int], b: Sequence[int]) -> Iterator[tuple[list[int], list[int]]]:
    i = j = 0
    while i < len(a) or j < len(b):
        gi, gj = [i] if i < len(a) else [], [j] if j < len(b) else []
        pa = a[i] if i < len(a) else 1
        pb = b[j] if j < len(b) else 1
        i, j = i + bool(gi), j + bool(gj)
        while pa != pb and (i < len(a) or j < len(b)):
            if (pa < pb and i < len(a)) or j >= len(b):
                pa *= a[i]
                gi.append(i)
                i += 1
            else:
                pb *= b[j]
                gj.append(j)
                j += 1
        yield gi, gj


def _scan(
    graph: Graph, eqn: Any, path: tuple[int, ...], here: tuple[int, ...], repeat: int
) -> None:
    """Read a scan's body once, marked as running ``length`` times: constants are the outer
    arrays, the carry keeps one layout across iterations, and each ``xs``/``ys`` slice is a map
    of the stacked array without its first dimension."""
    p = eqn.params
    body = p["jaxpr"].jaxpr
    n_consts, n_carry, length = p["num_consts"], p["num_carry"], p["length"]
    source = _source(eqn)
    ins = body.invars
    _alias(graph, path, here, eqn.invars[: n_consts + n_carry], ins[: n_consts + n_carry])
    for outer, inner in zip(
        eqn.invars[n_consts + n_carry :], ins[n_consts + n_carry :], strict=True
    ):
        x = _define(graph, (here, inner), f"scan slice@{source}", source)
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
                )
            )
            _use(graph, src, True)
    _walk(graph, body, here, repeat * length)
    outs = body.outvars
    for k, (outer, inner) in enumerate(zip(eqn.outvars, outs, strict=True)):
        if not _is_var(outer) or not outer.aval.shape if hasattr(outer.aval, "shape") else ():
            continue
        y = _define(graph, (path, outer), f"scan@{source}", source)
        got = _array(graph, here, inner)
        if got is None:
            continue
        if k < n_carry:
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
                )
            )
            _use(graph, got, True)
