"""The arguments a sharded program is called with, checked: a plan's against those it was
planned for (their shapes and types, whether they still hold their buffers, the name of each
top-level argument), and ``shard``'s as what JAX can trace."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
from jax import dtypes

from shardwise._errors import ArgumentError, ArgumentTypeError
from shardwise._xla.dtypes import ARRAYS_HINT, describe_value

if TYPE_CHECKING:
    from shardwise._program.plans import ProgramPlan


def planned_types(plan: ProgramPlan) -> list[tuple[tuple[int, ...], str]]:
    """Each input's shape and type, as the plan was made for it."""
    return [(plan.graph.values[v].shape, plan.graph.values[v].dtype) for v in plan.graph.inputs]


def check_arguments(names: Sequence[str], leaves: Sequence[Any], shapes: Sequence[Any]) -> None:
    """Refuse an argument of another shape or type than the plan's (it had run on arrays of
    other shapes, failed in JAX's sharding code or inside the program), or one deleted (given
    to an earlier call that took its buffer: JAX's CPU runtime crashed the process)."""
    for name, x, (shape, dtype) in zip(names, leaves, shapes, strict=True):
        if not hasattr(x, "shape") or not hasattr(x, "dtype"):  # (a float: JAX's rank error)
            if (
                isinstance(x, bool | int | float | complex)
                and not shape
                and (_number_type(x) == dtype)
            ):
                continue  # (a number where a scalar is planned, TrainState.step: as jax.jit)
            raise ArgumentError(
                f"{name} is {describe_value(x)}, but the plan was made for a {dtype} array of "
                f"shape {tuple(shape)}: pass one (jnp.asarray(x, '{dtype}'))."
            )
        if isinstance(x, jax.core.Tracer):  # (a call inside jax.jit, grad or vmap)
            continue
        if getattr(x, "is_deleted", lambda: False)():
            raise ArgumentError(
                f"{name} was deleted: an earlier call took its buffer (a plan made with "
                "donate_argnums gives it to the results). Pass that call's results instead."
            )
        if hasattr(x, "shape") and tuple(x.shape) != tuple(shape):
            raise ArgumentError(
                f"{name} has shape {tuple(x.shape)}, but the plan was made for {tuple(shape)}: "
                "plan again with arrays of these shapes."
            )
        kind = getattr(x, "dtype", None)
        if kind is not None and jnp.issubdtype(kind, dtypes.extended):
            continue  # (a PRNG key: its implementation is the program's)
        if kind is not None and str(dtypes.canonicalize_dtype(kind)) != dtype:
            raise ArgumentError(
                f"{name} is {kind}, but the plan was made for {dtype}: cast it "
                f"(.astype('{dtype}')), or plan again with arrays of this type."
            )


def _number_type(x: bool | int | float | complex) -> str:
    """The type JAX gives a Python number (``""`` where it fits none: an int past int32)."""
    try:
        return str(jax.typeof(x).dtype)  # (as jax.jit takes it: int64 with x64)
    except OverflowError:
        return ""


def donated_leaves(tree: Any, argnums: Sequence[int]) -> frozenset[int]:
    """The leaves, by position, of the top-level arguments ``argnums`` of the arguments'
    structure ``tree``."""
    out: set[int] = set()
    at = 0
    for k, child in enumerate(tree.children()):
        if k in argnums:
            out.update(range(at, at + child.num_leaves))
        at += child.num_leaves
    return frozenset(out)


def donated_once(names: Sequence[str], leaves: Sequence[Any], donated: frozenset[int]) -> None:
    """Refuse a donated array given twice (a tied weight, in two places of the donated
    parameters): JAX's CPU runtime crashed the process ("Attempt to donate the same buffer
    twice", then a segmentation fault)."""
    seen: dict[int, int] = {}  # (each array, by id: the first leaf it is)
    for k, x in enumerate(leaves):
        if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer):
            first = seen.setdefault(id(x), k)
            if first != k and (k in donated or first in donated):
                raise ArgumentError(
                    f"{names[first]} and {names[k]} are the same array, and the program takes "
                    "a donated buffer: give one of them a copy (jnp.array(x, copy=True)), or "
                    "plan without donate_argnums."
                )


def parameter_names(names: Sequence[str], tree: Any, given: Sequence[str] = ()) -> list[str]:
    """The name of each top-level argument of ``tree`` (the arguments' structure): ``given``
    (the function's, :attr:`~shardwise._program.graph.Graph.parameters`) where it names each,
    else from its leaves' ``names`` (``params['w1']`` is of ``params``; ``args[k]`` where it
    has none)."""
    if given and len(given) == len(tree.children()):
        return list(given)
    out, at = [], 0
    for k, child in enumerate(tree.children()):
        first = names[at] if child.num_leaves else f"args[{k}]"
        root = re.match(r"args\[\d+\]|[^\[.]+", first)
        out.append(root.group(0) if root else first)
        at += child.num_leaves
    return out


