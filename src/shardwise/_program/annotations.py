"""What a model already says about its layout, read from the arguments it is planned with:
the logical axis names Flax annotates parameters with (Linen's ``nn.with_logical_partitioning``
boxes, NNX variables made with ``nnx.with_partitioning``), the mesh axes of Linen's
``nn.with_partitioning`` boxes, and the shardings that concrete arrays already carry; and,
from the code, the logical names of its ``nn.with_logical_constraint`` calls, recorded while
the program is traced. :func:`named_arrays` pairs each with its layout in a plan, for the
rules that hand the plan back (:mod:`~shardwise._model.logical`).

The names are read by their pytree path, so the same leaf the plan lays out is the one
annotated. Resolving logical names to mesh axes needs rules: those given to ``plan``, else
those in force where ``plan`` is called (``nn.logical_axis_rules``), else a box's own.
Flax is never imported here: a box is recognised only when its module is already loaded.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
from jax._src import source_info_util
from jax.sharding import NamedSharding, PartitionSpec

from shardwise._errors import SpecError
from shardwise._model.logical import Named, Rule, Style, check_rules, resolve
from shardwise._model.mesh import MeshSpec
from shardwise._model.spec import Spec
from shardwise._program.graph import Graph
from shardwise._program.walk import user_line


@dataclass(frozen=True, slots=True)
class Annotation:
    """What one input leaf says about its layout.

    Attributes:
        names: each dimension's name: logical names (``logical``) or mesh axes; ``None`` where
            the annotation leaves the dimension unnamed; empty where only ``carried`` is known.
        logical: whether ``names`` are logical names that need rules (Linen's
            ``LogicallyPartitioned``, an NNX variable's ``out_sharding``) rather than mesh axes
            (Linen's ``Partitioned``).
        style: how the names resolve (Linen's rules or NNX's).
        rules: the box's own rules (Linen's ``rules=``, NNX's ``sharding_rules``).
        carried: the layout a concrete array already has (a ``NamedSharding``'s spec).
        source: what it was read from, for reports.
    """

    names: tuple[Any, ...] = ()
    logical: bool = False
    style: Style = "linen"
    rules: tuple[Rule, ...] = ()
    carried: Spec | None = None
    source: str = ""

    @property
    def dims(self) -> tuple[str | None, ...]:
        """Each dimension's name, ``None`` where it has none (an unnamed or open entry)."""
        return tuple(n if isinstance(n, str) else None for n in self.names)


@dataclass(frozen=True, slots=True)
class Annotations:
    """The annotations of a program's inputs (by position) and the rules in force."""

    by_input: Mapping[int, Annotation]
    rules: tuple[Rule, ...] | None
    activations: tuple[tuple[int, tuple[str | None, ...], str], ...] = ()
    """Arrays inside the program under Flax's logical constraints: (array, names, line)."""

    def __bool__(self) -> bool:
        return bool(self.by_input)

    def specs(self, mesh: MeshSpec) -> tuple[dict[int, Spec], list[str]]:
        """The layout the annotations give each input they cover, on ``mesh``; and why the
        others have none (logical names with no rules; axes the mesh lacks)."""
        out: dict[int, Spec] = {}
        why: list[str] = []
        for k, a in self.by_input.items():
            spec, reason = _spec(a, self.rules, mesh)
            if spec is not None:
                out[k] = spec
            elif reason and reason not in why:
                why.append(reason)
        return out, why


def _spec(a: Annotation, rules: tuple[Rule, ...] | None, mesh: MeshSpec) -> tuple[Spec | None, str]:
    if a.names and a.logical:
        given = rules if rules is not None else (a.rules or None)
        if given is None:
            return (
                a.carried,
                "logical names with no rules (pass rules= to plan, --rules from the command line)",
            )
        entries = resolve(a.dims, given, a.style)
        spec: Spec | None = Spec(entries).canonical()
    elif a.names:
        spec = Spec.parse(PartitionSpec(*a.names)).canonical()
    else:
        spec = a.carried
    if spec is not None and not set(spec.axes).issubset(mesh.names):
        return None, f"mesh axes {sorted(set(spec.axes) - set(mesh.names))} not in the mesh"
    return spec, ""


def rules_in_force(rules: Any) -> tuple[Rule, ...] | None:
    """``rules`` checked; by default, those Flax's ``logical_axis_rules`` context holds."""
    if rules is not None:
        return check_rules(rules)
    spmd = sys.modules.get("flax.core.spmd")
    context = spmd.get_logical_axis_rules() if spmd is not None else None
    return check_rules(context, "Flax's logical_axis_rules") if context else None


def _box(x: Any) -> Annotation | None:
    """The annotation of a Flax box or variable, if ``x`` is one."""
    meta = sys.modules.get("flax.core.meta")
    if meta is not None and isinstance(x, meta.Partitioned):
        logical = type(x).__name__ == "LogicallyPartitioned"
        own = getattr(x, "rules", None)
        return Annotation(
            names=tuple(x.names), logical=logical, rules=check_rules(own) if own else (),
            source=type(x).__name__,
        )  # fmt: skip
    variablelib = sys.modules.get("flax.nnx.variablelib")
    if variablelib is not None and isinstance(x, variablelib.Variable):
        metadata = x.get_metadata()
        # an optimizer's state is laid out by the optimizer sharding its variable names
        # (Flax's ``optimizer_sharding``/``opt_sharding``, kept apart from the parameter's)
        opt = ("optimizer_sharding", "opt_sharding") if _is_opt_state(x) else ()
        keys = (*opt, "out_sharding", "sharding_names", "sharding")
        names = next((metadata[k] for k in keys if metadata.get(k)), None)
        if names is None:
            return Annotation(source=type(x).__name__)
        own = metadata.get("sharding_rules") or ()
        return Annotation(
            names=tuple(names), logical=True, style="nnx", rules=check_rules(own),
            source=f"nnx.{type(x).__name__}",
        )  # fmt: skip
    return None


def _is_opt_state(x: Any) -> bool:
    optimizer = sys.modules.get("flax.nnx.training.optimizer")
    return optimizer is not None and isinstance(x, optimizer.OptState)


def _is_box(x: Any) -> bool:
    return _box(x) is not None


def _carried(leaf: Any) -> Spec | None:
    sharding = getattr(leaf, "sharding", None)
    if isinstance(leaf, jax.Array) and isinstance(sharding, NamedSharding):
        return Spec.parse(sharding.spec).canonical()
    return None


def read_annotations(args: Sequence[Any], rules: Any = None) -> Annotations:
    """The annotations of each leaf of ``args`` (by its position among the leaves). In an
    argument where some leaves carry logical names, a leaf with none is laid out whole, as
    Flax lays it out (``nn.get_partition_spec`` gives it ``P()``).

    >>> import jax.numpy as jnp
    >>> read_annotations((jnp.ones(3), {"w": jnp.ones(2)})).by_input
    {}
    """
    out: dict[int, Annotation] = {}
    k = 0
    for arg in args:
        found: list[tuple[Annotation | None, Any]] = []
        for node in jax.tree.leaves(arg, is_leaf=_is_box):
            box = _box(node)
            leaves = jax.tree.leaves(node) if box is not None else [node]
            found += [(box, leaf) for leaf in leaves]
        logical = next((b for b, _ in found if b is not None and b.logical and b.names), None)
        for box, leaf in found:
            carried = _carried(leaf)
            rank = len(getattr(leaf, "shape", ()))
            if box is not None and box.names and len(box.names) == rank:
                out[k] = dataclasses.replace(box, carried=carried)
            elif logical is not None:
                out[k] = Annotation((None,) * rank, True, logical.style, logical.rules, carried,
                                    "not annotated")  # fmt: skip
            elif carried is not None:
                out[k] = Annotation(carried=carried, source="the array's sharding")
            k += 1
    return Annotations(by_input=out, rules=rules_in_force(rules))


def annotated_pins(
    annotations: Annotations, graph: Graph, mesh: MeshSpec, fixed: Mapping[int, Spec]
) -> dict[int, Spec] | str:
    """The inputs laid out as the annotations say (``fixed`` wins where both speak), or why
    they give no plan on ``mesh``."""
    if not annotations:
        return (
            "the arguments carry no annotations (Flax's partitioning boxes, NNX variables' "
            "out_sharding, or arrays' NamedShardings)"
        )
    specs, why = annotations.specs(mesh)
    if not specs:
        return f"no annotation gives a layout on {mesh.describe()}: {'; '.join(why)}"
    lacking = [graph.names[k] for k in annotations.by_input if k not in specs]
    if any("not in the mesh" in w for w in why):  # (dropped, those inputs would be free)
        return (
            f"the annotations of {', '.join(lacking[:3])}{' …' if len(lacking) > 3 else ''} "
            f"name {'; '.join(w for w in why if 'not in the mesh' in w)}: give rules (or "
            f"annotations) in the axes of {mesh.describe()}"
        )
    for k, spec in specs.items():
        value = graph.values[graph.inputs[k]]
        try:
            spec.validate(mesh, value.shape, f"{graph.names[k]} (shape {value.shape})")
        except SpecError as e:
            return f"the annotations' layout does not fit: {e}"
    return {**specs, **fixed}


def named_arrays(
    annotations: Annotations, graph: Graph, in_specs: Sequence[Spec], specs: Mapping[int, Spec]
) -> list[Named]:
    """The inputs annotated with logical names, each with its layout in ``in_specs`` (one per
    input), and the arrays under logical constraints, each with its layout in ``specs`` (by
    array)."""
    out = []
    for k, a in annotations.by_input.items():
        if a.logical and a.names:
            rank = len(graph.values[graph.inputs[k]].shape)
            out.append(Named(graph.names[k], a.dims, in_specs[k].padded(rank), a.style))
    seen = set()
    for value, names, line in annotations.activations:
        spec = specs.get(value, specs.get(graph.classes[value]))
        if spec is None or (value, names) in seen:
            continue
        seen.add((value, names))
        rank = len(graph.values[value].shape)
        out.append(Named(f"{graph.values[value].name} ({line})", names, spec.padded(rank)))
    return out


def with_activations(annotations: Annotations, graph: Graph, calls: Sequence[Call]) -> Annotations:
    """``annotations`` with the arrays Flax's logical constraints ask layouts of (the
    constraints of ``graph``, each matched to the call ``calls`` recorded at its line: the
    one call there, else the calls there in order)."""
    at: dict[str, list[tuple[str | None, ...]]] = {}
    for line, names in calls:
        at.setdefault(line, []).append(names)
    found = []
    taken: dict[str, int] = {}
    for asked in graph.placed:
        there = at.get(asked.source, [])
        if len(set(there)) > 1:  # several calls at one line: by their order
            k = taken[asked.source] = taken.get(asked.source, -1) + 1
            there = there[k : k + 1]
        if there and len(there[0]) == len(graph.values[asked.value].shape):
            found.append((asked.value, there[0], asked.source))
    return dataclasses.replace(annotations, activations=tuple(found))


NO_ANNOTATIONS = Annotations({}, None)
"""A program whose arguments say nothing about their layout."""


def first_reader(graph: Graph, k: int) -> str:
    """The op that first reads input ``k`` through a dot (else any op), as the report names
    it (``dot_general at model.py:13``): the one whose cost decided its layout most often."""
    root = graph.classes[graph.inputs[k]]
    readers = [s for s in graph.steps if any(graph.classes[a] == root for a in s.inputs)]
    dots = [s for s in readers if s.kind == "dot" and not s.backward]
    if not readers:
        return ""
    step = (dots or readers)[0]
    where = f" at {step.source}" if step.source else ""
    return f"{step.prim}{where}" + (f" ({step.module})" if step.module else "")


Call = tuple[str, tuple[str | None, ...]]
"""A call of Flax's ``nn.with_logical_constraint``: the user's ``file:line`` and the names."""


@contextlib.contextmanager
def logical_constraints_recorded(
    into: list[Call], rules: tuple[Rule, ...] | None = None
) -> Iterator[None]:
    """Within: each call of Flax's ``nn.with_logical_constraint`` on one array is recorded in
    ``into`` (the logical names it gives, at the user's line), then made as Flax makes it,
    under ``rules`` where given (``plan``'s ``rules=``: the rules the code's names resolve by,
    as under Flax's ``logical_axis_rules``; without them every constraint had been dropped).
    Flax resolves the names while tracing, so the traced program keeps only mesh axes: the
    names are what hands the plan's layouts of activations back as rules."""
    spmd = sys.modules.get("flax.linen.spmd")
    if spmd is None:
        yield
        return
    core = sys.modules.get("flax.core.spmd")
    if rules is not None and core is not None:
        with core.logical_axis_rules(rules), logical_constraints_recorded(into):
            yield
        return
    original = spmd.with_logical_constraint

    def recording(x: Any, logical_axis_resources: Any, *args: Any, **kwargs: Any) -> Any:
        names = logical_axis_resources
        line = user_line(source_info_util.current().traceback)
        one = isinstance(names, tuple | list | PartitionSpec) and all(
            n is None or isinstance(n, str) for n in names
        )
        if line and one:
            into.append((line, tuple(names)))
        return original(x, logical_axis_resources, *args, **kwargs)

    homes = [
        sys.modules.get(m) for m in ("flax.linen.spmd", "flax.linen", "flax.linen.partitioning")
    ]
    patched = [m for m in homes if getattr(m, "with_logical_constraint", None) is original]
    for m in patched:
        m.with_logical_constraint = recording  # type: ignore[union-attr]
    try:
        yield
    finally:
        for m in patched:
            m.with_logical_constraint = original  # type: ignore[union-attr]


def avoided(theirs: Sequence[Any], ours: Sequence[Any]) -> list[dict[str, Any]]:
    """The collectives in ``theirs`` beyond those in ``ours`` (matched by kind, axes and
    source line), grouped: kind, axes, source, count and bytes."""
    left = Counter((c.kind, tuple(c.mesh_axes), c.source) for c in ours)
    extra: dict[tuple[str, tuple[str, ...], str], list[int]] = {}
    for c in theirs:
        key = (c.kind, tuple(c.mesh_axes), c.source)
        if left[key] > 0:
            left[key] -= 1
        else:
            extra.setdefault(key, []).append(int(c.bytes))
    return [
        {"kind": kind, "axes": list(axes), "source": source, "count": len(b), "bytes": sum(b)}
        for (kind, axes, source), b in extra.items()
    ]
