"""The public entry points: sharded einsum, the tutorial's pjit as :func:`shard`, and explain."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from shardwise._data.dask import dask_einsum, dask_mean, is_dask
from shardwise._errors import ArgumentError, MiscompileError, SpecError
from shardwise._model.mesh import MeshSpec
from shardwise._model.mesh import mesh as make_mesh
from shardwise._model.op import Op
from shardwise._model.plan import Plan
from shardwise._model.spec import LayoutLike, Spec, SpecLike
from shardwise._runtime.distributed import put
from shardwise._runtime.hostmem import keep_freed_memory_warm
from shardwise._xla.check import check_einsum
from shardwise._xla.explain import (
    Explanation,
    compile_plan,
    compile_sound,
    explain_compiled,
    explain_function,
)
from shardwise._xla.lower import divided, is_explicit, jitted, named

MeshLike = Mesh | MeshSpec | str | Mapping[str, int]
log = logging.getLogger("shardwise")


def _jax_mesh(value: MeshLike) -> Mesh:
    return value if isinstance(value, Mesh) else make_mesh(value)


def _supported(dtype: Any, what: str = "the operands") -> np.dtype[Any]:
    """``dtype`` as a NumPy dtype, if JAX computes in it; else an error naming it and the fix."""
    try:
        given: np.dtype[Any] = np.dtype(jnp.dtype(dtype))
    except TypeError:
        raise ArgumentError(
            f"dtype {dtype!r} of {what} is not a dtype; use a name like float32 or bfloat16."
        ) from None
    if not given.isnative:
        raise ArgumentError(
            f"the dtype of {what}, {given.str!r}, is not in this machine's byte order; JAX "
            f"computes only in native order. Convert first: "
            f"a.astype(a.dtype.newbyteorder('='))."
        )
    if given != np.bool_ and not jnp.issubdtype(given, jnp.number):
        raise ArgumentError(
            f"the dtype of {what} is {given} ({_kind(given)}); an einsum needs numbers: booleans, "
            "integers, floating point (bfloat16 to float64) or complex. Convert first, e.g. "
            "a.astype(np.float32)."
        )
    return given


def _kind(dtype: np.dtype[Any]) -> str:
    if dtype.fields is not None:
        return "a structured dtype"
    return {
        "O": "Python objects",
        "U": "strings",
        "S": "bytes",
        "M": "dates",
        "m": "time differences",
    }.get(dtype.kind, "not a number")


def _dtype(arrays: Sequence[Any]) -> np.dtype[Any]:
    """The dtype NumPy's einsum gives these operands (JAX's promotion where a type is JAX's
    own, such as bfloat16); 64-bit types are computed in 64 bits (:func:`wide`)."""
    return _result_dtype(tuple(a.dtype for a in arrays))


@functools.lru_cache(maxsize=64)
def _result_dtype(given: tuple[Any, ...]) -> np.dtype[Any]:
    dtypes = [_supported(d, f"operand {k}") for k, d in enumerate(given)]
    if all(d.kind in "biufc" for d in dtypes):
        return np.result_type(*dtypes)
    return np.dtype(functools.reduce(jnp.promote_types, dtypes))


def wide(dtype: Any) -> contextlib.AbstractContextManager[Any]:
    """JAX's 64-bit mode for as long as shardwise builds and runs a program in ``dtype``, when
    that is a 64-bit type (float64, int64, uint64, complex128) that JAX would otherwise narrow.

    >>> import numpy as np
    >>> with wide("int64"):
    ...     str(jnp.asarray(np.int64(2) ** 40).dtype)
    'int64'
    """
    given = dtype if isinstance(dtype, np.dtype) else np.dtype(jnp.dtype(dtype))
    if given.itemsize < 8 or not _narrowed(given, bool(jax.config.read("jax_enable_x64"))):
        return contextlib.nullcontext()
    return jax.enable_x64(True)  # type: ignore[no-any-return]


@functools.lru_cache(maxsize=64)
def _narrowed(dtype: np.dtype[Any], x64: bool) -> bool:
    """Whether JAX, with 64-bit mode ``x64``, would compute in a narrower type than ``dtype``."""
    return bool(np.dtype(jax.dtypes.canonicalize_dtype(dtype)) != dtype)


def auto_layout(
    equation: str, shapes: Sequence[Sequence[int]], dtype: Any, mesh: Mesh
) -> tuple[list[Spec], Spec, str]:
    """The planner's best strategy for these shapes on ``mesh``: in_specs, out_spec, and why.

    Uses the calibrated profile of these devices if ``shardwise calibrate`` stored one, else a
    built-in profile for the platform.
    """
    in_specs, out_spec, why = _auto_layout(
        equation, tuple(tuple(int(n) for n in s) for s in shapes), np.dtype(dtype).name, mesh
    )
    log.info("auto layout for %s on mesh %s: %s", equation, MeshSpec.parse(mesh).describe(), why)
    return list(in_specs), out_spec, why


@functools.lru_cache(maxsize=256)
def _auto_layout(
    equation: str, shapes: tuple[tuple[int, ...], ...], dtype: str, mesh: Mesh
) -> tuple[tuple[Spec, ...], Spec, str]:
    from shardwise._model.profile import default_profile
    from shardwise._planner.einsum import rank

    spec = MeshSpec.parse(mesh)
    op = Op.parse(equation)
    profile = default_profile(mesh.devices.flat[0].platform, spec.size)
    report = rank(op, shapes, spec, dtype, profile)
    best = report.best.strategy
    return best.in_specs(op), best.out_spec, report.why()


def _make_plan(
    equation: str,
    shapes: Sequence[Sequence[int]],
    dtype: Any,
    jmesh: Mesh,
    layout: LayoutLike | Literal["auto"] | None,
    in_specs: Sequence[SpecLike] | None,
    out_spec: SpecLike | Literal["infer"],
    mode: str,
) -> tuple[Plan, str | None]:
    why = None
    if isinstance(layout, str) and layout == "auto":
        if in_specs is not None:
            raise ArgumentError("give layout='auto' or in_specs=, not both.")
        in_specs, out_spec, why = auto_layout(equation, shapes, dtype, jmesh)
        layout = None
    plan = Plan.make(
        equation,
        shapes,
        mesh=MeshSpec.parse(jmesh),
        dtype=dtype,
        layout=layout,
        in_specs=in_specs,
        out_spec=out_spec,
        mode=mode,
    )
    return plan, why


def plan_einsum(
    equation: str,
    *arrays: Any,
    mesh: MeshLike,
    layout: LayoutLike | Literal["auto"] | None = None,
    in_specs: Sequence[SpecLike] | None = None,
    out_spec: SpecLike | Literal["infer"] = "infer",
    mode: str = "auto",
) -> tuple[Plan, Mesh]:
    """Validate a sharded einsum over ``arrays`` (anything with ``.shape`` and ``.dtype``)."""
    jmesh = _jax_mesh(mesh)
    plan, _ = _make_plan(
        equation,
        [tuple(a.shape) for a in arrays],
        _dtype(arrays) if arrays else np.dtype("float32"),
        jmesh,
        layout,
        in_specs,
        out_spec,
        mode,
    )
    return plan, jmesh


def shardings(plan: Plan, mesh: Mesh) -> tuple[NamedSharding, ...]:
    """Each operand's planned ``NamedSharding``."""
    return tuple(named(mesh, s) for s in plan.in_specs)