def first_difference(expected: Any, given: tuple[Any, ...], params: Sequence[str]) -> str:
    """Where arguments ``given`` first differ from the structure ``expected`` (of the
    arguments' tuple), in words, by the parameters' names ``params``.

    >>> import jax
    >>> planned = jax.tree.structure(({"w1": 0, "w2": 0}, 0))
    >>> first_difference(planned, ({"w1": 0}, 0), ["p", "x"])
    "p['w2'] is missing"
    >>> first_difference(planned, ({"w1": 0, "w2": 0, "b": 0}, 0), ["p", "x"])
    "p['b'] is not in the plan"
    """

    def paths(tree: Any) -> list[str]:
        out = []
        for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]:
            k = getattr(path[0], "idx", None) if path else None
            head = params[k] if isinstance(k, int) and k < len(params) else ""
            out.append(head + jax.tree_util.keystr(path[1:]))
        return out

    planned = paths(expected.unflatten([0] * expected.num_leaves))
    found = paths(given)
    for ours, theirs, said in (
        (planned, found, "is missing"),
        (found, planned, "is not in the plan"),
    ):
        others = set(theirs)
        odd = [p for p in ours if p not in others]
        if odd:
            more = f" (and {len(odd) - 1} more)" if len(odd) > 1 else ""
            return f"{odd[0]} {said}{more}"
    return "the same leaves, held in other containers (a dict for a State, a list for a tuple)"


def traceable_bytes(name: str, k: int, leaves: list[Any]) -> int:
    """The bytes of argument ``k`` of the function ``name`` given to ``shard`` (its pytree's
    ``leaves``); refuse one JAX cannot trace: a leaf that is neither an array (``shape`` and
    ``dtype``) nor a Python number (a string, say). Pytrees of Python numbers and ``None`` are
    JAX's own and pass (a spec that splits them does not)."""
    arrays = [hasattr(leaf, "shape") and hasattr(leaf, "dtype") for leaf in leaves]
    for leaf, array in zip(leaves, arrays, strict=True):
        if not array and not isinstance(leaf, int | float | complex):  # (bool is an int)
            fix = (
                "a setting that is not an array is bound first, as jax.jit's static arguments "
                "are: shard(functools.partial(fn, mode=...), ...)"
                if isinstance(leaf, str) else ARRAYS_HINT
            )  # fmt: skip
            raise ArgumentTypeError(
                f"argument {k} of {name} is or holds {describe_value(leaf)}, which JAX "
                f"cannot trace; {fix}"
            )
    return sum(
        math.prod(leaf.shape) * getattr(leaf.dtype, "itemsize", 1)
        for leaf, array in zip(leaves, arrays, strict=True)
        if array and all(isinstance(n, int) for n in leaf.shape)  # (not symbolic sizes)
    )


def moved_text(held: Any, target: Any) -> str:
    """A move from the sharding ``held`` to ``target`` in words: their specs, and where those
    are the same, what else differs (the mesh's axes, their types, the memory, or the
    devices' order).

    >>> from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
    >>> auto = jax.make_mesh((1,), ("x",), axis_types=(AxisType.Auto,))
    >>> explicit = jax.make_mesh((1,), ("x",), axis_types=(AxisType.Explicit,))
    >>> moved_text(NamedSharding(auto, P("x")), NamedSharding(explicit, P("x")))
    "P('x',) on axes x:Auto → P('x',) on axes x:Explicit"
    """
    was, now = _spec_text(held), _spec_text(target)
    if was != now:
        return f"{was} → {now}"
    old, new = getattr(held, "mesh", None), getattr(target, "mesh", None)
    if old is not None and new is not None:
        if dict(old.shape) != dict(new.shape):
            return f"{was} on mesh {_axes(old, False)} → {now} on mesh {_axes(new, False)}"
        if tuple(old.axis_types) != tuple(new.axis_types):
            return f"{was} on axes {_axes(old, True)} → {now} on axes {_axes(new, True)}"
    kinds = getattr(held, "memory_kind", None), getattr(target, "memory_kind", None)
    if kinds[0] != kinds[1]:
        return f"{was} in {kinds[0]} memory → {now} in {kinds[1]} memory"
    return f"{was} on other devices, or in another order → {now} on the plan's mesh"


def _axes(mesh: Any, types: bool) -> str:
    """``data=2,model=4``, or with ``types`` ``data:Auto,model:Explicit``."""
    return ",".join(f"{a}:{t.name}" if types else f"{a}={n}"
                    for a, n, t in zip(mesh.axis_names, mesh.axis_sizes, mesh.axis_types,
                                       strict=True))  # fmt: skip


def _spec_text(sharding: Any) -> str:
    spec = getattr(sharding, "spec", None)
    return str(spec) if spec is not None else type(sharding).__name__
