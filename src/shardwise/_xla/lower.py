"""Build the JAX program for a :class:`Plan`.

- ``auto``: ``jax.jit`` with a ``NamedSharding`` per operand and for the output; XLA's SPMD
  partitioner inserts whatever collectives the layouts need (the tutorial's ``pjit``). Operands
  that split a shared index differently are first resharded to one agreed layout
  (:func:`target_layout`), because XLA can lose a partial sum when it partitions a contraction
  whose operands disagree (see :mod:`shardwise._model.reshard`).
- ``manual``: ``jax.shard_map`` around a local einsum on each device's block, then an explicit
  ``psum`` over the mesh axes that split a contracted index — "partial dot products, then
  aggregate", written out.

An auto-mode einsum whose local step is a kernel other than ``jnp.einsum`` (unrolled
multiply-adds, a product with ones, or on CPU a native kernel; see :mod:`shardwise._xla.kernels`)
is built the manual way on the agreed layout: XLA cannot partition a call into native code,
and left to partition an unrolled kernel it may gather every slice separately; in
``shard_map`` the only collective is the ``psum`` the layout needs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding

from shardwise._caches import cached
from shardwise._errors import ArgumentError, ArgumentTypeError
from shardwise._model.cost import local_sizes
from shardwise._model.plan import Plan
from shardwise._model.profile import Profile
from shardwise._model.profile_files import default_profile
from shardwise._model.reshard import agreed_layout, reshard_moves
from shardwise._model.spec import Layout, Spec
from shardwise._model.strategy import reduce_axes
from shardwise._runtime.distributed import put
from shardwise._xla.dtypes import x64
from shardwise._xla.kernels import Kernel, choose_kernel, local_einsum, native_kernel
from shardwise._xla.meshes import (
    auto_twin,
    explicit_part,
    is_explicit,
    local_devices,
    named,
    on_cpu,
    platform,
    with_auto_axes,
)


def shardings(plan: Plan, mesh: Mesh) -> tuple[NamedSharding, ...]:
    """Each operand's planned ``NamedSharding``."""
    return tuple(named(mesh, s) for s in plan.in_specs)


def place(
    plan: Plan,
    mesh: Mesh,
    arrays: Sequence[Any],
    targets: Sequence[NamedSharding] | None = None,
) -> list[jax.Array]:
    """Put each operand on the devices with its planned sharding (a no-op if already there);
    inside ``jit``, ``grad`` or ``vmap``, constrain it to that sharding."""
    placed = []
    dtype = np.dtype(plan.dtype)
    for array, target in zip(arrays, targets or shardings(plan, mesh), strict=True):
        if array.dtype != dtype:
            array = array.astype(dtype)
        if isinstance(array, jax.core.Tracer):
            placed.append(_reshard(array, target, is_explicit(mesh)))
        elif isinstance(array, jax.Array) and array.sharding == target:
            placed.append(array)
        else:
            placed.append(put(array, target))
    return placed


def target_layout(plan: Plan, platform: str = "cpu") -> Layout:
    """The one layout the operands are brought to before they meet: their own where they
    agree, else the cheapest agreed layout by the cost model (:func:`~shardwise._model.reshard.
    agreed_layout`) with the profile of these devices. In manual mode, the layout the operands
    must already agree on."""
    if plan.mode == "manual":
        return plan.layout
    return _target_layout(plan, default_profile(platform, plan.mesh.size))


@cached(maxsize=256)
def _target_layout(plan: Plan, profile: Profile) -> Layout:
    return agreed_layout(
        plan.op, plan.shapes, plan.in_specs, plan.out_spec, plan.dtype, plan.mesh, profile
    )


def check_precision(precision: Any) -> None:
    """Refuse a ``precision`` that ``jnp.einsum`` would refuse, before any program is built
    (a native kernel's program never reaches ``jnp.einsum``, so it would go unchecked).

    >>> check_precision("highest")
    >>> check_precision("ultra")
    Traceback (most recent call last):
    shardwise._errors.ArgumentError: precision 'ultra' is not one JAX knows; ...
    """
    if precision is None:
        return
    probe = jax.ShapeDtypeStruct((1,), np.float32)
    try:
        jax.eval_shape(lambda a: jnp.einsum("i,i->", a, a, precision=precision), probe)
    except (ValueError, TypeError, KeyError, AttributeError):
        known = isinstance(precision, str | tuple | list | jax.lax.Precision)
        raise (ArgumentError if known else ArgumentTypeError)(
            f"precision {precision!r} is not one JAX knows; give None, 'default', 'high' or "
            "'highest' (or 'bfloat16', 'tensorfloat32', 'float32'), a jax.lax.Precision, a pair "
            "of them (one per operand), or a jax.lax.DotAlgorithmPreset."
        ) from None


def jitted(plan: Plan, mesh: Mesh, precision: Any = None) -> Callable[..., jax.Array]:
    """The jitted program of ``plan``, built once per plan, mesh, precision and target layout:
    calls take JAX's fast dispatch path, and explaining or compiling it reuses the same
    program."""
    return _jitted(plan, mesh, precision, target_layout(plan, platform(mesh)), x64())