def place(
    plan: Plan,
    mesh: Mesh,
    arrays: Sequence[Any],
    targets: Sequence[NamedSharding] | None = None,
) -> list[jax.Array]:
    """Put each operand on the devices with its planned sharding (a no-op if already there).
    On CPU devices this also keeps freed memory warm for their outputs
    (:func:`~shardwise._runtime.hostmem.keep_freed_memory_warm`; streaming, which holds to a memory
    budget, does not place arrays this way)."""
    if mesh.devices.flat[0].platform == "cpu":
        keep_freed_memory_warm()
    placed = []
    dtype = np.dtype(plan.dtype)
    for array, target in zip(arrays, targets or shardings(plan, mesh), strict=True):
        if array.dtype != dtype:
            array = array.astype(dtype)
        if isinstance(array, jax.core.Tracer):  # inside jit, grad or vmap: lay it out
            placed.append(jax.lax.with_sharding_constraint(array, target))
        elif isinstance(array, jax.Array) and array.sharding == target:
            placed.append(array)
        else:
            placed.append(put(array, target))
    return placed


_PLANS: dict[tuple[Any, ...], tuple[Plan, Callable[..., jax.Array], tuple[NamedSharding, ...]]] = {}
"""Validated plans and their programs by call signature: repeated calls skip parsing,
validation and compilation."""


