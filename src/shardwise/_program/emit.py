"""A plan in the words of the stack that runs it: the ``NamedSharding`` of every input by
argument, rules by pytree path (EasyDeL's regexes), and the texts ``shardwise plan --emit``
prints (Flax's logical axis rules, a MaxText config block, path rules, each input's spec).

A leaf's path is written as its argument's name, then each key of its pytree path joined
with ``/``: dict keys and attribute names as they are, sequence positions as numbers
(``params/Dense_0/kernel``, ``opt_state/0/mu/w``); the ``value`` attribute a Flax box or an
NNX variable holds its array in is left out, so a boxed tree and its unboxed twin
(``nn.unbox``, ``nnx.State``'s arrays) have the same paths.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import jax
from jax.sharding import NamedSharding, PartitionSpec

from shardwise._errors import ArgumentError
from shardwise._model.patterns import path_rules
from shardwise._model.spec import Spec
from shardwise._program.arguments import parameter_names
from shardwise._program.graph import Graph
from shardwise._program.verify import mesh_for
from shardwise._xla.meshes import auto_twin

if TYPE_CHECKING:
    from shardwise._program.plans import PlannedLayout, ProgramPlan

EMITS = ("flax", "maxtext", "regex", "specs")
"""The forms ``shardwise plan --emit`` prints a plan in."""


def _key(key: Any) -> str:
    """One key of a pytree path, as a path component."""
    for attr in ("key", "idx", "name"):  # DictKey / FlattenedIndexKey, SequenceKey, GetAttrKey
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def arguments(graph: Graph) -> list[tuple[str, list[str]]]:
    """Each argument's name (as the function's signature names it) and the paths of its
    leaves, in the order of the program's inputs."""
    args = jax.tree.unflatten(graph.tree, list(range(graph.tree.num_leaves)))
    names = parameter_names(graph.names, graph.tree, graph.parameters)
    out = []
    for name, arg in zip(names, args, strict=True):
        paths = []
        for path, _ in jax.tree_util.tree_flatten_with_path(arg)[0]:
            parts = [_key(k) for k in path]
            if path and isinstance(path[-1], jax.tree_util.GetAttrKey) and parts[-1] == "value":
                parts.pop()  # a Flax box's or an NNX variable's array
            paths.append("/".join([name, *parts]))
        out.append((name, paths))
    return out


def plain(tree: Any) -> Any:
    """``tree`` in JSON's containers: a mapping as a dict, a named tuple (an optax state) or
    another node whose children are named (a dataclass, an Equinox module) as a dict by
    those names, a sequence as a list, a pytree node of one child (a Flax box, an NNX
    variable) as that child, another as a list.

    >>> import optax
    >>> plain((optax.ScaleByAdamState(count=1, mu={"w": 2}, nu={"w": 3}), "x"))
    [{'count': 1, 'mu': {'w': 2}, 'nu': {'w': 3}}, 'x']
    """
    if isinstance(tree, Mapping):
        return {str(k): plain(v) for k, v in tree.items()}
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        return {str(f): plain(getattr(tree, f)) for f in tree._fields}
    if isinstance(tree, list | tuple):
        return [plain(v) for v in tree]
    if tree is None:
        return None
    keyed = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda node: node is not tree)[0]
    children = [child for _, child in keyed]
    if len(children) == 1 and children[0] is tree:  # (a leaf; ==: an NNX variable's value)
        return tree
    if len(children) == 1:
        return plain(children[0])
    names = [getattr(path[0], "name", None) if len(path) == 1 else None for path, _ in keyed]
    if all(isinstance(n, str) for n in names) and len(set(names)) == len(names):
        return {n: plain(c) for n, c in zip(names, children, strict=True)}
    return [plain(c) for c in children]


def leaf_paths(graph: Graph) -> list[str]:
    """Every input leaf's path, in the order of the program's inputs."""
    return [path for _, paths in arguments(graph) for path in paths]


def shardings(plan: ProgramPlan, chosen: PlannedLayout, mesh: Any = None) -> dict[str, Any]:
    """``{argument name: its pytree of NamedShardings}`` for ``chosen`` on ``mesh``: on its
    Auto twin where it has Explicit axes, as the plan runs (under ``jax.jit`` with Explicit
    shardings, JAX asks the code to name the layout of a dot whose contracted dimension is
    split, and code that does not fails)."""
    m = auto_twin(mesh_for(plan, mesh))
    leaves = [NamedSharding(m, s.to_partition_spec()) for s in chosen.in_specs]
    trees = jax.tree.unflatten(plan.graph.tree, leaves)
    return {name: tree for (name, _), tree in zip(arguments(plan.graph), trees, strict=True)}


def regex_rules(chosen: PlannedLayout, graph: Graph) -> tuple[tuple[str, PartitionSpec], ...]:
    """``(regex, PartitionSpec)`` rules that give every input of ``chosen`` its layout."""
    rules = path_rules(leaf_paths(graph), chosen.in_specs)
    return tuple((regex, spec.to_partition_spec()) for regex, spec in rules)


def _p(spec: PartitionSpec | Spec) -> str:
    """``P(None, 'model')``, as Python reads it back (``from jax.sharding import
    PartitionSpec as P``)."""
    entries = spec.to_partition_spec() if isinstance(spec, Spec) else spec
    return f"P({', '.join(repr(e) for e in entries)})"


def _string(text: str) -> str:
    """``text`` as a Python literal: raw where that reads it back alike (a regex's ``\\d``)."""
    return f"r'{text}'" if "'" not in text and not text.endswith("\\") else repr(text)


def emitted(plan: ProgramPlan, form: str, name: str | None = None) -> str:
    """Plan ``name`` (default: the chosen one) as the text ``--emit form`` prints."""
    if form not in EMITS:
        raise ArgumentError(f"cannot emit a plan as {form!r}; the forms are {', '.join(EMITS)}.")
    chosen = plan.get(name) if name is not None else plan.chosen
    head = f"# plan {chosen.name!r} of {plan.program} on {plan.mesh.describe()}"
    if form == "specs":
        specs = zip(plan.graph.names, chosen.in_specs, strict=True)
        return "\n".join([head, *(f"{n}: {_p(s)}" for n, s in specs)]) + "\n"
    if form == "regex":
        lines = [f"{head}: the first regex found in a leaf's path gives its layout",
                 "# (paths: argument/key/key, e.g. params/Dense_0/kernel)",
                 "# from jax.sharding import PartitionSpec as P", "("]  # fmt: skip
        lines += [f"    ({_string(r)}, {_p(s)})," for r, s in regex_rules(chosen, plan.graph)]
        return "\n".join([*lines, ")"]) + "\n"
    made = plan.logical_rules(chosen.name)
    if not made.arrays:
        raise ArgumentError(
            f"the arguments of {plan.program} carry no logical names (Flax's "
            "nn.with_logical_partitioning, nnx.with_partitioning), so there are no logical "
            "rules to write; write the plan as rules by path: ProgramPlan.to_regex().",
            shell=f"the arguments of {plan.program} carry no logical names, so there are no "
            "logical rules to write; give --emit regex for rules by path (or --emit specs).",
        )
    notes = [f"# conflict: {c.describe()}" for c in made.conflicts]
    if form == "maxtext":
        return made.to_maxtext(plan.mesh)
    lines = [f"{head}: Flax's logical axis rules, for nn.logical_axis_rules(...)", "("]
    lines += [f"    ({n!r}, {a!r})," for n, a in made.to_flax()]
    return "\n".join([*lines, ")", *notes]) + "\n"
