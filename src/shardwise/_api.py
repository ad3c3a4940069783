"""The public functions: einsum, explain, plan_einsum and mean, sharded on a device mesh."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any, Literal

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from shardwise._caches import Bounded, cached
from shardwise._data.dask import dask_einsum, dask_mean, is_dask
from shardwise._errors import (
    UNSET,
    ArgumentError,
    ArgumentTypeError,
    Unset,
    check_count,
    renamed_argument,
)
from shardwise._model.mesh import MeshSpec
from shardwise._model.op import Op, as_shapes
from shardwise._model.plan import Plan
from shardwise._model.profile import Profile
from shardwise._model.profile_files import default_profile, load_profile, profile_stamp
from shardwise._model.profile_use import check_mesh
from shardwise._model.spec import LayoutLike, SpecLike
from shardwise._model.units import format_bytes, parse_bytes
from shardwise._planner.einsum import PlanReport, rank
from shardwise._planner.einsum import verify as verify_report
from shardwise._planner.layout import make_plan, plan_arrays
from shardwise._runtime.distributed import put
from shardwise._shard import AUTO, is_auto, shard
from shardwise._xla.check import ensure_close
from shardwise._xla.dtypes import (
    check_arrays,
    describe_value,
    mean_dtypes,
    result_dtype,
    supported,
    wide,
    x64,
)
from shardwise._xla.explain import Explanation, compile_plan, compile_sound, explain_compiled
from shardwise._xla.lower import check_precision, jitted, mean_program, place
from shardwise._xla.meshes import MeshLike, jax_mesh, named, on_mesh, platform


def einsum(
    equation: str,
    *arrays: Any,
    mesh: MeshLike = "auto",
    layout: LayoutLike | Literal["auto"] | None = None,
    in_specs: Sequence[SpecLike] | None = None,
    out_specs: SpecLike | Literal["infer"] = "infer",
    mode: str = "auto",
    precision: Any = None,
    check: bool | None = None,
    out_spec: SpecLike | Literal["infer"] | Unset = UNSET,
) -> Any:
    """Compute an einsum sharded over a device mesh.

    Give the layout either per index (``layout="n=x,d=y"``) or per operand
    (``in_specs=[P('x', 'y'), "x,y"]``, plus ``out_specs``; by default the output keeps the
    axes the inputs split, and contracted axes are summed away).

    Args:
        equation: an einsum equation, e.g. ``"nd,nd->n"``.
        *arrays: NumPy or JAX arrays.
        mesh: a JAX ``Mesh`` (any axis types) or a description such as ``"x=2,y=4"``; by
            default the one set with ``jax.set_mesh``, else every device on one axis.
        layout: index → mesh axes, or ``"auto"`` for the planner's best strategy (logged on
            the ``shardwise`` logger with the reason when it is chosen: once per shapes,
            dtypes, mesh and profile).
        in_specs: one partition spec per operand (``None`` for replicated).
        out_specs: the output's partition spec; ``"infer"`` derives it.
        mode: ``"auto"`` (``jax.jit``; XLA inserts collectives) or ``"manual"``
            (``shard_map`` with a local einsum and an explicit ``psum``).
        precision: passed to ``jnp.einsum`` (``"highest"``, a ``jax.lax.Precision``, …);
            checked even where the local step is a native kernel that does not use it.
        check: also compute the einsum with NumPy (in float64, or exactly for integers) and
            raise :class:`~shardwise.MiscompileError` if the result is off by more than
            rounding allows. It costs a NumPy einsum per call: meant for small inputs and
            tests. ``None`` reads the environment variable ``SHARDWISE_CHECK`` (``1`` turns it
            on). Whatever this says, every program is checked once, when it is built, for a
            sum over a mesh axis that XLA left out.
        out_spec: the deprecated old name of ``out_specs``.

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
    out_specs = renamed_argument("einsum", "out_specs", out_specs, "out_spec", out_spec, "infer")
    check_arrays(arrays)  # (beside a Dask array too: a list had escaped as an AttributeError)
    if any(is_dask(a) for a in arrays):
        chosen = layout not in (None, "auto") or in_specs is not None or mode != "auto"
        if chosen or precision is not None:
            raise ArgumentError(
                "with Dask arrays each block gets the planner's best layout; leave out layout=, "
                "in_specs=, mode= and precision= (or compute the Dask arrays first)."
            )
        return dask_einsum(equation, *arrays, mesh=None if mesh == "auto" else mesh)
    jmesh = jax_mesh(mesh)
    dtype = result_dtype(arrays) if arrays else np.dtype("float32")
    with wide(dtype), on_mesh(jmesh, arrays):
        options = (layout, in_specs, out_specs, mode, precision)
        plan, fn, targets = _program(equation, arrays, jmesh, *options)
        if plan.empty:
            # a sum over nothing is zeros, and an empty output is empty; JAX 0.10.2 cannot read
            # back a sharded empty array that a program returns, so it is placed, not computed
            zeros = np.zeros(plan.output_shape, plan.dtype)
            result = put(zeros, named(jmesh, plan.out_spec))
        else:
            result = fn(*place(plan, jmesh, arrays, targets))
    wanted = check if check is not None else os.environ.get("SHARDWISE_CHECK", "") == "1"
    if wanted and not any(isinstance(x, jax.core.Tracer) for x in (*arrays, result)):
        ensure_close(plan, arrays, result)  # (traced values have no numbers to compare yet)
    return result


