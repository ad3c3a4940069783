"""Compile a plan (or any sharded function) and read back what XLA did.

An :class:`Explanation` holds each array's layout and shards, every collective
with its cause, and the memory and compute per device.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding

from shardwise._caches import cached
from shardwise._model.cost import predict
from shardwise._model.mesh import MeshSpec
from shardwise._model.plan import ArrayInfo, Plan
from shardwise._model.profile import BUILTIN
from shardwise._model.spec import Layout, Spec, placements
from shardwise._model.strategy import Strategy, reduce_axes
from shardwise._xla.cause import Cause, einsum_cause, generic_cause
from shardwise._xla.check import contraction_problems, ensure_sound
from shardwise._xla.dtypes import storage_name
from shardwise._xla.hlo import Collective, collectives
from shardwise._xla.lower import jitted, target_layout
from shardwise._xla.meshes import named, platform
from shardwise._xla.names import argument_names, result_names
from shardwise._xla.resources import Compute, Memory, compute_of, memory_of


@dataclass(frozen=True, slots=True)
class Explanation:
    """What a compiled sharded computation does on each device.

    Attributes:
        equation: the einsum equation, or ``None`` for an arbitrary function.
        mesh: the mesh it ran on.
        mode: ``"auto"`` (XLA inserts collectives) or ``"manual"`` (shard_map + psum).
        operands: each input's shape, dtype, spec and shard shape.
        outputs: the same for each output (one for an einsum).
        collectives: every collective in the compiled HLO, in program order.
        causes: why each collective is there (same order).
        memory: bytes per device, where XLA reports them.
        compute: FLOPs and bytes accessed per device, where XLA reports them.
        local: an einsum's per-device result before any collective (``None`` for functions).
        partial_axes: mesh axes over which ``local`` holds partial sums.
        device_ids: the JAX device id at each mesh position.
        auto: with ``layout="auto"``, which strategy the planner chose and why.
        problems: why the compiled program would return a wrong result (a sum XLA left out,
            see :func:`~shardwise._xla.check.contraction_problems`); ``()`` when none is found.
            shardwise refuses to run such a program.
    """

    equation: str | None
    mesh: MeshSpec
    mode: str
    operands: tuple[ArrayInfo, ...]
    outputs: tuple[ArrayInfo, ...]
    collectives: tuple[Collective, ...]
    causes: tuple[Cause, ...] = ()
    memory: Memory | None = None
    compute: Compute | None = None
    local: ArrayInfo | None = None
    partial_axes: tuple[str, ...] = ()
    device_ids: tuple[int, ...] = field(default=())
    auto: str | None = None
    problems: tuple[str, ...] = ()

    @property
    def output(self) -> ArrayInfo:
        """The single output (einsums have exactly one)."""
        return self.outputs[0]

    def placements(self, info: ArrayInfo, partial: tuple[str, ...] = ()) -> str:
        """``(S(0), P(y))``-style placements of one array on this mesh."""
        return placements(info.spec, len(info.shape), self.mesh, partial)

    def to_json(self) -> dict[str, Any]:
        """The ``shardwise explain --json`` contract (later work adds keys, never removes them)."""

        def arr(info: ArrayInfo, partial: tuple[str, ...] = ()) -> dict[str, Any]:
            return {**info.to_json(), "placements": self.placements(info, partial)}

        comms = []
        for k, c in enumerate(self.collectives):
            item = c.to_json()
            cause = self.causes[k] if k < len(self.causes) else generic_cause(c)
            item["cause"] = cause.to_json()
            item["hlo_op"] = c.op_name or c.hlo_name
            item["source"] = c.source or None
            comms.append(item)
        data: dict[str, Any] = {
            "equation": self.equation,
            "mesh": self.mesh.shape,
            "mode": self.mode,
            "operands": [arr(o) for o in self.operands],
            "output": arr(self.outputs[0]) if len(self.outputs) == 1 else None,
            "collectives": comms,
            "axis_type": self.mesh.axis_type,
            "memory": self.memory.to_json() if self.memory else None,
            "compute": self.compute.to_json() if self.compute else None,
            "device_ids": list(self.device_ids),
            "problems": list(self.problems),
        }
        if self.auto is not None:
            data["auto"] = self.auto
        if self.local is not None:
            data["local"] = {
                **arr(self.local, self.partial_axes),
                "partial": list(self.partial_axes),
            }
        if len(self.outputs) != 1:
            data["outputs"] = [arr(o) for o in self.outputs]
        return data

    def __rich__(self) -> Any:
        from shardwise.render.terminal import explanation_view

        return explanation_view(self)

    def __str__(self) -> str:
        from shardwise.render.terminal import to_text

        return to_text(self)

    def _repr_html_(self) -> str:
        """The report of :meth:`to_html` as one element to show inside a page (a notebook's
        cell): its styles and script touch nothing outside it."""
        from shardwise.render.explanation import explanation_report

        return explanation_report(self.to_json(), page=False)

    def to_html(self) -> str:
        """One self-contained HTML file (no network needed to view it): every array drawn on
        the mesh (point at a device to see what it holds) with the index ranges of each block,
        the data-flow picture (with the ``pictures`` extra), the collectives with their causes,
        memory and compute per device."""
        from shardwise._extras import available
        from shardwise.render.explanation import explanation_report

        picture = self.svg() if available("matplotlib") else None
        return explanation_report(self.to_json(), picture)

    def svg(self) -> str:
        """The data-flow picture as SVG text (needs the ``pictures`` extra: matplotlib)."""
        from shardwise.render.figure import to_svg

        return to_svg(self)


def mesh_matches(plan: Plan, mesh: Mesh) -> None:
    """Guard against running a plan on a mesh of another shape."""
    have = MeshSpec.parse(mesh)
    if have.axes != plan.mesh.axes:
        raise ValueError(f"plan is for mesh {plan.mesh.describe()}, got {have.describe()}")


def compile_plan(plan: Plan, mesh: Mesh, precision: Any = None) -> jax.stages.Compiled:
    """Lower and compile ``plan`` on ``mesh`` from shapes alone (no data needed). An empty
    einsum in manual mode is compiled as in auto mode: ``einsum`` never runs it (it places
    zeros), and XLA cannot compile a manual computation of empty blocks."""
    mesh_matches(plan, mesh)
    if plan.empty and plan.mode == "manual":
        plan = dataclasses.replace(plan, mode="auto")
    return _compiled(jitted(plan, mesh, precision), plan, mesh)


@cached(maxsize=128)
def _compiled(fn: Any, plan: Plan, mesh: Mesh) -> jax.stages.Compiled:
    args = [
        jax.ShapeDtypeStruct(info.shape, np.dtype(plan.dtype), sharding=named(mesh, info.spec))
        for info in plan.operands
    ]
    return fn.lower(*args).compile()  # type: ignore[no-any-return]


def compile_sound(plan: Plan, mesh: Mesh, precision: Any = None) -> jax.stages.Compiled:
    """:func:`compile_plan`, then raise :class:`~shardwise.MiscompileError` if the program
    leaves out a sum (:func:`~shardwise._xla.check.contraction_problems`); checked once per
    program, as every program shardwise runs is."""
    compiled = compile_plan(plan, mesh, precision)
    _ensure_sound(compiled, plan, platform(mesh))
    return compiled


@cached(maxsize=256)
def _ensure_sound(compiled: jax.stages.Compiled, plan: Plan, platform: str) -> None:
    found = collectives(compiled.as_text() or "", plan.mesh.shape)
    ensure_sound(plan, found, target_layout(plan, platform), platform)


def _device_ids(mesh: Mesh) -> tuple[int, ...]:
    return tuple(int(d.id) for d in mesh.devices.flat)


def explain_compiled(plan: Plan, compiled: Any, mesh: Mesh | None = None) -> Explanation:
    """The explanation of a compiled einsum plan."""
    # the source lines of an einsum's collectives are shardwise's own lowering: leave them out
    text = compiled.as_text() or ""
    found = tuple(dataclasses.replace(c, source="") for c in collectives(text, plan.mesh.shape))
    out_shape = plan.output_shape
    device = mesh.devices.flat[0] if mesh is not None else jax.devices()[0]
    # each device's result before any collective, on the layout the operands are brought to
    layout = target_layout(plan, device.platform)
    produced = layout.spec_for(plan.op.output)
    local = ArrayInfo(out_shape, plan.dtype, produced, produced.shard_shape(plan.mesh, out_shape))
    return Explanation(
        equation=plan.op.equation,
        mesh=plan.mesh,
        mode=plan.mode,
        operands=plan.operands,
        outputs=(plan.output,),
        collectives=found,
        causes=tuple(einsum_cause(plan, c) for c in found),
        memory=memory_of(compiled, device),
        # XLA counts a call into native code as -1 FLOPs and bytes: count the einsum instead
        compute=_counted(plan, layout) if NATIVE_CALL in text else compute_of(compiled),
        local=local,
        partial_axes=reduce_axes(plan.op, layout, plan.mesh),
        device_ids=_device_ids(mesh) if mesh is not None else tuple(range(plan.mesh.size)),
        problems=contraction_problems(plan, found, layout, device.platform),
    )


NATIVE_CALL = 'custom_call_target="shardwise_'
"""How a call into one of :mod:`shardwise._xla.native`'s kernels reads in compiled HLO."""