def _plan_key(
    equation: str, arrays: Sequence[Any], mesh: Mesh, *options: Any
) -> tuple[Any, ...] | None:
    """A hashable key for a call, or ``None`` when an option cannot be hashed."""
    try:
        key = (
            equation,
            tuple((tuple(a.shape), a.dtype) for a in arrays),
            mesh,
            *(repr(o) for o in options),
        )
        hash(key)
    except TypeError:
        return None
    return key


def einsum(
    equation: str,
    *arrays: Any,
    mesh: MeshLike = "auto",
    layout: LayoutLike | Literal["auto"] | None = None,
    in_specs: Sequence[SpecLike] | None = None,
    out_spec: SpecLike | Literal["infer"] = "infer",
    mode: str = "auto",
    precision: Any = None,
    check: bool | None = None,
) -> Any:
    """Compute an einsum sharded over a device mesh.

    Give the layout either per index (``layout="n=x,d=y"``) or per operand
    (``in_specs=[P('x', 'y'), "x,y"]``, plus ``out_spec``; by default the output keeps the
    axes the inputs split, and contracted axes are summed away).

    Args:
        equation: an einsum equation, e.g. ``"nd,nd->n"``.
        *arrays: NumPy or JAX arrays.
        mesh: a JAX ``Mesh`` or a description such as ``"x=2,y=4"``; by default every
            device on one axis.
        layout: index → mesh axes, or ``"auto"`` for the planner's best strategy (logged on
            the ``shardwise`` logger with the reason).
        in_specs: one partition spec per operand (``None`` for replicated).
        out_spec: the output's partition spec; ``"infer"`` derives it.
        mode: ``"auto"`` (``jax.jit``; XLA inserts collectives) or ``"manual"``
            (``shard_map`` with a local einsum and an explicit ``psum``).
        precision: passed to ``jnp.einsum``.
        check: also compute the einsum with NumPy (in float64, or exactly for integers) and
            raise :class:`~shardwise.MiscompileError` if the result is off by more than
            rounding allows. It costs a NumPy einsum per call: meant for small inputs and
            tests. ``None`` reads the environment variable ``SHARDWISE_CHECK`` (``1`` turns it
            on). Whatever this says, every program is checked once, when it is built, for a
            sum over a mesh axis that XLA left out.

    The result has NumPy's dtype for these operands: int64 and float64 are computed in 64 bits
    (in JAX's 64-bit mode, for shardwise's programs only).

    Returns:
        A ``jax.Array`` with the output sharding; given Dask arrays, a lazy Dask array whose
        blocks each run on the mesh (``.compute()`` runs it, on ``dask.distributed`` workers
        where a client is active).

    >>> import numpy as np
    >>> a = np.arange(24.0, dtype=np.float32).reshape(8, 3)
    >>> out = einsum("nd,nd->n", a, a, mesh="devices=8", in_specs=["devices", None])
    >>> out.sharding.spec, bool(np.allclose(out, (a * a).sum(1)))
    (P('devices',), True)
    """
    if any(is_dask(a) for a in arrays):
        if layout not in (None, "auto") or in_specs is not None or mode != "auto":
            raise ArgumentError(
                "with Dask arrays each block gets the planner's best layout; leave out layout=, "
                "in_specs= and mode= (or compute the Dask arrays first)."
            )
        return dask_einsum(equation, *arrays, mesh=None if mesh == "auto" else mesh)
    jmesh = _jax_mesh(mesh)
    dtype = _dtype(arrays) if arrays else np.dtype("float32")
    with wide(dtype):
        plan, fn, targets = _program(
            equation, arrays, jmesh, layout, in_specs, out_spec, mode, precision
        )
        if any(0 in shape for shape in plan.shapes):
            # a sum over nothing is zeros, and an empty output is empty; JAX 0.10.2 cannot read
            # back a sharded empty array that a program returns, so it is placed, not computed
            zeros = np.zeros(plan.output_shape, plan.dtype)
            result = put(zeros, named(jmesh, plan.out_spec))
        else:
            result = fn(*place(plan, jmesh, arrays, targets))
    wanted = check if check is not None else os.environ.get("SHARDWISE_CHECK", "") == "1"
    if wanted and not any(isinstance(x, jax.core.Tracer) for x in (*arrays, result)):
        _compare(plan, arrays, result)  # (traced values have no numbers to compare yet)
    return result


