"""Any JAX function sharded the way you say: the tutorial's ``pjit`` on today's ``jax.jit``."""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from shardwise._caches import Bounded
from shardwise._errors import ArgumentTypeError, ShapeError, ShardwiseError, SpecError
from shardwise._model.mesh import MeshSpec
from shardwise._model.plan import MAX_PROGRAM_BYTES
from shardwise._model.spec import Spec
from shardwise._program.arguments import traceable_bytes
from shardwise._runtime.distributed import put
from shardwise._versions import context_mesh, sources_in_users_code
from shardwise._xla.check import dot_problems, ensure_dots_summed, jaxpr_dots
from shardwise._xla.dtypes import ARRAYS_HINT, describe_value, x64
from shardwise._xla.explain import Explanation, explain_function
from shardwise._xla.located import hlo_with_lines
from shardwise._xla.meshes import (
    MeshLike,
    auto_twin,
    explicit_hints,
    is_explicit,
    jax_mesh,
    platform,
    typed_on,
)

AUTO = "auto"
"""``out_specs`` that let XLA choose the outputs' layout."""

_CHECKED: Bounded[tuple[Any, ...], bool] = Bounded(512)
"""The sharded functions already checked, with the types of the arguments they were compiled
for: each program is checked once, when it is compiled."""


def _is_spec_leaf(x: object) -> bool:
    return x is None or isinstance(x, PartitionSpec | str | Spec)


