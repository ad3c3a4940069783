"""The layouts a program's own code asks for (``jax.lax.with_sharding_constraint``, Flax's
``nn.with_logical_constraint``, ``jax.sharding.reshard``), held in its planning problem so that
every plan lays those arrays out as the code asks: ``plan(..., respect="constraints")``.

By default (``respect="none"``) the search leaves them free, and when a plan runs its layouts
stand in for the ones asked (:mod:`~shardwise._program.apply`). Held, a plan's layout at each
constraint is the one asked, so running it as planned is running it as written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from typing import Any

import jax
from jax.sharding import AbstractMesh, AxisType, Mesh

from shardwise._errors import ArgumentError, ShardwiseWarning, SpecError
from shardwise._model.mesh import MeshSpec
from shardwise._model.spec import Spec
from shardwise._program.annotations import Annotations
from shardwise._program.graph import Graph
from shardwise._program.nodes import Asked
from shardwise._program.problem import MAX_CHOICES, Problem
from shardwise._program.writable import writable

RESPECT = ("none", "annotations", "constraints", "names")
"""What ``plan``'s ``respect`` takes: ``"none"`` leaves the layouts the program's code asks
for to the search; ``"annotations"`` pins the inputs as annotated; ``"constraints"`` holds
every plan, the baselines' too, to the code's constraints; ``"names"`` keeps the search to
plans that rules over the model's logical names write."""


def check_respect(respect: object, top: int = 1) -> None:
    """Refuse a ``respect`` that is not one of :data:`RESPECT`, and a ``top`` under 1."""
    if top < 1:
        raise ArgumentError(f"top is {top}; give 1 or more plans to keep.")
    if respect not in RESPECT:
        raise ArgumentError(
            f"respect is {respect!r}, which is not one of its values; give 'none' (the search "
            "lays out every array, the code's sharding constraints included), 'annotations' "
            "(the inputs as the model's annotations say), 'constraints' (every array the "
            "code constrains keeps the layout the code asks for) or 'names' (every plan can be "
            "written as rules over the model's logical names)."
        )


def traced_under(devices: Mesh | None, mesh: MeshSpec, explicit: bool = False) -> Any:
    """What to trace the program under so that its constraints are in the trace: for a mesh
    given as a description (no JAX mesh), the mesh's abstract form, with Auto axes (Flax's
    logical constraints ask for nothing where no mesh is set, and a bare ``PartitionSpec``
    needs one), Explicit ones with ``explicit`` (code that asks for layouts with
    ``out_sharding=`` needs them); the mesh set around the call where it is of the same axes
    and sizes (it had been used whatever its axes: planning for ``data=2,model=4`` under a
    mesh of ``a`` and ``b`` found no ``data``); else nothing."""
    if devices is not None:
        return contextlib.nullcontext()
    around = jax.sharding.get_abstract_mesh()
    if not around.empty and dict(zip(around.axis_names, around.axis_sizes, strict=True)) == (
        mesh.shape
    ):
        return contextlib.nullcontext()
    names, sizes = zip(*mesh.axes, strict=True)
    kind = AxisType.Explicit if explicit else AxisType.Auto
    return jax.sharding.use_abstract_mesh(
        AbstractMesh(sizes, names, axis_types=(kind,) * len(names))
    )


def respected(
    graph: Graph, problem: Problem, mesh: MeshSpec, respect: str, annotations: Annotations
) -> Problem:
    """``problem`` (of ``graph`` on ``mesh``) with what ``respect`` holds: :func:`held` for
    ``"constraints"``, :func:`~shardwise._program.writable.writable` for ``"names"``; as it
    is otherwise (``"annotations"`` pins inputs, as ``fixed`` does)."""
    if respect == "names":
        if not any(a.logical and a.names for a in annotations.by_input.values()):
            raise ArgumentError(
                "respect='names' keeps every plan to what rules over the model's logical "
                "axis names can write, but no argument has logical names (Flax's "
                "nn.with_logical_partitioning, nnx.with_partitioning with names that the "
                "rules map): plan with respect='none' (--respect none), or annotate the parameters."
            )
        return writable(graph, problem, annotations)
    return held(graph, problem, mesh) if respect == "constraints" else problem