def _compare(plan: Plan, arrays: Sequence[Any], result: jax.Array) -> None:
    """Raise :class:`MiscompileError` unless ``result`` is NumPy's within rounding."""
    found = check_einsum(plan.op, [np.asarray(a).astype(plan.dtype) for a in arrays], result)
    if not found.ok:
        raise MiscompileError(
            f"{plan.op.equation!r} on mesh {plan.mesh.describe()} with operands laid out "
            f"{', '.join(s.describe() for s in plan.in_specs)} ({plan.mode} mode) returned a "
            f"result {found.max_abs_error:.3g} away from NumPy's, where rounding allows "
            f"{found.tolerance:.3g}. Please report it with the equation, shapes and layouts; "
            "mode='manual' computes it another way."
        )


def _program(
    equation: str,
    arrays: Sequence[Any],
    jmesh: Mesh,
    layout: LayoutLike | Literal["auto"] | None,
    in_specs: Sequence[SpecLike] | None,
    out_spec: SpecLike | Literal["infer"],
    mode: str,
    precision: Any,
) -> tuple[Plan, Callable[..., jax.Array], tuple[NamedSharding, ...]]:
    """The plan, jitted program and operand shardings of an einsum call, cached by the
    call's key (equation, shapes, dtypes, mesh, layout) so that repeated calls skip
    planning."""
    key = _plan_key(equation, arrays, jmesh, layout, in_specs, out_spec, mode, precision)
    cached = _PLANS.get(key) if key is not None else None
    if cached is None:
        plan, _ = plan_einsum(
            equation,
            *arrays,
            mesh=jmesh,
            layout=layout,
            in_specs=in_specs,
            out_spec=out_spec,
            mode=mode,
        )
        cached = (plan, jitted(plan, jmesh, precision), shardings(plan, jmesh))
        if not any(0 in shape for shape in plan.shapes):  # (an empty einsum is not run)
            compile_sound(plan, jmesh, precision)
        if key is not None and (not isinstance(layout, str) or layout != "auto"):
            if len(_PLANS) >= 512:
                _PLANS.clear()
            _PLANS[key] = cached
    return cached


def explain_einsum(
    equation: str,
    shapes: Sequence[Sequence[int]],
    *,
    mesh: MeshLike,
    dtype: Any = "float32",
    layout: LayoutLike | Literal["auto"] | None = None,
    in_specs: Sequence[SpecLike] | None = None,
    out_spec: SpecLike | Literal["infer"] = "infer",
    mode: str = "auto",
) -> Explanation:
    """Compile a sharded einsum from shapes alone and say what each device does.

    >>> e = explain_einsum("nd,nd->n", [(4000, 10000)] * 2, mesh="x=2,y=4",
    ...                    in_specs=["x,y", "x,y"], out_spec="x")
    >>> e.output.shard_shape, [c.to_json() for c in e.collectives]
    ((2000,), [{'kind': 'all-reduce', 'mesh_axes': ['y'], 'bytes': 8000}])
    """
    jmesh = _jax_mesh(mesh)
    given = _supported(dtype)
    with wide(given):
        plan, why = _make_plan(equation, shapes, given, jmesh, layout, in_specs, out_spec, mode)
        expl = explain_compiled(plan, compile_plan(plan, jmesh), jmesh)
    return dataclasses.replace(expl, auto=why) if why else expl