class Sharded:
    """A function compiled to run sharded on a mesh: the tutorial's ``pjit(f, ...)`` today.

    Call it like the function. ``explain(*args)`` says what each device holds and which
    collectives XLA inserted. The first call for arguments of new types compiles the program
    (``jax.jit`` then reuses it) and refuses it (:class:`~shardwise.MiscompileError`) if XLA
    left out a sum that a contraction split across devices needs
    (:func:`~shardwise._xla.check.dot_problems`).
    """

    def __init__(
        self, fn: Callable[..., Any], mesh: Mesh, in_specs: Any, out_specs: Any = AUTO
    ) -> None:
        if not callable(fn):
            raise ArgumentTypeError(
                f"shard() needs a function to run sharded, but was given {describe_value(fn)}; "
                "pass a JAX-traceable function, e.g. shard(jnp.dot, mesh, in_specs=...)."
            )
        self.fn = fn
        self.mesh = mesh
        self.mesh_spec = MeshSpec.parse(mesh)
        if not _is_spec_leaf(in_specs) and not isinstance(in_specs, tuple | list):
            in_specs = (in_specs,)  # a pytree of specs (a dict) for the one argument it mirrors
        self.in_specs = in_specs
        self.out_specs = out_specs
        in_shardings = self._shardings(in_specs, "in_specs")
        self._in_shardings = in_shardings
        out_shardings = None if is_auto(out_specs) else self._shardings(out_specs, "out_specs")
        self._jitted = jax.jit(fn, in_shardings=in_shardings, out_shardings=out_shardings)
        self._auto: Sharded | None = None  # on an Explicit mesh: the same on its Auto twin

    def _shardings(self, specs: Any, what: str) -> Any:
        def to_sharding(s: Any) -> NamedSharding:
            spec = Spec.parse(s, what)
            spec.check_axes(self.mesh_spec, what)
            return NamedSharding(self.mesh, spec.to_partition_spec())

        if _is_spec_leaf(specs):
            return to_sharding(specs)
        return jax.tree.map(to_sharding, specs, is_leaf=_is_spec_leaf)

    def _check(self, args: tuple[Any, ...]) -> None:
        leaves = [jax.tree.leaves(arg) for arg in args]  # once per call: read three times
        total = sum(traceable_bytes(_name(self.fn), k, found) for k, found in enumerate(leaves))
        if total > MAX_PROGRAM_BYTES:
            raise ShapeError(
                f"the arguments of {_name(self.fn)} hold {total:,} bytes together, more than one "
                f"program can address: XLA counts bytes in 64-bit integers, and shardwise keeps "
                f"a program's arguments under {MAX_PROGRAM_BYTES:,} bytes (2**62) so that XLA's "
                "sums cannot overflow. Use smaller shapes."
            )
        specs = self.in_specs
        if _is_spec_leaf(specs):
            per_arg = [specs] * len(args)
        elif isinstance(specs, tuple | list):
            if len(specs) != len(args):
                raise ArgumentTypeError(
                    f"{_name(self.fn)} was given {len(args)} argument"
                    f"{'s' if len(args) != 1 else ''} but in_specs has {len(specs)} entries; give "
                    "one spec per positional argument (None for replicated), or one spec for all."
                )
            per_arg = list(specs)
        else:
            return
        for k, (arg, spec) in enumerate(zip(args, per_arg, strict=True)):
            if not _is_spec_leaf(spec):
                _check_structure(self.fn, k, arg, spec)
                continue
            parsed = Spec.parse(spec, f"the spec of argument {k}")
            if parsed.axes and not leaves[k]:
                raise ArgumentTypeError(
                    f"argument {k} of {_name(self.fn)} is {describe_value(arg)}, which holds no "
                    f"array, so its spec {parsed.describe()!r} splits nothing; {ARRAYS_HINT}"
                )
            for leaf in leaves[k]:
                if not hasattr(leaf, "shape") and parsed.axes:
                    raise ArgumentTypeError(
                        f"argument {k} of {_name(self.fn)} holds {describe_value(leaf)}, which "
                        f"JAX reads as a scalar, so its spec {parsed.describe()!r} cannot split "
                        f"it; {ARRAYS_HINT}"
                    )
                shape = tuple(getattr(leaf, "shape", ()))
                parsed.validate(self.mesh_spec, shape, f"argument {k} (shape {shape})")

    def _on_its_mesh(self, args: tuple[Any, ...]) -> contextlib.AbstractContextManager[Any]:
        """Under ``jax.set_mesh`` of the mesh given to ``shard`` while ``fn`` is traced, as
        ``pjit`` ran under its mesh: code that names mesh axes bare (``out_sharding=P(...)``,
        ``with_sharding_constraint(x, P(...))``) finds them (it had found none, or another
        mesh set around the call); inside a trace, where the enclosing ``jax.jit`` runs."""
        traced = any(isinstance(v, jax.core.Tracer) for v in jax.tree.leaves(args))
        if traced or context_mesh() == self.mesh:
            return contextlib.nullcontext()
        return jax.set_mesh(self.mesh)

    def _positional(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        """``args`` and ``kwargs`` bound by the function's signature as positional arguments
        (``in_specs`` are one per positional argument); keyword-only ones are refused."""
        if not kwargs:
            return args
        try:
            bound = inspect.signature(self.fn).bind(*args, **kwargs)
        except (TypeError, ValueError) as e:
            raise ArgumentTypeError(f"{_name(self.fn)} cannot take these arguments: {e}") from None
        if bound.kwargs:
            raise ArgumentTypeError(
                f"{', '.join(map(repr, bound.kwargs))}: keyword-only parameters of "
                f"{_name(self.fn)}, which in_specs (one per positional argument) cannot lay "
                "out; bind them first with functools.partial and shard that."
            )
        return tuple(bound.args)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        args = self._positional(args, kwargs)
        self._check(args)
        out = self._either(args, self._run, lambda auto: auto(*args))
        return typed_on(self.mesh, out) if self._auto is not None else out

    def _either(
        self, args: tuple[Any, ...], run: Callable[..., Any], auto: Callable[..., Any]
    ) -> Any:
        """``run(args)`` on the mesh as given, or ``auto`` of this function on the mesh's Auto
        twin where the Explicit axes refuse code written for ``jax.jit`` (as pjit ran it); the
        Explicit error where both fail."""
        traced = any(isinstance(v, jax.core.Tracer) for v in jax.tree.leaves(args))
        if self._auto is not None:  # (it ran with the axes Auto before)
            return auto(self._auto)
        if not is_explicit(self.mesh) or traced:
            return run(args)
        try:
            return run(args)
        except Exception as e:
            if isinstance(e, ShardwiseError) and not isinstance(e, SpecError):
                raise
            twin = Sharded(self.fn, auto_twin(self.mesh), self.in_specs, self.out_specs)
            try:
                out = auto(twin)
            except Exception:
                raise e from None
            self._auto = twin
            return out

    def _run(self, args: tuple[Any, ...]) -> Any:
        """Run on the mesh as given (on Explicit axes, as code written for them needs)."""
        if is_explicit(self.mesh):  # give host arrays their sharded type before tracing
            args = tuple(jax.device_put(args, self._in_shardings))
        elif self.mesh.is_multi_process and self._per_arg_shardings(args):
            # a mesh across processes: each process creates only its own shards
            args = tuple(
                jax.tree.map(functools.partial(_put_leaf, sharding=s), a)
                for a, s in zip(args, self._per_arg_shardings(args), strict=True)
            )
        else:  # arrays laid out otherwise (jax.jit would refuse them) are moved first
            args = self._moved(args)
        with self._on_its_mesh(args), explicit_hints(), self._out_specs_said(args):
            self._guard(args)
            return self._jitted(*args)

    def _moved(self, args: tuple[Any, ...], shapes: bool = False) -> tuple[Any, ...]:
        """``args`` with each array on the devices laid out otherwise than its spec says
        moved to that layout, as :func:`~shardwise.einsum` moves its operands (``shapes``:
        its shape and type in that layout, all that compiling needs)."""
        per = self._per_arg_shardings(args)

        def move(sharding: NamedSharding, x: Any) -> Any:
            elsewhere = isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer)
            if not elsewhere or x.sharding == sharding:
                return x
            if shapes:
                weak = getattr(x, "weak_type", False)  # (a PRNG key array has none)
                return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding, weak_type=weak)
            return jax.device_put(x, sharding)

        if not per:
            return args
        return tuple(
            jax.tree.map(functools.partial(move, s), a) for s, a in zip(per, args, strict=True)
        )

    def _guard(self, args: tuple[Any, ...]) -> None:
        """Check the program compiled for ``args``, once per argument types (a traced call is
        part of another program)."""
        leaves, tree = jax.tree.flatten(args)
        if any(isinstance(x, jax.core.Tracer) for x in leaves):
            return
        key = (self._jitted, tree, tuple(map(jax.typeof, leaves)), x64())
        if _CHECKED.get(key) is None:
            ensure_dots_summed(
                self._compiled(args)[1],
                f"shard({_name(self.fn)}) with in_specs {self.in_specs!r} on mesh "
                f"{self.mesh_spec.describe()}",
                "Give the operands of that contraction one agreed layout: in_specs that split "
                "its contracted dimension the same way in every operand, or a "
                "jax.lax.with_sharding_constraint on each inside the function (shardwise.plan "
                "and shardwise.einsum lay out every contraction so)",
            )
            _CHECKED.put(key, True)

    def _compiled(self, args: tuple[Any, ...]) -> tuple[Any, tuple[str, ...], str]:
        """The program compiled for ``args``, what :func:`dot_problems` finds wrong in it, and
        its text as read (:func:`hlo_with_lines`); its ops' lines are the user's own (an optax
        loss's, at the line that calls it), in the HLO and in the dots checked alike."""
        with sources_in_users_code():
            traced = self._jitted.trace(*args)
            lowered = traced.lower()
            compiled = lowered.compile()
            dots = jaxpr_dots(traced.jaxpr)
        text = hlo_with_lines(lowered, compiled, dots)
        found = dot_problems(text, dots, self.mesh_spec.shape, platform(self.mesh))
        return compiled, found, text

    def _per_arg_shardings(self, args: tuple[Any, ...]) -> list[NamedSharding]:
        """One sharding per positional argument, when the specs give one per argument."""
        shardings = self._in_shardings
        if isinstance(shardings, NamedSharding):
            return [shardings] * len(args)
        if isinstance(shardings, tuple | list) and all(
            isinstance(s, NamedSharding) for s in shardings
        ):
            return list(shardings)
        return []

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        """``jax.jit(...).lower`` for these arguments (arrays or ``jax.ShapeDtypeStruct``)."""
        args = self._positional(args, kwargs)
        self._check(args)

        def lowered(args: tuple[Any, ...]) -> Any:
            with self._on_its_mesh(args), explicit_hints(), self._out_specs_said(args):
                return self._jitted.lower(*args)

        return self._either(args, lowered, lambda auto: auto.lower(*args))

    @contextlib.contextmanager
    def _out_specs_said(self, args: tuple[Any, ...]) -> Iterator[None]:
        """JAX's error for an output spec with more entries than the output has dimensions,
        said as what was given and how to fix it."""
        try:
            yield
        except ValueError as e:
            if "implies that array axis" in str(e) and not is_auto(self.out_specs):
                try:  # (JAX's error, said by the output's name)
                    self._check_outputs(jax.eval_shape(self.fn, *args))
                except SpecError as said:
                    raise said from None
                raise
            if "pytree structure" in str(e) and "out_shardings" in str(e):
                out = jax.eval_shape(self.fn, *args)
                kind = type(out).__name__ if isinstance(out, tuple | list | dict) else ""
                given = type(self.out_specs).__name__
                hint = f" (it returns a {kind}; give a {kind} of specs, not a {given})"
                raise SpecError(
                    f"out_specs {self.out_specs!r} do not match the result of {_name(self.fn)}, "
                    f"structured as {jax.tree.structure(out)}"
                    f"{hint if kind and kind != given else ''}: give one spec per output, in "
                    "the result's structure, or out_specs='auto' to let XLA choose."
                ) from None
            if "sharding annotation" not in str(e) or "rank" not in str(e):
                raise
            shapes = [tuple(o.shape) for o in jax.tree.leaves(jax.eval_shape(self.fn, *args))]
            raise SpecError(
                f"out_specs {self.out_specs!r} do not fit the result of {_name(self.fn)}, of "
                f"shape{'s' if len(shapes) != 1 else ''} {', '.join(map(str, shapes))}: a spec "
                "has more entries than its output has dimensions; give each output a spec with "
                "at most one entry per dimension, or out_specs='auto' to let XLA choose."
            ) from None

    def _check_outputs(self, out: Any) -> None:
        """Refuse an out-spec that does not divide its output's dimensions, naming the output
        by its path in the result (:class:`~shardwise.IndivisibleError`)."""
        specs, keystr = self.out_specs, jax.tree_util.keystr
        if _is_spec_leaf(specs):
            per, parts = [((), specs)], [out]
        else:
            per = jax.tree_util.tree_flatten_with_path(specs, is_leaf=_is_spec_leaf)[0]
            tree: Any = jax.tree.structure(specs, is_leaf=_is_spec_leaf)
            parts = tree.flatten_up_to(out)
        for (at, spec), part in zip(per, parts, strict=True):
            parsed = Spec.parse(spec, "out_specs")
            for path, leaf in jax.tree_util.tree_flatten_with_path(part)[0]:
                where = f"the output{keystr(at)}{keystr(path)} of {_name(self.fn)}"
                parsed.validate(self.mesh_spec, tuple(leaf.shape), f"{where} (shape {leaf.shape})")

    def explain(self, *args: Any, **kwargs: Any) -> Explanation:
        """Compile for ``args`` (arrays or ``jax.ShapeDtypeStruct``) and explain each device's
        shards, every collective with its cause and source line, memory and compute, and any
        sum XLA left out (``problems``)."""
        args = self._positional(args, kwargs)
        self._check(args)
        args = self._moved(args, shapes=True)  # (as a call moves them: compiled for the specs)
        with self._on_its_mesh(args), explicit_hints(), self._out_specs_said(args):
            compiled, problems, text = self._compiled(args)
        return explain_function(compiled, args, self.mesh, self.fn, problems, text)