@cached(maxsize=128)
def _jitted(
    plan: Plan, mesh: Mesh, precision: Any, target: Layout, x64: bool
) -> Callable[..., jax.Array]:
    return lower(plan, mesh, precision)


@cached(maxsize=32)
def mean_program(size: int, summed: str, given: str) -> Callable[..., jax.Array]:
    """The jitted mean of an array of ``size`` elements, summed in ``summed`` and given in
    ``given`` (:func:`~shardwise._xla.dtypes.mean_dtypes`), as one program: the devices'
    sums, XLA's all-reduce of them and the division, one dispatch on every device."""
    return jax.jit(lambda a: (jnp.sum(a, dtype=summed) / size).astype(given))


def lower(
    plan: Plan, mesh: Mesh, precision: Any = None, *, kernels: bool = True
) -> Callable[..., jax.Array]:
    """The jitted function that computes ``plan`` on ``mesh``.

    In auto mode the operands are first resharded to :func:`target_layout` (a no-op where they
    already agree), so XLA never partitions a contraction whose operands disagree. Then a
    local kernel other than ``jnp.einsum`` (see :mod:`shardwise._xla.kernels`) runs in
    ``shard_map`` on each device's block, where it can add no collective; where the requested
    output is not the layout's own (or the mesh's axes are Explicit), ``jnp.einsum`` runs and
    XLA places the result.

    Args:
        plan: a validated plan; ``mesh`` must have the plan's axes and sizes.
        mesh: the JAX mesh to run on.
        precision: passed to ``jnp.einsum`` (e.g. ``"highest"``).
        kernels: ``False`` always uses ``jnp.einsum`` (the reference the kernels are held to).
    """
    op = plan.op
    in_shardings = shardings(plan, mesh)
    out_sharding = named(mesh, plan.out_spec)
    if plan.mode == "manual":
        layout = plan.layout
        kernel: Kernel = (
            native_kernel(op, _local_sizes(plan, layout), on_cpu(mesh), local_devices(mesh))
            if kernels
            else "einsum"
        )
        return _shard_mapped(plan, mesh, precision, layout, kernel)
    target = target_layout(plan, platform(mesh))
    explicit = is_explicit(mesh)
    kernel = _auto_kernel(plan, mesh, target) if kernels and not explicit else "einsum"
    if kernel != "einsum" and plan.out_spec.canonical() == target.spec_for(op.output):
        return _shard_mapped(plan, mesh, precision, target, kernel)
    # on a mesh with Explicit axes the program runs with them Auto inside, every layout said
    # by a constraint, and gives its result the output's type (as a program plan runs)
    inner = auto_twin(mesh)
    move = _mover(plan, inner, target)
    made = target.spec_for(op.output) if reorders(plan, target) else None

    def sharded_einsum(*xs: jax.Array) -> jax.Array:
        out = jnp.einsum(op.equation, *move(xs), precision=precision)
        if made is None:
            return out
        mover = Mover(inner)
        moved: jax.Array = mover.move(mover.constrain(out, made), made, plan.out_spec.canonical())
        return moved

    if explicit:
        typed = NamedSharding(mesh, explicit_part(mesh, plan.out_spec).to_partition_spec())
        sharded_einsum = with_auto_axes(sharded_einsum, typed)
    return jax.jit(sharded_einsum, in_shardings=in_shardings, out_shardings=out_sharding)


def reorders(plan: Plan, layout: Layout) -> bool:
    """Whether the output of ``plan``, its operands on ``layout``, moves an output index off
    the axes it is split on onto a mesh axis that splits a contracted index, while another
    output index is split on an axis it was not: XLA's SPMD partitioner (on CPU, JAX 0.10),
    asked to sum the partial results and move both in one step, puts blocks in the wrong order
    (``qpt,qpt->qt`` with ``p`` on ``x`` and ``q`` on ``y``, asked for as ``q`` on ``x`` and
    ``t`` on ``y``, returned ``q``'s blocks swapped). Such a result is made in the layout's
    own output and moved after, which XLA does right.

    >>> p = Plan.make("qpt,qpt->qt", [(4, 2, 4)] * 2, mesh="x=2,y=2", in_specs=["y,x", "y,x"],
    ...               out_specs="x,y")
    >>> reorders(p, Layout.parse("q=y,p=x")), reorders(p, Layout.parse("q=x,p=y"))
    (True, False)
    """
    op = plan.op
    summed = set(reduce_axes(op, layout, plan.mesh))
    out = dict(zip(op.output, plan.out_spec.padded(len(op.output)), strict=True))
    for i, entry in out.items():
        held = layout.axes_of(i)
        if not held or entry[: len(held)] == held or not summed & set(entry):
            continue
        if any(set(out[j]) - set(layout.axes_of(j)) for j in op.output if j != i):
            return True
    return False