_AUTO = "auto"


def _is_spec_leaf(x: object) -> bool:
    return x is None or isinstance(x, PartitionSpec | str | Spec)


class Sharded:
    """A function compiled to run sharded on a mesh: the tutorial's ``pjit(f, ...)`` today.

    Call it like the function. ``explain(*args)`` says what each device holds and which
    collectives XLA inserted.
    """

    def __init__(
        self, fn: Callable[..., Any], mesh: Mesh, in_specs: Any, out_specs: Any = _AUTO
    ) -> None:
        self.fn = fn
        self.mesh = mesh
        self.mesh_spec = MeshSpec.parse(mesh)
        self.in_specs = in_specs
        self.out_specs = out_specs
        in_shardings = self._shardings(in_specs, "in_specs")
        self._in_shardings = in_shardings
        out_shardings = None if _is_auto(out_specs) else self._shardings(out_specs, "out_specs")
        self._jitted = jax.jit(fn, in_shardings=in_shardings, out_shardings=out_shardings)

    def _shardings(self, specs: Any, what: str) -> Any:
        def to_sharding(s: Any) -> NamedSharding:
            return NamedSharding(self.mesh, Spec.parse(s, what).to_partition_spec())

        if _is_spec_leaf(specs):
            return to_sharding(specs)
        return jax.tree.map(to_sharding, specs, is_leaf=_is_spec_leaf)

    def _check(self, args: tuple[Any, ...]) -> None:
        specs = self.in_specs
        if _is_spec_leaf(specs):
            per_arg = [specs] * len(args)
        elif isinstance(specs, tuple | list):
            if len(specs) != len(args):
                raise ArgumentError(
                    f"{_name(self.fn)} was given {len(args)} argument"
                    f"{'s' if len(args) != 1 else ''} but in_specs has {len(specs)} entries; give "
                    "one spec per positional argument (None for replicated), or one spec for all."
                )
            per_arg = list(specs)
        else:
            return
        for k, (arg, spec) in enumerate(zip(args, per_arg, strict=True)):
            if not _is_spec_leaf(spec):
                continue
            parsed = Spec.parse(spec, f"the spec of argument {k}")
            for leaf in jax.tree.leaves(arg):
                shape = tuple(getattr(leaf, "shape", ()))
                parsed.validate(self.mesh_spec, shape, f"argument {k} (shape {shape})")

    def __call__(self, *args: Any) -> Any:
        self._check(args)
        if is_explicit(self.mesh):  # give host arrays their sharded type before tracing
            args = tuple(jax.device_put(args, self._in_shardings))
        elif self.mesh.is_multi_process and self._per_arg_shardings(args):
            # a mesh across processes: each process creates only its own shards
            args = tuple(
                jax.tree.map(functools.partial(_put_leaf, sharding=s), a)
                for a, s in zip(args, self._per_arg_shardings(args), strict=True)
            )
        with _explicit_hints():
            return self._jitted(*args)

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

    def lower(self, *args: Any) -> Any:
        """``jax.jit(...).lower`` for these arguments (arrays or ``jax.ShapeDtypeStruct``)."""
        self._check(args)
        with _explicit_hints():
            return self._jitted.lower(*args)

    def explain(self, *args: Any) -> Explanation:
        """Compile for ``args`` (arrays or ``jax.ShapeDtypeStruct``) and explain each device's
        shards, every collective with its cause and source line, memory and compute."""
        return explain_function(self.lower(*args).compile(), args, self.mesh)


def _put_leaf(x: Any, sharding: NamedSharding) -> Any:
    return put(x, sharding) if hasattr(x, "shape") and hasattr(x, "dtype") else x


