"""One interpreter over jaxprs, and what the planner reads off their equations.

:class:`Walker` walks a jaxpr equation by equation, each value under a :data:`Key` (its
variable and the path of equation numbers through inlined calls): a call's body is walked in
place (:mod:`~shardwise._program.rules` says which primitives are calls), a ``scan`` goes to
:meth:`Walker.scan`, a ``cond`` to :meth:`Walker.cond` (each branch's body at its own path),
and every other equation to :meth:`Walker.equation`. The graph builder
(:mod:`~shardwise._program.graph`, its values the graph's arrays) and the plan applier
(:mod:`~shardwise._program.apply`, its values traced arrays) are its two visitors, so both
see the same equations under the same keys.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Sequence
from typing import Any, Generic, TypeAlias, TypeVar

import jax
import jax.extend.core as jcore
from jax._src import source_info_util
from jax.sharding import NamedSharding, PartitionSpec

from shardwise._errors import ArgumentTypeError
from shardwise._model.spec import Spec
from shardwise._program.rules import rule_of
from shardwise._versions import DropVar
from shardwise._xla.names import positional_names, top_names

Path: TypeAlias = tuple[int, ...]
Key: TypeAlias = tuple[Path, Any]
"""Where a jaxpr variable lives: the path of equation numbers through inlined calls, and the
variable itself (one inner jaxpr may be inlined at several places)."""
T = TypeVar("T")


class Walker(Generic[T]):
    """Walks jaxprs; subclasses say what a value is and what each equation does to values.

    :attr:`env` holds each variable's value by :data:`Key`; a value of ``None`` is never
    stored (a literal or constant the subclass does not keep)."""

    def __init__(self) -> None:
        self.env: dict[Key, T] = {}

    def constant(self, value: Any) -> T | None:
        """The value of a literal's or a closed-over constant's ``value``."""
        return None

    def bind(self, key: Key, value: T | None) -> None:
        if value is not None:
            self.env[key] = value

    def read(self, path: Path, var: Any) -> T | None:
        if not is_var(var):
            return self.constant(var.val) if isinstance(var, jcore.Literal) else None
        return self.env.get((path, var))

    def scope(self, eqn: Any) -> contextlib.AbstractContextManager[Any]:
        """What to be inside of while ``eqn`` (any equation, a call's included) is walked."""
        return contextlib.nullcontext()

    def equation(self, eqn: Any, path: Path, here: Path, ins: list[T | None]) -> Sequence[Any]:
        """The values of ``eqn``'s results, from those of its operands ``ins``."""
        raise NotImplementedError

    def scan(self, eqn: Any, path: Path, here: Path, ins: list[T | None]) -> Sequence[Any]:
        """The values of a ``scan``'s results (its body is the jaxpr at path ``here``)."""
        raise NotImplementedError

    def cond(self, eqn: Any, path: Path, here: Path, ins: list[T | None]) -> Sequence[Any]:
        """The values of a ``cond``'s results (branch ``k``'s body is the jaxpr at path
        ``(*here, k)``, its operands ``ins[1:]``); a walker that does not look inside reads it
        as one equation."""
        return self.equation(eqn, path, here, ins)

    def call(
        self, eqn: Any, here: Path, body: Any, consts: Sequence[Any], ins: list[T | None]
    ) -> Sequence[Any]:
        """A call's results: its body walked at path ``here``."""
        return self.run(body, consts, here, ins)

    def run(
        self, jaxpr: Any, consts: Sequence[Any], path: Path, ins: Sequence[T | None]
    ) -> list[Any]:
        """Walk ``jaxpr`` at ``path``, its invars bound to ``ins``; the values of its outvars."""
        for var, c in zip(jaxpr.constvars, consts, strict=True):
            self.bind((path, var), self.constant(c))
        for var, x in zip(jaxpr.invars, ins, strict=True):
            self.bind((path, var), x)
        for k, eqn in enumerate(jaxpr.eqns):
            here = (*path, k)
            values = [self.read(path, v) for v in eqn.invars]
            with self.scope(eqn):  # its results too are bound (and laid out) as its own
                outs = self._dispatch(eqn, path, here, values)
                for var, x in zip(eqn.outvars, outs, strict=True):
                    if is_var(var):
                        self.bind((path, var), x)
        return [self.read(path, v) for v in jaxpr.outvars]

    def _dispatch(self, eqn: Any, path: Path, here: Path, ins: list[T | None]) -> Sequence[Any]:
        rule = rule_of(eqn.primitive.name)
        if rule.kind == "call" and rule.callee in eqn.params:
            inner = eqn.params[rule.callee]
            body = getattr(inner, "jaxpr", inner)
            return self.call(eqn, here, body, getattr(inner, "consts", ()), ins)
        if rule.kind == "scan":
            return self.scan(eqn, path, here, ins)
        if rule.kind == "cond":
            return self.cond(eqn, path, here, ins)
        return self.equation(eqn, path, here, ins)


def is_var(v: Any) -> bool:
    """Whether a jaxpr operand is a variable (not a literal, not a dropped result)."""
    return not isinstance(v, jcore.Literal) and not isinstance(v, DropVar)


def rank(var: Any) -> int:
    """A jaxpr variable's number of dimensions (0 for a scalar or a token)."""
    return len(getattr(var.aval, "shape", None) or ())


def source_of(eqn: Any) -> str:
    """``file:line`` of the user's code that made ``eqn`` (``""`` where none is known)."""
    return user_line(eqn.source_info.traceback)


def user_line(traceback: Any) -> str:
    """``file:line`` of the first frame of ``traceback`` in the user's code (``""``: none)."""
    frame = source_info_util.user_frame(traceback)
    if frame is None:
        return ""
    return f"{frame.file_name.rsplit('/', 1)[-1]}:{frame.start_line}"


def module_of(eqn: Any) -> str:
    """The library module that made ``eqn``, from its name stack (``MLP/Dense_0`` in Flax
    Linen; ``""`` where the library gives none), without JAX's transform wrappers
    (``transpose(jvp(MLP))/Dense_0`` is ``MLP/Dense_0``)."""
    stack = str(eqn.source_info.name_stack)
    return "/".join(p for p in _WRAPPERS.sub("", stack).split("/") if p)


_WRAPPERS = re.compile(r"\w+\(|\)")


def asked(eqn: Any) -> list[tuple[int, Spec, frozenset[int], tuple[tuple[str, int], ...]]]:
    """The layouts a placement equation (``sharding_constraint``, ``reshard``, ``device_put``)
    asks its operands to have, where it names one as a ``NamedSharding``: each operand's
    position, the spec, the dimensions it leaves open (``P.UNCONSTRAINED``, unsharded in the
    spec) and the sharding's mesh axes (name, size)."""
    p = eqn.params
    given = p["devices"] if "devices" in p else (p.get("sharding", p.get("dst_sharding")),)
    out = []
    for k, sharding in enumerate(given):
        if not isinstance(sharding, NamedSharding):
            continue
        entries = tuple(sharding.spec)
        free = frozenset(p.get("unconstrained_dims", ())) | {
            d for d, e in enumerate(entries) if e is PartitionSpec.UNCONSTRAINED
        }
        spec = Spec.parse(PartitionSpec(*(None if d in free else e for d, e in enumerate(entries))))
        mesh = tuple((str(a), int(n)) for a, n in sharding.mesh.shape.items())
        out.append((k, spec, free, mesh))
    return out


def named(prim: str, source: str) -> str:
    """An intermediate's name: the op that makes it and where (``dot_general@model.py:12``)."""
    return f"{prim}@{source}" if source else prim


def made_by(name: str) -> str:
    """The op an intermediate's name (:func:`named`) says made it.

    >>> made_by(named("convert_element_type", "model.py:7")), made_by("x")
    ('convert_element_type', 'x')
    """
    return name.partition("@")[0]


def abstract(
    x: Any,
    where: str = "an argument leaf",
    inside: bool = False,
    name: str = "",
    sharded: bool = False,
) -> jax.ShapeDtypeStruct:
    """An argument leaf as a ``jax.ShapeDtypeStruct``; anything but an array is refused,
    saying ``where`` it is (``inside`` a pytree, or an argument of its own) and how to bind
    it by ``name`` (its parameter's, or its key's). With ``sharded``, an array keeps its
    ``NamedSharding`` (code that asserts its arguments' shardings on Explicit axes)."""
    if isinstance(x, jax.ShapeDtypeStruct):
        return x
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        kept = getattr(x, "sharding", None) if sharded else None
        if isinstance(kept, NamedSharding):
            return jax.ShapeDtypeStruct(tuple(x.shape), x.dtype, sharding=kept)
        return jax.ShapeDtypeStruct(tuple(x.shape), x.dtype)
    if inside and type(x) in NUMBER_DTYPES:  # (Flax's TrainState.step, 0: as jax.jit takes it)
        try:
            typed = jax.typeof(x)  # (its type as jax.jit gives it: int64 with x64, bool strong)
        except OverflowError:
            raise ArgumentTypeError(
                f"{where} is {x!r}, too large for JAX's {NUMBER_DTYPES[type(x)]}: pass it as an "
                "array of a wider type (with jax_enable_x64), or as a float."
            ) from None
        return jax.ShapeDtypeStruct((), typed.dtype, weak_type=typed.weak_type)
    shown = repr(x)
    shown = f" {shown}" if len(shown) <= 60 else ""
    fix = _fix(x, shown.strip(), inside, name if name.isidentifier() else "")
    raise ArgumentTypeError(
        f"{where} is {type(x).__name__}{shown}, not an array; plan takes arrays or "
        "jax.ShapeDtypeStruct leaves, e.g. jax.ShapeDtypeStruct((256, 1024), 'float32')." + fix
    )


NUMBER_DTYPES = {bool: "bool", int: "int32", float: "float32", complex: "complex64"}
"""The dtype JAX gives a Python number, by its type."""


def _fix(x: Any, shown: str, inside: bool, name: str = "") -> str:
    """How to plan over ``x`` (``shown`` as its repr, or ``""``), a leaf that is not an array
    of a pytree argument (``inside``) or a whole argument: as an array where it is a number,
    bound with ``functools.partial``, or (in a model) split off with Equinox."""
    dtype = NUMBER_DTYPES.get(type(x))
    array = (
        f" Pass it as an array, jnp.asarray({shown or '...'}) (or "
        f"jax.ShapeDtypeStruct((), '{dtype}') for its shape alone), or "
        if dtype is not None
        else " "
    )
    if not inside:
        return (
            f"{array}{'b' if dtype else 'B'}ind it first, as jax.jit's static arguments are "
            f"(a string, a flag, a size): plan(functools.partial(fn, {name or 'mode'}=...), "
            "x, ...)."
        )
    value = shown if 0 < len(shown) <= 20 else "..."
    return (
        f"{array}{'t' if dtype else 'T'}ake it out of the argument and close over it, as "
        f"jax.jit's static arguments are bound: plan(functools.partial(fn, {name or 'scale'}="
        f"{value}), ...), fn reading {name or 'scale'} where it read the leaf. A model whose "
        "leaves are not all arrays (an Equinox module's activation function) is split: params, "
        "static = eqx.partition(model, eqx.is_array), and the function planned over params "
        "puts it together again with eqx.combine(params, static)."
    )


def abstract_args(args: Sequence[Any], fn: Any, sharded: bool = False) -> list[Any]:
    """Each of ``args`` (pytrees) with its leaves :func:`abstract` (``sharded``: keeping their
    shardings), a leaf that is not an array refused naming its argument (by ``fn``'s
    parameter where it has one)."""
    names, bases = positional_names(fn), top_names(fn, len(args))
    out = []
    for k, arg in enumerate(args):
        name = f" ({names[k]})" if k < len(names) else ""
        where = f"argument {k}{name} of {getattr(fn, '__name__', 'the function')}"

        def leaf(path: Any, x: Any, k: int = k, where: str = where) -> jax.ShapeDtypeStruct:
            if not path:
                return abstract(x, where, name=bases[k], sharded=sharded)  # (no parameter)
            base = bases[k]
            key = path[-1]
            last = str(getattr(key, "key", getattr(key, "name", "")))
            where = f"{base}{jax.tree_util.keystr(path)} in {where}"
            return abstract(x, where, True, last, sharded)

        out.append(jax.tree_util.tree_map_with_path(leaf, arg))
    return out