def _check_structure(fn: Callable[..., Any], k: int, arg: Any, spec: Any) -> None:
    """Refuse specs for argument ``k`` whose pytree is not a prefix of the argument's (JAX's
    own error dumps both trees and its internals)."""
    try:
        jax.tree.map(lambda *_: None, spec, arg, is_leaf=_is_spec_leaf)
    except (ValueError, TypeError):
        want = jax.tree.structure(arg)
        got = jax.tree.structure(spec, is_leaf=_is_spec_leaf)
        raise SpecError(
            f"in_specs for argument {k} of {_name(fn)} are structured as {got}, but the "
            f"argument is {want}: give a spec per leaf in the argument's structure (the same "
            "keys), or one spec for the whole argument."
        ) from None


def _put_leaf(x: Any, sharding: NamedSharding) -> Any:
    return put(x, sharding) if hasattr(x, "shape") and hasattr(x, "dtype") else x


def is_auto(x: Any) -> bool:
    return isinstance(x, str) and x == AUTO


def _name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__name__", "the function")


def shard(
    fn: Callable[..., Any],
    mesh: MeshLike,
    in_specs: Any,
    out_specs: Any = AUTO,
) -> Sharded:
    """Run ``fn`` sharded on ``mesh``: the tutorial's ``pjit`` on today's ``jax.jit``.

    Args:
        fn: any JAX-traceable function.
        mesh: a JAX ``Mesh`` or a description such as ``"devices=8"``.
        in_specs: one spec per positional argument (``P('devices')``, ``None`` for replicated,
            or text like ``"x,y"``), a pytree of them, or one spec for all arguments.
        out_specs: the same for the outputs; ``"auto"`` lets XLA choose.

    >>> import jax.numpy as jnp, numpy as np
    >>> from jax.sharding import PartitionSpec as P
    >>> dot = shard(jax.vmap(jnp.dot), "devices=8", in_specs=(P("devices"), None),
    ...             out_specs=P("devices"))
    >>> v = np.ones((16, 3), np.float32)
    >>> out = dot(v, v)
    >>> out.shape, out.sharding.spec
    ((16,), P('devices',))
    """
    return Sharded(fn, jax_mesh(mesh), in_specs, out_specs)