_Program = tuple[Plan, Callable[..., jax.Array], tuple[NamedSharding, ...]]
_PROGRAMS: Bounded[tuple[Any, ...], _Program] = Bounded(512)
"""Validated plans, their checked programs and operand shardings by call signature: repeated
calls skip parsing, planning, validation and compilation."""


def _program(
    equation: str,
    arrays: Sequence[Any],
    jmesh: Mesh,
    layout: LayoutLike | Literal["auto"] | None,
    in_specs: Sequence[SpecLike] | None,
    out_specs: SpecLike | Literal["infer"],
    mode: str,
    precision: Any,
) -> _Program:
    """The plan, checked jitted program and operand shardings of an einsum call, cached by
    everything they depend on: the equation, the operands' shapes and dtypes, the mesh, the
    options, JAX's 64-bit mode and the cost profile of these devices (which chooses an
    ``"auto"`` layout, and the layout that disagreeing operands are moved to)."""
    options = (layout, in_specs, out_specs, mode, precision)
    profile = profile_stamp(platform(jmesh), jmesh.size)  # (None: the built-in one)
    key = _call_key(equation, arrays, jmesh, x64(), profile, options)
    found = _PROGRAMS.get(key) if key is not None else None
    if found is None:
        check_precision(precision)
        plan, _ = plan_arrays(
            equation,
            *arrays,
            mesh=jmesh,
            layout=layout,
            in_specs=in_specs,
            out_specs=out_specs,
            mode=mode,
        )
        if not plan.empty:  # (an empty einsum is not run)
            compile_sound(plan, jmesh, precision)
        found = (
            plan,
            jitted(plan, jmesh, precision),
            tuple(named(jmesh, s) for s in plan.in_specs),
        )
        if key is not None:
            _PROGRAMS.put(key, found)
    return found


def _call_key(
    equation: str,
    arrays: Sequence[Any],
    mesh: Mesh,
    x64: bool,
    profile: Any,
    options: tuple[Any, ...],
) -> tuple[Any, ...] | None:
    """A hashable key for a call, or ``None`` when an option cannot be hashed."""
    try:
        key = (
            equation,
            tuple((tuple(a.shape), a.dtype) for a in arrays),
            mesh,
            x64,
            profile,
            *(repr(o) for o in options),
        )
        hash(key)
    except TypeError:
        return None
    return key


