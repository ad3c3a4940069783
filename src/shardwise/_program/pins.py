"""Inputs pinned to layouts: the names ``fixed=`` gives, checked on the mesh, and a problem
restricted to them (the baselines' pins, the user's and the code's annotations)."""

from __future__ import annotations

from collections.abc import Mapping

from shardwise._errors import ArgumentError, ArgumentTypeError, SpecError
from shardwise._model.mesh import MeshSpec
from shardwise._model.spec import Spec, SpecLike
from shardwise._program.fold import restricted
from shardwise._program.graph import Graph
from shardwise._program.problem import MAX_CHOICES, Problem, splitting
from shardwise._xla.names import find_name


def input_vars(graph: Graph, problem: Problem) -> list[int]:
    """The variable of each input's class, in input order."""
    var_of = {label: k for k, label in enumerate(problem.labels)}
    return [var_of[("class", graph.find(v))] for v in graph.inputs]


def pinned(
    graph: Graph, problem: Problem, pins: Mapping[int, Spec], mesh: MeshSpec, given: bool = False
) -> Problem:
    """``problem`` with the inputs in ``pins`` fixed to their specs (on ``mesh``: an axis of
    size 1 splits nothing, :func:`~shardwise._program.problem.splitting`). Pins the user
    ``given`` (``fixed=``, annotations) of inputs laid out as one must agree; a baseline's,
    which pin every input, take each class's first (a bias added to the batch: data-parallel
    pins the batch, and the bias follows it)."""
    keep: dict[int, list[int]] = {}
    by: dict[int, tuple[int, Spec]] = {}  # each variable's first pin: (input, spec)
    variables = input_vars(graph, problem)  # once for all pins, not once per pin
    held = dict(problem.held)
    for k, asked in pins.items():
        spec = splitting(asked, mesh)
        root = graph.find(graph.inputs[k])
        var = variables[k]
        if var in keep:
            if given:
                _pinned_alike(graph, by[var], (k, spec))
            continue
        by[var] = (k, spec)
        choices = problem.choices[var]
        if spec not in choices and var in held:
            raise SpecError(
                f"{graph.names[k]} cannot be laid out as {spec.describe()}: the program's code "
                f"asks for its layout at {held[var]}, and the plan respects it. Plan with "
                "respect='none' to leave it free, or pin it as the code asks."
            )
        if spec not in choices and problem.truncated:
            raise SpecError(
                f"{graph.names[k]} as {spec.describe()} is not among the layouts the search "
                f"kept for it: it has more than {MAX_CHOICES:,} on this mesh. Plan a mesh with "
                "fewer axes (merge axes, e.g. x=2,y=2 as xy=4)."
            )
        if spec not in choices:
            raise SpecError(
                f"{graph.names[k]} cannot be laid out as {spec.describe()} on this mesh: "
                f"{_why_not(spec, graph.values[root].shape, mesh)}"
            )
        keep[var] = [choices.index(spec)]
    out = problem.restrict(keep)
    restricted(out, keep, problem)
    return out


def _why_not(spec: Spec, shape: tuple[int, ...], mesh: MeshSpec) -> str:
    """Why ``spec`` is not a layout the search has for an array of ``shape``: axes that split
    one dimension in another order than the mesh's (the search orders them as the mesh does),
    or a dimension they do not divide."""
    order = {a: n for n, a in enumerate(mesh.names)}
    for entry in spec.entries:
        ordered = sorted(entry, key=lambda a: order.get(a, -1))
        if list(entry) != ordered:
            return (
                f"({','.join(entry)}) splits one dimension in another order than the mesh's "
                f"axes ({', '.join(mesh.names)}), and plans order them as the mesh does. Write "
                f"({','.join(ordered)}), or order the mesh's axes as you need them."
            )
    return f"its shape {shape} does not divide."


def _pinned_alike(graph: Graph, first: tuple[int, Spec], second: tuple[int, Spec]) -> None:
    """Two pins of inputs the program lays out as one (an optimizer's moment and its weight,
    which an elementwise update reads together) must agree; a second pin had been dropped."""
    (a, one), (b, other) = first, second
    if one.canonical() != other.canonical():
        raise SpecError(
            f"{graph.names[a]} ({one.describe()}) and {graph.names[b]} ({other.describe()}) "
            "are pinned apart, but the plan lays them out as one (an elementwise op reads "
            "both, as an optimizer's update reads a weight and its moments); pin them alike, "
            "or pin one."
        )


def fixed_pins(
    graph: Graph, fixed: Mapping[str, SpecLike] | None, mesh: MeshSpec
) -> dict[int, Spec]:
    """The inputs ``fixed`` pins (input name → spec), by position, each checked on ``mesh``."""
    out: dict[int, Spec] = {}
    if fixed is not None and not isinstance(fixed, Mapping):
        raise ArgumentTypeError(
            f"fixed takes a dict of input name to spec, e.g. {{{graph.names[0]!r}: 'data'}}; "
            f"got {type(fixed).__name__}."
        )
    for name, raw in (fixed or {}).items():
        if not isinstance(name, str):
            raise ArgumentTypeError(
                f"fixed names inputs by their names ({', '.join(graph.names)}), not by "
                f"{type(name).__name__} {name!r}."
            )
        k = find_name(graph.names, name)  # (params['w1'], or params.w1 as --args writes it)
        if k is None:
            raise ArgumentError(
                f"fixed names {name!r}, which is not an input; the inputs are "
                f"{', '.join(graph.names)} (or written with dots, as params.w1)."
            )
        if k in out:
            raise ArgumentError(f"fixed names {graph.names[k]} twice; pin it once.")
        value = graph.values[graph.inputs[k]]
        spec = Spec.parse(raw, f"the fixed spec of {name}")
        spec.validate(mesh, value.shape, f"{name} (shape {value.shape})")
        out[k] = spec.canonical()
    return out