def held(graph: Graph, problem: Problem, mesh: MeshSpec) -> Problem:
    """``problem`` with each array whose layout the code asks for held to it: its class's
    choices limited to the asked layout (on the dimensions the code names; a dimension left
    ``P.UNCONSTRAINED`` stays free). A layout given on a mesh of other axes than ``mesh``'s
    is not held.

    A plan gives one layout to each class of arrays: an array, the arrays elementwise ops join
    it to, and the result of a constraint on it. Where the code asks one class for layouts
    that contradict each other (XLA would move the array between them), the first asked in
    program order holds, and a :class:`ShardwiseWarning` names each later one not kept.

    Raises:
        SpecError: a layout asked for is not one the array can have on ``mesh`` (a dimension
            its axes do not divide), naming the line that asks.
    """
    var_of = {label: k for k, label in enumerate(problem.labels)}
    axes = dict(mesh.splitting)  # (one of size 1 splits nothing)
    keep: dict[int, list[int]] = {}
    first: dict[int, Asked] = {}
    overruled: list[str] = []
    for ask in graph.placed:
        if dict(ask.mesh) != dict(mesh.axes):
            continue
        var = var_of[("class", graph.find(ask.value))]
        rank = len(graph.values[ask.value].shape)
        want = Spec(tuple(tuple(a for a in e if a in axes) for e in ask.spec.padded(rank)))
        fits = [
            k for k, choice in enumerate(problem.choices[var])
            if _agrees(choice, want, ask.free, rank)
        ]  # fmt: skip
        if not fits:
            raise _not_a_layout(graph, problem, ask, mesh)
        if var not in keep:
            keep[var], first[var] = fits, ask
        elif both := [k for k in keep[var] if k in fits]:
            keep[var] = both
        else:
            overruled.append(_overruled(graph, ask, first[var]))
    if overruled:
        warnings.warn(
            "the program's code asks some arrays for two layouts, where the plan gives them "
            f"one; the first asked holds: {'; '.join(overruled)}.",
            ShardwiseWarning,
            stacklevel=4,  # the call of plan
        )
    where = tuple((var, ask.source or "a sharding constraint") for var, ask in first.items())
    return dataclasses.replace(problem.restrict(keep), held=where)


def _agrees(choice: Spec, want: Spec, free: frozenset[int], rank: int) -> bool:
    """Whether ``choice`` lays out every dimension not in ``free`` as ``want`` does."""
    pairs = zip(choice.padded(rank), want.padded(rank), strict=True)
    return all(d in free or got == asked for d, (got, asked) in enumerate(pairs))


def _named(graph: Graph, ask: Asked) -> str:
    value = graph.values[ask.value]
    return (
        f"{value.name} (shape {value.shape}) as {ask.spec.describe()} at "
        f"{ask.source or 'a sharding constraint'}"
    )


def _overruled(graph: Graph, ask: Asked, kept: Asked) -> str:
    return f"{_named(graph, ask)}, not kept: it shares its layout with {_named(graph, kept)}"


def _not_a_layout(graph: Graph, problem: Problem, ask: Asked, mesh: MeshSpec) -> SpecError:
    """Why the layout ``ask`` names is none of its array's choices, and what to do."""
    value = graph.values[ask.value]
    what = f"{value.name} (shape {value.shape}), constrained to {ask.spec.describe()} at " + (
        ask.source or "a sharding constraint"
    )
    fix = " Change the constraint there, or plan with respect='none' to leave it to the search."
    try:
        ask.spec.validate(mesh, value.shape, what)
    except SpecError as e:
        return type(e)(f"{e}{fix}")
    if problem.truncated:
        return SpecError(
            f"{what}: that layout is not among the {MAX_CHOICES:,} the search kept for it "
            "(it has more on this mesh). Plan a mesh with fewer axes (merge axes, e.g. x=2,y=2 "
            f"as xy=4).{fix}"
        )
    return SpecError(
        f"{what}: that layout puts mesh axes on one dimension out of the mesh's order "
        f"({', '.join(a for a, _ in mesh.axes)}), which the planner does not lay out; write "
        f"them in the mesh's order.{fix}"
    )