def _counted(plan: Plan, layout: Layout) -> Compute | None:
    """The local einsum's FLOPs and bytes as the cost model counts them: for a program that
    XLA cannot count (it calls a native kernel, see :mod:`shardwise._xla.native`)."""
    strategy = Strategy(layout, plan.out_spec)
    p = predict(plan.op, plan.shapes, plan.dtype, plan.mesh, strategy, BUILTIN["cpu-2core"])
    return Compute(p.flops, float(p.bytes_accessed), 0.0, counted_by="einsum")


def explain_function(
    compiled: Any,
    args: Sequence[Any],
    mesh: Mesh,
    fn: Any = None,
    problems: Sequence[str] = (),
    text: str | None = None,
) -> Explanation:
    """The explanation of any compiled sharded function; arrays are named by ``fn``'s
    parameters and pytree paths (``x``, ``params['w1']``) and the result's paths; ``problems``
    are what makes it return a wrong result (:func:`~shardwise._xla.check.dot_problems`);
    ``text``: the program's text as that check read it (with its own source lines, where the
    persistent compilation cache gave it others: :mod:`~shardwise._xla.located`)."""
    spec = MeshSpec.parse(mesh)
    in_names = argument_names(fn, args) if fn is not None else []
    out_names = result_names(compiled.out_info)
    in_leaves = jax.tree.leaves(args)
    # (an argument the function does not read is left out of the compiled program: None)
    in_shardings = jax.tree.leaves(compiled.input_shardings[0], is_leaf=lambda s: s is None)
    out_avals = jax.tree.leaves(compiled.out_info)
    out_shardings = jax.tree.leaves(compiled.output_shardings)
    read = (compiled.as_text() or "") if text is None else text
    found = tuple(collectives(read, spec.shape))
    return Explanation(
        equation=None,
        mesh=spec,
        mode="auto",
        operands=tuple(
            dataclasses.replace(
                array_info(
                    np.shape(x), x.dtype if hasattr(x, "dtype") else jnp.result_type(x), s, spec
                ),  # (a Python number in a pytree: a scalar)
                name=_at(in_names, k, f"args[{k}]"),
            )
            for k, (x, s) in enumerate(zip(in_leaves, in_shardings, strict=True))
            if s is not None
        ),
        outputs=tuple(
            dataclasses.replace(array_info(o.shape, o.dtype, s, spec), name=_at(out_names, k, ""))
            for k, (o, s) in enumerate(zip(out_avals, out_shardings, strict=True))
        ),
        collectives=found,
        causes=tuple(generic_cause(c) for c in found),
        memory=memory_of(compiled, mesh.devices.flat[0]),
        compute=compute_of(compiled),
        device_ids=_device_ids(mesh),
        problems=tuple(problems),
    )


def _at(names: Sequence[str], k: int, default: str) -> str:
    return names[k] if k < len(names) else default


def array_info(shape: Sequence[int], dtype: Any, sharding: Any, mesh: MeshSpec) -> ArrayInfo:
    """Describe one array of a compiled function from its sharding."""
    shape_t = tuple(int(n) for n in shape)
    if isinstance(sharding, NamedSharding):
        spec = Spec.parse(sharding.spec)
        shard = spec.shard_shape(mesh, shape_t)
    else:
        spec = Spec(())
        shard = tuple(sharding.shard_shape(shape_t)) if sharding is not None else shape_t
    return ArrayInfo(shape_t, storage_name(dtype), spec, shard)  # (a PRNG key: its bytes')