def _is_auto(x: Any) -> bool:
    return isinstance(x, str) and x == _AUTO


def _name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__name__", "the function")


def shard(
    fn: Callable[..., Any],
    mesh: MeshLike,
    in_specs: Any,
    out_specs: Any = _AUTO,
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
    return Sharded(fn, _jax_mesh(mesh), in_specs, out_specs)


@contextlib.contextmanager
def _explicit_hints() -> Iterator[None]:
    """Turn JAX's Explicit-mode error for a sharded contraction into one that lists the fixes."""
    try:
        yield
    except Exception as e:
        message = str(e)
        if "Contracting dimensions are sharded" not in message:
            raise
        axes = re.findall(r"'(\w+)'", message.split("lhs_contracting_spec=")[-1])
        names = ", ".join(dict.fromkeys(axes)) or "a mesh axis"
        raise SpecError(
            f"a contraction inside the function sums over an index that is sharded on "
            f"`{names}`, and with Explicit mesh axes JAX will not guess the output's layout. "
            f"Any of these resolves it: (1) pass out_sharding=P(...) without `{names}` to that "
            f"einsum/matmul, so the partial sums are all-reduced and the result is replicated "
            f"on `{names}`; (2) pass out_sharding=P(...) that puts `{names}` on one output "
            f"dimension, so the partial sums are reduce-scattered; (3) build the mesh with "
            f"axis_types='auto' and let XLA choose; (4) use shardwise.einsum(..., out_spec=...), "
            f"which passes the output layout for you."
        ) from None


def explain(
    fn: Callable[..., Any] | str,
    *args: Any,
    mesh: MeshLike,
    in_specs: Any = None,
    out_specs: Any = _AUTO,
    **einsum_options: Any,
) -> Explanation:
    """Explain any sharded JAX function, or an einsum, for these arguments.

    Args:
        fn: a JAX-traceable function, or an einsum equation.
        *args: arrays or ``jax.ShapeDtypeStruct`` (only shapes and dtypes are used).
        mesh: a JAX ``Mesh`` or a description such as ``"x=2,y=4"``.
        in_specs: as for :func:`shard` (for an equation: one spec per operand).
        out_specs: as for :func:`shard` (for an equation: the output spec, default inferred).
        **einsum_options: for an equation, ``layout=`` and ``mode=``.

    >>> import jax, numpy as np
    >>> e = explain(lambda a: a.sum(), jax.ShapeDtypeStruct((8, 8), np.float32),
    ...             mesh="x=2,y=4", in_specs="x,y")
    >>> sorted({c.kind for c in e.collectives}), e.causes[0].reason
    (['all-reduce'], 'partial-sum')
    """
    if isinstance(fn, str):
        return explain_einsum(
            fn,
            [tuple(a.shape) for a in args],
            mesh=mesh,
            dtype=_dtype(args) if args else "float32",
            in_specs=in_specs,
            out_spec="infer" if _is_auto(out_specs) else out_specs,
            **einsum_options,
        )
    return shard(fn, mesh, in_specs, out_specs).explain(*args)


def mean(x: Any, *, mesh: MeshLike = "auto") -> Any:
    """The mean of an array on the mesh: NumPy or JAX arrays give a scalar ``jax.Array``
    (split along the first axis); Dask arrays give a lazy Dask scalar, each block on the mesh.

    >>> import numpy as np
    >>> float(mean(np.arange(16.0).reshape(8, 2), mesh="devices=8"))
    7.5
    """
    if is_dask(x):
        return dask_mean(x, mesh=None if mesh == "auto" else mesh)
    letters = "abcdefghijklmnopqrstuvwxyz"[: x.ndim]
    jmesh = _jax_mesh(mesh)
    first = {letters[0]: MeshSpec.parse(jmesh).names} if x.ndim else {}
    with wide(_dtype([x])):
        plan, _, targets = _program(f"{letters}->", (x,), jmesh, first, None, "infer", "auto", None)
        # the sum and the division in one program: one dispatch on every device
        return divided(plan, jmesh, x.size)(*place(plan, jmesh, (x,), targets))