def explain_einsum(
    equation: str,
    shapes: Sequence[Sequence[int]],
    *,
    mesh: MeshLike = "auto",
    dtype: Any = "float32",
    layout: LayoutLike | Literal["auto"] | None = None,
    in_specs: Sequence[SpecLike] | None = None,
    out_specs: SpecLike | Literal["infer"] = "infer",
    mode: str = "auto",
    out_spec: SpecLike | Literal["infer"] | Unset = UNSET,
) -> Explanation:
    """Compile a sharded einsum from shapes alone and say what each device does; the options
    are :func:`einsum`'s (``out_spec`` is the deprecated old name of ``out_specs``).

    >>> e = explain_einsum("nd,nd->n", [(4000, 10000)] * 2, mesh="x=2,y=4",
    ...                    in_specs=["x,y", "x,y"], out_specs="x")
    >>> e.output.shard_shape, [c.to_json() for c in e.collectives]
    ((2000,), [{'kind': 'all-reduce', 'mesh_axes': ['y'], 'bytes': 8000}])
    """
    out_specs = renamed_argument(
        "explain_einsum", "out_specs", out_specs, "out_spec", out_spec, "infer"
    )
    shapes = as_shapes(shapes)
    jmesh = jax_mesh(mesh)
    given = supported(dtype)
    with wide(given), on_mesh(jmesh):
        plan, why = make_plan(equation, shapes, given, jmesh, layout, in_specs, out_specs, mode)
        expl = explain_compiled(plan, compile_plan(plan, jmesh), jmesh)
    return dataclasses.replace(expl, auto=why) if why else expl


def plan_einsum(
    equation: str,
    shapes: Sequence[Sequence[int]],
    *,
    mesh: MeshLike = "auto",
    dtype: Any = "float32",
    budget: int | str | None = None,
    profile: Profile | str | None = None,
    verify: bool = False,
    top: int = 10,
    repeat: int = 5,
    on_step: Callable[[int, int], None] | None = None,
) -> PlanReport:
    """Every way to shard an einsum on a mesh, each one's predicted cost, ranked best first.

    Planning is pure: a mesh given as text (``"x=2,y=4"``) need not exist here, and with a
    ``profile`` nothing touches the devices. ``verify=True`` compiles and times the ``top``
    strategies on the devices at hand and compares their collectives with the prediction.

    Args:
        equation: an einsum equation, e.g. ``"nd,nd->n"``.
        shapes: one shape per operand.
        mesh: a JAX ``Mesh``, a description such as ``"x=2,y=4"``, or ``"auto"`` (the mesh
            set with ``jax.set_mesh``, else every device here on one axis).
        dtype: the operands' dtype.
        budget: memory per device (bytes, or text like ``"16GiB"``); larger strategies are
            refused, with the reason.
        profile: a :class:`~shardwise._model.profile.Profile`, or the name of a built-in one
            (``"h100"``, ``"tpu-v5e"``, ``"cpu-2core"``, …), a calibrated one, or a JSON file;
            by default the calibrated profile of the devices here, else a built-in guess.
        verify: compile and time the ``top`` strategies here; compare with the prediction.
        top: how many strategies ``verify`` runs.
        repeat: timed runs per verified strategy (the median is kept).
        on_step: called with (step, steps) before each verified strategy.

    Returns:
        A ``PlanReport``: ``.best``, ``.strategies`` (ranked), ``.refused``, ``.why()``,
        ``.to_json()``.

    >>> r = plan_einsum("nd,nd->n", [(4000, 10000)] * 2, mesh="x=2,y=4", profile="h100")
    >>> r.best.strategy.describe(r.op), len(r.strategies)
    ('n=(x,y) → out (x,y)', 12)
    """
    op = Op.parse(equation)
    limit = None if budget is None else parse_bytes(budget, "the budget")
    check_count("top", top)
    check_count("repeat", repeat)
    jmesh = mesh if isinstance(mesh, Mesh) else None
    if verify or (isinstance(mesh, str) and mesh == "auto"):
        jmesh = jax_mesh(mesh)  # the devices here
    spec = MeshSpec.parse(jmesh if jmesh is not None else mesh)
    if profile is None:  # these devices' profile, for a mesh of any size
        here = platform(jmesh) if jmesh is not None else str(jax.devices()[0].platform)
        profile = default_profile(here, spec.size)
    elif isinstance(profile, str):
        profile = load_profile(profile)
    check_mesh(profile, spec)
    report = rank(op, shapes, spec, supported(dtype).name, profile, limit)
    if not report.strategies:
        smallest = report.refused[0].predicted.memory_bytes if report.refused else None
        raise ArgumentError(
            f"no strategy for {op.equation!r} on mesh {spec.describe()} fits "
            f"{'the budget of ' + format_bytes(limit) if limit is not None else 'the shapes'}"
            + (f"; the smallest needs {format_bytes(smallest)}" if smallest else "")
            + "; give a larger budget (--device-memory from the command line) or a mesh with "
            "more devices."
        )
    if verify:
        assert jmesh is not None
        with on_mesh(jmesh):
            report = verify_report(report, jmesh, top=top, repeat=repeat, on_step=on_step)
    return report