def _auto_kernel(plan: Plan, mesh: Mesh, layout: Layout) -> Kernel:
    """The local step of an auto-mode plan on ``layout``: chosen by the einsum's own sizes
    (:func:`~shardwise._xla.kernels.choose_kernel`); a contraction is unrolled only where no
    device boundary cuts its terms, and a native kernel replaces ``jnp.einsum`` where one fits
    each device's block."""
    op = plan.op
    kernel = choose_kernel(op, op.sizes(plan.shapes))
    split = any(plan.mesh.shape[a] > 1 for a in reduce_axes(op, layout, plan.mesh))
    if kernel == "unrolled" and split:
        return "einsum"
    if kernel == "einsum":
        native = native_kernel(op, _local_sizes(plan, layout), on_cpu(mesh), local_devices(mesh))
        return native if native in ("rowdot", "matmul") else "einsum"
    return kernel


def _reshard(x: jax.Array, sharding: NamedSharding, explicit: bool) -> jax.Array:
    """``x`` laid out as ``sharding`` inside a jitted program."""
    if explicit:
        return jax.sharding.reshard(x, sharding)  # type: ignore[no-any-return]
    return jax.lax.with_sharding_constraint(x, sharding)  # type: ignore[no-any-return]


class Mover:
    """Moves arrays between layouts inside a traced program, one :func:`reshard_moves` step at
    a time, so that XLA emits exactly the collectives the cost model predicts. Each step is
    made once per array: two moves of one array that begin alike (for two readers, or a
    forward and a backward pass) share their first steps, as the cost model counts them (XLA
    merges only the first step of two such chains by itself). Entries hold their input alive,
    so an ``id`` is not reused while its entry exists."""

    def __init__(self, mesh: Mesh) -> None:
        self.mesh, self.explicit = mesh, is_explicit(mesh)
        self.memo: dict[tuple[int, Spec, Spec], tuple[Any, Any]] = {}

    def constrain(self, x: Any, spec: Spec) -> Any:
        """``x`` laid out as ``spec``."""
        return _reshard(x, named(self.mesh, spec), self.explicit)

    def move(self, x: Any, src: Spec, dst: Spec) -> Any:
        """``x``, held as ``src``, moved to ``dst`` (held there where the two are one)."""
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


def _mover(
    plan: Plan, mesh: Mesh, layout: Layout
) -> Callable[[tuple[jax.Array, ...]], tuple[jax.Array, ...]]:
    """Inside a jitted program: the operands, each moved to its spec under ``layout`` where it
    is not laid out so already (:class:`Mover`)."""
    pairs = [
        (spec.canonical(), layout.spec_for(term))
        for term, spec in zip(plan.op.inputs, plan.in_specs, strict=True)
    ]

    def move(xs: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
        mover = Mover(mesh)
        return tuple(
            x if src == dst else mover.move(x, src, dst)
            for x, (src, dst) in zip(xs, pairs, strict=True)
        )

    return move


def _local_sizes(plan: Plan, layout: Layout) -> dict[str, int]:
    """Each index's size in one device's block under ``layout``."""
    return local_sizes(plan.op.sizes(plan.shapes), layout, plan.mesh)


def _shard_mapped(
    plan: Plan, mesh: Mesh, precision: Any, layout: Layout, kernel: Kernel
) -> Callable[..., jax.Array]:
    """``jax.shard_map`` of the local step ``kernel`` on each device's block under ``layout``,
    then ``psum`` over the mesh axes that split a contracted index."""
    op = plan.op
    in_shardings = shardings(plan, mesh)
    out_sharding = named(mesh, plan.out_spec)
    local_in = tuple(layout.spec_for(t).to_partition_spec() for t in op.inputs)
    local_out = layout.spec_for(op.output).to_partition_spec()
    # a sum over an axis of one device does nothing, and would still compile to an all-reduce;
    # without it shard_map cannot prove the result whole along that axis, so it is told
    axes = reduce_axes(op, layout, plan.mesh)
    summed = tuple(a for a in axes if plan.mesh.shape[a] > 1)

    def per_device(*blocks: jax.Array) -> jax.Array:
        partial = local_einsum(op, kernel, *blocks, precision=precision)
        if not summed:
            return partial
        if partial.dtype == jnp.bool_:  # psum counts booleans; an einsum's sum of them is "any"
            counts: jax.Array = jax.lax.psum(partial.astype(jnp.int32), summed)
            return counts != 0
        total: jax.Array = jax.lax.psum(partial, summed)
        return total

    mapped = jax.shard_map(
        per_device,
        mesh=mesh,
        in_specs=local_in,
        out_specs=local_out,
        check_vma=summed == axes,
    )
    move = _mover(plan, mesh, layout)  # as for jnp.einsum, operands are moved in the program

    def program(*xs: jax.Array) -> jax.Array:
        return mapped(*move(xs))

    return jax.jit(program, in_shardings=in_shardings, out_shardings=out_sharding)
