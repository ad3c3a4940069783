"""Run a program plan on the devices at hand and check it against the prediction: the compiled
program's collectives (kind, mesh axes, bytes), its memory, and its measured time."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding

from shardwise._caches import Bounded
from shardwise._errors import ArgumentError, ShardwiseWarning, check_count
from shardwise._model.mesh import MeshSpec
from shardwise._model.profile_use import check_platform
from shardwise._model.spec import Spec
from shardwise._program.apply import constrained
from shardwise._program.arguments import (
    check_arguments,
    donated_leaves,
    donated_once,
    first_difference,
    moved_text,
    parameter_names,
    planned_types,
)
from shardwise._program.attribution import as_compiled, attributed
from shardwise._program.guard import ensure_summed
from shardwise._runtime.distributed import put
from shardwise._runtime.timing import TURN_SECONDS, alternate, ordered_pairs, spearman
from shardwise._versions import (
    keys,
    sources_in_users_code,
)
from shardwise._xla.dtypes import x64
from shardwise._xla.hlo import collectives
from shardwise._xla.meshes import (
    auto_twin,
    explicit_part,
    is_explicit,
    jax_mesh,
    on_mesh,
    platform,
    with_auto_axes,
)
from shardwise._xla.verified import Verified, collectives_match

if TYPE_CHECKING:
    from shardwise._program.plans import PlannedLayout, ProgramPlan


def mesh_for(plan: ProgramPlan, mesh: Any) -> Mesh:
    """The mesh to run on: ``mesh`` if given, else the JAX mesh the plan was made for, else
    one of the planned shape built on the devices at hand."""
    if mesh is not None:
        given = jax_mesh(mesh)
        if MeshSpec.parse(given).shape != plan.mesh.shape:  # (same axes, same sizes)
            raise ArgumentError(
                f"the plan was made for mesh {plan.mesh.describe()}, but mesh "
                f"{MeshSpec.parse(given).describe()} was given: its layouts name those axes at "
                "those sizes. Plan again for this mesh, or give one of the plan's axes and sizes."
            )
        return given
    return plan.devices if plan.devices is not None else jax_mesh(plan.mesh)


def sharded(
    plan: ProgramPlan, chosen: PlannedLayout, mesh: Any = None, donate: bool = True
) -> Callable[..., Any]:
    """The program, jitted to follow ``chosen`` on ``mesh`` (donating the plan's
    ``donate_argnums`` where ``donate``). On a mesh with Explicit axes it
    runs with the axes Auto inside (every layout is the plan's, so no op need be told its
    result's) and gives its results in the plan's layouts on ``mesh``. Arguments laid out
    otherwise are moved to the plan's layouts first (:class:`Placing`), and the program is
    checked for a sum XLA left out when it is first compiled for its arguments
    (:func:`~shardwise._program.guard.ensure_summed`)."""
    m = mesh_for(plan, mesh)
    program = constrained(plan.graph, auto_twin(m), chosen.layouts)
    # named after the user's function, so the compiled HLO reads jit(mlp), not jit(program)
    program.__name__ = program.__qualname__ = plan.program
    leaves = [NamedSharding(m, s.to_partition_spec()) for s in chosen.in_specs]
    in_shardings = tuple(jax.tree.unflatten(plan.graph.tree, leaves))
    if is_explicit(m):
        # (an empty result is typed replicated: JAX gives an empty array laid out split as
        # whole blocks on every device, which np.asarray then cannot read)
        outs = [
            _typed(
                m,
                chosen.layouts.specs[v]
                if v is not None and plan.graph.values[v].nbytes
                else Spec(),
            )
            for v in plan.graph.outputs
        ]
        program = with_auto_axes(program, jax.tree.unflatten(plan.graph.out_tree, outs))
    guard = functools.partial(ensure_summed, plan, chosen, platform=platform(m))
    donated = plan.donate_argnums if donate else ()
    jitted = jax.jit(program, in_shardings=in_shardings, donate_argnums=donated)
    return Placing(jitted, in_shardings, plan.graph.names, guard, m, planned_types(plan),
                   donated_leaves(plan.graph.tree, donated), plan.graph.parameters)  # fmt: skip


_CHECKED: Bounded[tuple[Any, ...], bool] = Bounded(512)
"""The jitted programs already checked, with the types of the arguments they were compiled
for: each is checked once, when ``jax.jit`` compiles it."""


def _typed(mesh: Mesh, spec: Spec) -> NamedSharding:
    """What a result laid out as ``spec`` has for its type on ``mesh``
    (:func:`~shardwise._xla.meshes.explicit_part`)."""
    return NamedSharding(mesh, explicit_part(mesh, spec).to_partition_spec())


class Placing:
    """A jitted program that first moves each argument laid out otherwise than its
    ``in_shardings`` (an array another program made, or one a library placed) to the plan's
    layout, on the devices, and says so once: ``jax.jit`` would refuse it. The first call for
    arguments of new types compiles the program ahead (``jax.jit`` then reuses it) and hands
    it to ``guard``, which raises if it must not run."""

    def __init__(
        self, jitted: Any, in_shardings: Any, names: Sequence[str], guard: Any = None,
        mesh: Mesh | None = None, shapes: Sequence[Any] | None = None,
        donated: frozenset[int] = frozenset(), parameters: Sequence[str] = (),
    ) -> None:  # fmt: skip
        self.jitted, self.in_shardings, self.names = jitted, in_shardings, names
        self.parameters = parameters  # (the function's names for its arguments)
        self.guard, self.mesh, self.shapes = guard, mesh, shapes
        self.donated = donated  # (the leaves whose buffers it takes)
        self.said = False

    def _on_mesh(self, args: tuple[Any, ...]) -> Any:
        """Where a call runs: on the plan's mesh, whatever mesh ``jax.set_mesh`` set around it
        (on another, with Explicit axes, JAX refuses the plan's layouts; :func:`on_mesh`)."""
        if self.mesh is None:
            return contextlib.nullcontext()
        return on_mesh(self.mesh, jax.tree.leaves(args))

    def bound(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        """``args`` and ``kwargs`` as the positional arguments the plan was made for (by the
        function's parameter names), checked against the planned arguments' structure."""
        expected = jax.tree.structure(self.in_shardings)
        params = parameter_names(self.names, expected, self.parameters)
        given = list(args)
        for name in params[len(args) :]:
            if name not in kwargs:
                break
            given.append(kwargs.pop(name))
        said = ", ".join(params)
        if kwargs:
            raise ArgumentError(
                f"{', '.join(map(repr, kwargs))}: not a parameter after the {len(args)} given by "
                f"position; the planned program takes ({said}), by position or by these names."
            )
        if len(given) != len(params):
            raise ArgumentError(
                f"the planned program takes {len(params)} argument"
                f"{'s' if len(params) != 1 else ''} ({said}), as planned; {len(given)} "
                f"{'was' if len(given) == 1 else 'were'} given."
            )
        found = jax.tree.structure(tuple(given))
        if found != expected:  # type: ignore[operator]
            raise ArgumentError(
                f"the arguments differ from those the plan was made for ({said}): "
                f"{first_difference(expected, tuple(given), params)}. Give them as they were "
                "planned, or plan again with these."
            )
        return tuple(given)

    def placed(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        leaves, tree = jax.tree.flatten(args)
        if self.shapes is not None and len(leaves) == len(self.shapes):
            check_arguments(self.names, leaves, self.shapes)
        targets = jax.tree.leaves(self.in_shardings)
        moved, out = [], []
        for name, x, target in zip(self.names, leaves, targets, strict=True):
            if isinstance(x, jax.ShapeDtypeStruct) and _elsewhere(x, target):
                x = jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=target)  # nothing to move
            elif _elsewhere(x, target):
                moved.append(f"{name} ({moved_text(x.sharding, target)})")
                x = jax.device_put(x, target)
            out.append(x)
        donated_once(self.names, out, self.donated)
        if moved and not self.said:
            self.said = True
            warnings.warn(
                f"moved {len(moved)} argument{'s' if len(moved) != 1 else ''} to the plan's "
                f"layouts before running: {', '.join(moved)}. Place them once with "
                "plan.place(args) so that no call moves them again.",
                ShardwiseWarning,
                stacklevel=3,
            )
        return tuple(jax.tree.unflatten(tree, out))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        args = self.bound(args, kwargs)
        with self._on_mesh(args):
            placed = self.placed(args)
            self.check(placed)
            return self.jitted(*placed)

    def check(self, args: tuple[Any, ...]) -> None:
        """Hand the program compiled for ``args`` to the guard, once per argument types (a
        traced call is part of another program, checked, if at all, as that one)."""
        leaves, tree = jax.tree.flatten(args)
        if self.guard is None or any(isinstance(x, jax.core.Tracer) for x in leaves):
            return
        key = (self.jitted, tree, tuple(map(jax.typeof, leaves)), x64())
        if _CHECKED.get(key) is None:
            with sources_in_users_code():  # the lines the plan's steps name
                lowered = self.jitted.lower(*args)
            self.guard(lowered, lowered.compile())
            _CHECKED.put(key, True)

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        """The program lowered for ``args`` (moved as a call would move them)."""
        args = self.bound(args, kwargs)
        with self._on_mesh(args):
            return self.jitted.lower(*self.placed(args))


def place(plan: ProgramPlan, chosen: PlannedLayout, args: Any, mesh: Any = None) -> Any:
    """``args`` (the program's arguments, as pytrees) with each array laid out as ``chosen``
    says on ``mesh``: an array on the devices moves between them (each device receives its
    block), a host array is cut on the host and each block sent to its device, so none is
    ever whole on one device. An array already so laid out is returned as it is."""
    m = mesh_for(plan, mesh)
    params = parameter_names(plan.graph.names, plan.graph.tree, plan.graph.parameters)
    if not isinstance(args, tuple | list):
        raise ArgumentError(
            f"place takes the arguments ({', '.join(params)}) as a tuple, e.g. "
            f"place(({', '.join(params)}{',' if len(params) == 1 else ''})); got "
            f"{type(args).__name__}."
        )
    leaves, tree = jax.tree.flatten(tuple(args))
    if tree != plan.graph.tree:
        raise ArgumentError(
            f"place takes the arguments the plan was made for ({', '.join(params)}): "
            f"{first_difference(plan.graph.tree, tuple(args), params)}."
        )
    check_arguments(plan.graph.names, leaves, planned_types(plan))
    shapes = [n for n, x in zip(plan.graph.names, leaves, strict=True)
              if isinstance(x, jax.ShapeDtypeStruct)]  # fmt: skip
    if shapes:  # (it had failed inside JAX's sharding code with an IndexError)
        raise ArgumentError(
            f"{shapes[0]} is a jax.ShapeDtypeStruct, a shape without data: place moves arrays "
            "onto the devices; give it the arrays (plan takes either)."
        )
    out = []
    for x, spec in zip(leaves, chosen.in_specs, strict=True):
        target = NamedSharding(m, spec.to_partition_spec())
        if isinstance(x, jax.Array) and not _elsewhere(x, target) and getattr(x, "committed", True):
            out.append(x)
        else:
            out.append(put(x, target))
    return jax.tree.unflatten(tree, out)


def _elsewhere(x: Any, target: NamedSharding) -> bool:
    """Whether ``x`` is an array on the devices (or the shape of one, with a sharding) laid
    out otherwise than ``target``, or on a mesh of other axis types (a traced value or a host
    array is placed by ``jax.jit`` itself)."""
    if isinstance(x, jax.ShapeDtypeStruct):
        if x.sharding is None:
            return False
    elif (
        not isinstance(x, jax.Array)
        or isinstance(x, jax.core.Tracer)
        or not getattr(x, "committed", True)
    ):
        return False
    mesh = getattr(x.sharding, "mesh", None)
    if mesh is not None and tuple(mesh.axis_types) != tuple(target.mesh.axis_types):
        return True
    return not x.sharding.is_equivalent_to(target, len(x.shape))


def _arrays(plan: ProgramPlan) -> list[Any]:
    """Inputs to run the plans on: small normal numbers, and for a PRNG key a key."""
    rng = np.random.default_rng(0)
    out: list[Any] = []
    for v, var in zip(plan.graph.inputs, plan.graph.closed.jaxpr.invars, strict=True):
        value = plan.graph.values[v]
        if jnp.issubdtype(var.aval.dtype, jax.dtypes.prng_key):
            out.append(keys(var.aval.dtype, value.shape))
            continue
        data = rng.standard_normal(value.shape) * 0.1
        out.append(data.astype(value.dtype))
    return out


def compile_program(
    plan: ProgramPlan, item: PlannedLayout, mesh: Any, leaves: Sequence[np.ndarray]
) -> tuple[Any, Any, Any]:
    """``item`` lowered and compiled on ``mesh`` without donating (it runs again and again on
    the same arguments), and ``leaves`` (the program's inputs, flat) placed as its inputs'
    specs say and arranged as the program's arguments."""
    placed = [
        jax.device_put(x, NamedSharding(mesh, s.to_partition_spec()))
        for x, s in zip(leaves, item.in_specs, strict=True)
    ]
    args = jax.tree.unflatten(plan.graph.tree, placed)
    with sources_in_users_code():  # the sources the plan's names give
        lowered = sharded(plan, item, mesh, donate=False).lower(*args)  # type: ignore[attr-defined]
    return lowered, lowered.compile(), args


def same_programs(plans: Sequence[PlannedLayout]) -> dict[str, str]:
    """Each plan that is the same program as one before it in ``plans`` (the same inputs'
    layouts, the same layouts within and the same predicted collectives: a baseline that is
    the search's plan), by name, with that plan's name: two runs of one program differ only by
    the machine's noise (seen: 24% between a plan and its twin, which then decided which plan
    "ran fastest")."""
    out: dict[str, str] = {}
    for k, item in enumerate(plans):
        for earlier in plans[:k]:
            if (
                item.in_specs == earlier.in_specs
                and item.layouts == earlier.layouts
                and item.predicted.collectives == earlier.predicted.collectives
            ):
                out[item.name] = earlier.name
                break
    return out


def verify(
    plan: ProgramPlan, repeat: int = 5, mesh: Any = None, on_step: Any = None
) -> ProgramPlan:
    """Compile and compare every plan of ``plan`` on ``mesh`` (but a baseline over the
    budget), then time them all taking turns (median of ``repeat`` turns each, a turn at least
    :data:`TURN_SECONDS` long), so that the machine's drift falls on all alike. A plan made
    with a profile of another platform is refused (``ArgumentError``): it predicts what XLA
    does there, not here. A plan that is the same program as another (:func:`same_programs`)
    is compiled and timed once, both get what it did, and the rank correlation and the pairs
    ordered count it once."""
    check_count("repeat", repeat)
    m = mesh_for(plan, mesh)
    check_platform(plan.profile, platform(m), "verifying")
    leaves = _arrays(plan)
    checked = []
    runners = {}
    runnable = plan.runnable
    twins = same_programs(runnable)
    for k, item in enumerate(runnable):
        if on_step is not None:
            on_step(k, len(runnable))
        if item.name in twins:
            continue
        lowered, compiled, args = compile_program(plan, item, m, leaves)
        text = ensure_summed(plan, item, lowered, compiled, platform(m))
        got = tuple(collectives(text, plan.mesh.shape))
        want = tuple(as_compiled(plan.graph.loops, item.predicted.collectives))
        memory = compiled.memory_analysis()
        if plan.donate_argnums:  # (the memory as donated, on the arguments placed above)
            donating = sharded(plan, item, m).lower(*args)  # type: ignore[attr-defined]
            memory = donating.compile().memory_analysis()
        held = None
        if memory is not None:
            held = int(memory.argument_size_in_bytes + memory.output_size_in_bytes
                       + memory.temp_size_in_bytes - memory.alias_size_in_bytes)  # fmt: skip
        match = collectives_match(want, got, by_bytes=True)
        checked.append((item, match, attributed(want, got), held, got))
        runners[item.name] = functools.partial(compiled, *args)
    seconds = alternate(runners, repeat, at_least=TURN_SECONDS)
    verified = {
        item.name: Verified(match, seconds[item.name], got, held, sources)
        for item, match, sources, held, got in checked
    }
    verified |= {name: verified[twin] for name, twin in twins.items()}
    # a plan over the budget is not run: on devices of that memory it would not fit
    done = [dataclasses.replace(p, verified=verified.get(p.name)) for p in plan.plans]
    ran = [p for p in done if p.verified is not None and p.name not in twins]  # (once each)
    predicted = [p.predicted.seconds for p in ran]
    measured = [p.verified.seconds for p in ran if p.verified]
    share, pairs = ordered_pairs(predicted, measured)
    return dataclasses.replace(
        plan, plans=tuple(done), spearman=spearman(predicted, measured), ordered=share,
        ordered_pairs=pairs,
    )  # fmt: skip


def tune(plan: ProgramPlan, repeat: int = 5, mesh: Any = None, on_step: Any = None) -> ProgramPlan:
    """:func:`verify` every plan of ``plan``, then choose the one that ran fastest among those
    that keep the inputs ``fixed`` pinned as pinned (a baseline may lay them out its own way),
    by any margin: plans within about 1% of each other trade places from one timing to the
    next, and either is as good a choice."""
    done = verify(plan, repeat, mesh, on_step)
    fastest = done.fastest_measured()
    return dataclasses.replace(done, chosen_name=fastest.name if fastest else "search", tuned=True)