def explain(
    fn: Callable[..., Any] | str,
    *args: Any,
    mesh: MeshLike = "auto",
    in_specs: Any = None,
    out_specs: Any = AUTO,
    **einsum_options: Any,
) -> Explanation:
    """Explain any sharded JAX function, or an einsum, for these arguments.

    Args:
        fn: a JAX-traceable function, or an einsum equation.
        *args: arrays or ``jax.ShapeDtypeStruct`` (only shapes and dtypes are used).
        mesh: a JAX ``Mesh`` or a description such as ``"x=2,y=4"``; ``"auto"``: the mesh
            set with ``jax.set_mesh``, else every device on one axis.
        in_specs: as for :func:`shard` (for an equation: one spec per operand).
        out_specs: as for :func:`shard` (for an equation: the output spec, default inferred).
        **einsum_options: for an equation, ``layout=`` and ``mode=`` (``out_spec=`` is the
            deprecated old name of ``out_specs``).

    >>> import jax, numpy as np
    >>> e = explain(lambda a: a.sum(), jax.ShapeDtypeStruct((8, 8), np.float32),
    ...             mesh="x=2,y=4", in_specs="x,y")
    >>> sorted({c.kind for c in e.collectives}), e.causes[0].reason
    (['all-reduce'], 'partial-sum')
    """
    old = einsum_options.pop("out_spec", UNSET)
    out_specs = renamed_argument("explain", "out_specs", out_specs, "out_spec", old, AUTO)
    if isinstance(fn, str | bytes):  # (bytes: the equation's parser says to decode them)
        check_arrays(args)
        return explain_einsum(
            fn,
            [tuple(a.shape) for a in args],
            mesh=mesh,
            dtype=result_dtype(args) if args else "float32",
            in_specs=in_specs,
            out_specs="infer" if is_auto(out_specs) else out_specs,
            **einsum_options,
        )
    if not callable(fn):
        plan = hasattr(fn, "plans") and hasattr(fn, "report")  # (a ProgramPlan)
        raise ArgumentTypeError(
            f"explain() takes a function or an einsum equation, but was given "
            f"{describe_value(fn)}; "
            + ("a plan says op by op what each of its plans moves and why with "
               "plan.report(name), and compares that with the compiled program with "
               "plan.verify()." if plan else "pass a JAX-traceable function, e.g. "
               "explain(jnp.dot, x, w, mesh=..., in_specs=...).")
        )  # fmt: skip
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
    check_arrays([x], "the array given to mean")
    jmesh = jax_mesh(mesh)
    summed, given = mean_dtypes(x.dtype)  # (NumPy's: an int8 sum wraps)
    with wide(summed), on_mesh(jmesh, [x]):
        plan, targets = _mean_layout(tuple(x.shape), str(x.dtype), jmesh, x64())
        program = mean_program(x.size, summed.name, given.name)
        return program(*place(plan, jmesh, (x,), targets))


@cached(maxsize=32)
def _mean_layout(
    shape: tuple[int, ...], dtype: str, jmesh: Mesh, x64: bool
) -> tuple[Plan, tuple[NamedSharding, ...]]:
    """Where a mean's array goes: its first dimension split over every mesh axis, as the
    plan of ``ab…->`` lays it out, where the mesh divides it, else where the planner puts it
    (a ``(5, 3)`` array on 8 devices had been refused with advice ``mean`` takes no argument
    for); nothing is compiled here (the einsum's own program had been compiled and checked,
    and not run)."""
    letters = "abcdefghijklmnopqrstuvwxyz"[: len(shape)]
    spec = MeshSpec.parse(jmesh)
    first: LayoutLike | Literal["auto"] = (
        {} if not shape else {letters[0]: spec.names} if shape[0] % spec.size == 0 else "auto"
    )
    plan, _ = plan_arrays(f"{letters}->", jax.ShapeDtypeStruct(shape, dtype), mesh=jmesh,
                          layout=first)  # fmt: skip
    return plan, tuple(named(jmesh, s) for s in plan.in_specs)
