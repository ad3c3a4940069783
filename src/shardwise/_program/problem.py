"""A program's planning problem: a choice for each class of arrays and each dot, what each
choice costs, and what each pair of neighbouring choices costs to connect.

- a **class** of arrays (joined by elementwise ops) chooses a :class:`Spec`; its elementwise
  ops cost the bytes of the arrays XLA writes out over the memory bandwidth (it fuses chains
  of them, and into reductions: a result that only those read is never written);
- a **dot** chooses a :class:`Strategy` from the einsum enumerator, costed by the einsum cost
  model (so a one-dot program plans exactly like ``plan_einsum``);
- an **edge** joins a class to a dot that reads or makes it, or two classes a map joins; it
  costs the resharding between the two layouts (all-gather, all-to-all, a permute or a free
  slice, as :func:`~shardwise._model.reshard.reshard_collectives` predicts XLA emits them;
  :mod:`shardwise._program.moves` costs it), and for a map, the map's own collectives (an
  all-reduce of a reduction over a split dimension).

Pure: no devices.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence, Set
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shardwise._model.cost import PredictedCollective, predict, ring_seconds
from shardwise._model.mesh import MeshSpec
from shardwise._model.profile import Profile
from shardwise._model.spec import Entry, Spec
from shardwise._model.strategy import Strategy, strategies
from shardwise._program.graph import Graph
from shardwise._program.moves import Cost, entry_ways, reshard, reshard_seconds, shard_bytes
from shardwise._program.nodes import Step, Value

MAX_CHOICES = 4096
"""The most layouts one array or dot may choose from; past it the planner keeps this many,
spread evenly, and its report says that it stopped early."""


@dataclass(slots=True)
class Problem:
    """Variables (each with its choices and their costs) and edges (cost matrices).

    Attributes:
        labels: what each variable is: ``("class", root)`` or ``("dot", step index)``.
        choices: each variable's choices (specs for classes, strategies for dots).
        unary: each variable's cost per choice, in seconds.
        edges: ``(u, v) → matrix`` of seconds, ``matrix[i, j]`` for choices ``i`` of ``u`` and
            ``j`` of ``v``.
        considered: choices looked at before the divisibility filter.
        truncated: whether some variable's choices were cut to :data:`MAX_CHOICES`.
    """

    labels: list[tuple[str, int]] = field(default_factory=list)
    choices: list[list[Any]] = field(default_factory=list)
    unary: list[np.ndarray] = field(default_factory=list)
    edges: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)
    considered: int = 0
    truncated: bool = False

    def restrict(self, keep: dict[int, list[int]]) -> Problem:
        """The same problem with variable ``v`` limited to choices ``keep[v]``."""
        index = [keep.get(v, list(range(len(c)))) for v, c in enumerate(self.choices)]
        out = Problem(list(self.labels), considered=self.considered, truncated=self.truncated)
        out.choices = [[c[i] for i in ix] for c, ix in zip(self.choices, index, strict=True)]
        out.unary = [u[ix] for u, ix in zip(self.unary, index, strict=True)]
        out.edges = {(u, v): m[np.ix_(index[u], index[v])] for (u, v), m in self.edges.items()}
        return out

    def add_edge(self, u: int, v: int, matrix: np.ndarray) -> None:
        if u == v:
            self.unary[u] = self.unary[u] + np.diag(matrix)
        elif (v, u) in self.edges:
            self.edges[(v, u)] = self.edges[(v, u)] + matrix.T
        else:
            self.edges[(u, v)] = self.edges.get((u, v), 0) + matrix


def effective_mesh(mesh: MeshSpec) -> MeshSpec:
    """The mesh without axes of size 1 (they split nothing); one axis is always kept."""
    axes = tuple((a, n) for a, n in mesh.axes if n > 1) or mesh.axes[:1]
    return MeshSpec(axes, mesh.axis_type)


def spec_choices(shape: Sequence[int], mesh: MeshSpec) -> tuple[int, list[Spec]]:
    """Every spec of an array of ``shape``: each mesh axis splits one dimension evenly or none
    (axes on one dimension in mesh order), and how many were considered.

    >>> [s.describe() for s in spec_choices((4, 3), MeshSpec.parse("x=2"))[1]]
    ['replicated', 'x']
    """
    out, considered = [], 0
    for pick in itertools.product([None, *range(len(shape))], repeat=len(mesh.axes)):
        considered += 1
        entries: list[list[str]] = [[] for _ in shape]
        for (axis, _), d in zip(mesh.axes, pick, strict=True):
            if d is not None:
                entries[d].append(axis)
        if all(n % entry_ways(e, mesh) == 0 for n, e in zip(shape, entries, strict=True)):
            out.append(Spec(tuple(tuple(e) for e in entries)).canonical())
    return considered, out


def map_specs(graph: Graph, step: Step, src: Spec, mesh: MeshSpec) -> tuple[Spec, Spec, Entry]:
    """A map from its operand's layout ``src``: the layout it reads (``src`` without the axes of
    the dimensions it needs whole), the layout of its result, and the mesh axes its partial
    sums are all-reduced over (those of split reduced dimensions)."""
    value, out = graph.values[step.inputs[0]], graph.values[step.output]
    entries = [list(e) for e in src.padded(len(value.shape))]
    carried: list[Entry] = []
    for o, d in enumerate(step.dim_map):
        entry = tuple(entries[d]) if d is not None else ()
        if entry and out.shape[o] % entry_ways(entry, mesh):
            entry = ()
        carried.append(entry)
    kept = {a for e in carried for a in e} | {a for d in step.reduced for a in entries[d]}
    whole = Spec(tuple(tuple(a for a in e if a in kept) for e in entries)).canonical()
    partial = tuple(a for a in mesh.names if any(a in entries[d] for d in step.reduced))
    return whole, Spec(tuple(carried)).canonical(), partial


def map_cost(
    graph: Graph, step: Step, src: Spec, dst: Spec, mesh: MeshSpec, profile: Profile
) -> Cost:
    """A map from its operand's layout ``src`` to its result's ``dst``: whole the dimensions it
    needs whole, all-reduce the partial sums of a reduction over split dimensions, carry the
    rest over, and reshard the result to ``dst``."""
    made = made_by_ops(graph)
    head, mapped = _map_head(graph, step, src, mesh, profile, made)
    after = reshard(graph.values[step.output], mapped, dst, mesh, profile, step, step.repeat,
                    a2a_copies(step.output, made, into_op=False))  # fmt: skip
    return Cost(head.seconds + after.seconds, (*head.collectives, *after.collectives))


def _map_head(
    graph: Graph, step: Step, src: Spec, mesh: MeshSpec, profile: Profile, made: Set[int]
) -> tuple[Cost, Spec]:
    """A map's cost up to its result in the layout it makes it in, and that layout
    (``made``: :func:`made_by_ops`)."""
    value, out = graph.values[step.inputs[0]], graph.values[step.output]
    whole, mapped, partial = map_specs(graph, step, src, mesh)
    copies = a2a_copies(step.inputs[0], made, into_op=False)
    gather = reshard(value, src, whole, mesh, profile, step, step.repeat, copies)
    sums: list[tuple[PredictedCollective, Step]] = []
    if partial:
        # one all-reduce per split reduced dimension, over its axes (as XLA sums a reduction
        # over two dimensions split on two axes: over one axis, then the other)
        n = shard_bytes(out, mapped, mesh)
        entries = src.padded(len(value.shape))
        for d in step.reduced:
            axes = tuple(a for a in mesh.names if a in entries[d] and a in partial)
            if axes:
                seconds = ring_seconds("all-reduce", axes, n, mesh, profile)
                sums.append((PredictedCollective("all-reduce", axes, n, seconds), step))
    # it reads its operand and writes its result, but an implicit broadcast is carried out
    # inside the elementwise op that reads it, and writes nothing of its own
    moved = shard_bytes(value, whole, mesh)
    if not step.implicit:
        moved += shard_bytes(out, mapped, mesh)
    # the gather's cost already counts its repeats (and its copies); the sums are per run
    comm = gather.seconds + sum(c.seconds for c, _ in sums) * step.repeat
    parts = (*gather.collectives, *sums)
    return Cost(comm + step.repeat * moved / profile.memory_Bps, parts), mapped


def _map_matrix(
    graph: Graph,
    step: Step,
    sa: list[Spec],
    sb: list[Spec],
    mesh: MeshSpec,
    profile: Profile,
    seen: dict[tuple[Any, ...], np.ndarray],
    made: Set[int],
) -> np.ndarray:
    """:func:`map_cost` for every pair of layouts, the part before the result's resharding
    computed once per operand layout, the resharding once per layout the map makes; once for
    all maps alike (``seen``: 126 maps of a 2-layer transformer's training step are 44)."""
    value, out = graph.values[step.inputs[0]], graph.values[step.output]
    shapes = (value.shape, value.dtype, out.shape, out.dtype)
    copies = (a2a_copies(step.inputs[0], made, False), a2a_copies(step.output, made, False))
    key = (shapes, step.dim_map, step.local, step.reduced, step.repeat, step.implicit,
           tuple(sa), tuple(sb), copies)  # fmt: skip
    if key in seen:
        return seen[key]
    after: dict[Spec, np.ndarray] = {}
    rows = []
    for s in sa:
        head, mapped = _map_head(graph, step, s, mesh, profile, made)
        if mapped not in after:
            after[mapped] = np.array(
                [reshard_seconds(out, mapped, t, mesh, profile, step.repeat, copies[1]) for t in sb]
            )
        rows.append(head.seconds + after[mapped])
    seen[key] = np.array(rows)
    return seen[key]


def dot_cost(
    graph: Graph, step: Step, strategy: Strategy, mesh: MeshSpec, profile: Profile
) -> Cost:
    """A dot's own cost under ``strategy``: the einsum cost model's prediction."""
    assert step.op is not None
    shapes = [graph.values[a].shape for a in step.inputs]
    p = predict(step.op, shapes, graph.values[step.output].dtype, mesh, strategy, profile)
    return Cost(
        p.seconds * step.repeat, tuple((c, step) for c in p.collectives), p.flops * step.repeat
    )


def build_problem(
    graph: Graph, mesh: MeshSpec, profile: Profile, pinned: dict[int, Spec] | None = None
) -> Problem:
    """The planning problem of ``graph`` on ``mesh``; ``pinned`` fixes some classes' specs."""
    pinned = pinned or {}
    problem = Problem()
    roots = sorted(set(graph.classes))
    var_of: dict[int, int] = {}
    counts: dict[int, int] = {}
    maps: dict[tuple[Any, ...], np.ndarray] = {}
    written = _written(graph)
    made = made_by_ops(graph)
    for v, n in graph.elementwise.items():
        if v in written:
            counts[graph.find(v)] = counts.get(graph.find(v), 0) + n
    for root in roots:
        considered, specs = spec_choices(graph.values[root].shape, mesh)
        problem.considered += considered
        if root in pinned:
            specs = [pinned[root]]
        specs = _spread(specs, problem)
        var_of[root] = len(problem.labels)
        problem.labels.append(("class", root))
        problem.choices.append(specs)
        unit = 2.0 * counts.get(root, 0) / profile.memory_Bps  # each one read and written once
        problem.unary.append(
            np.array([unit * shard_bytes(graph.values[root], s, mesh) for s in specs])
        )
    for k, step in enumerate(graph.steps):
        if step.kind == "dot":
            _add_dot(graph, problem, var_of, k, step, mesh, profile, made)
        elif step.kind == "map":
            a, b = var_of[graph.find(step.inputs[0])], var_of[graph.find(step.output)]
            matrix = _map_matrix(
                graph, step, problem.choices[a], problem.choices[b], mesh, profile, maps, made
            )
            problem.add_edge(a, b, matrix)
        else:
            for a in step.inputs:
                u = var_of[graph.find(a)]
                problem.unary[u] = problem.unary[u] + np.array(
                    [
                        reshard(
                            graph.values[a],
                            s,
                            Spec(),
                            mesh,
                            profile,
                            step,
                            step.repeat,
                            a2a_copies(a, made, into_op=True),
                        ).seconds
                        for s in problem.choices[u]
                    ]
                )
    return problem


def a2a_copies(a: int, made: Set[int], into_op: bool) -> int:
    """How many copies of its block an all-to-all that moves array ``a`` costs on a CPU
    (:data:`~shardwise._program.moves.COPY_BYTES`): one where ``a`` is in ``made`` (from
    :func:`made_by_ops`: an elementwise op or a map that makes an array cuts it up itself),
    and one more where a dot or an opaque op reads it (``into_op``; an elementwise op reads
    the pieces as they are)."""
    return int(a in made) + int(into_op)


def made_by_ops(graph: Graph) -> frozenset[int]:
    """The arrays XLA cannot fuse a copy into the making of: the program's arguments and the
    results of its dots and opaque ops."""
    return frozenset(graph.inputs) | {s.output for s in graph.steps if s.kind != "map"}


def _written(graph: Graph) -> set[int]:
    """The arrays XLA writes out: those a step reads, those a scan's loop takes in or
    carries, and the program's results. An elementwise result that only elementwise ops, an
    implicit broadcast or a reduction read is fused into them (``(tanh(x @ w) * 2).sum(-1)``
    compiles to one multiply-reduce fusion on CPU): it costs no memory traffic of its own."""
    kept = [s for s in graph.steps if not s.implicit and not (s.kind == "map" and s.reduced)]
    read = {a for s in kept for a in s.inputs}
    return read | graph.looped | {v for v in graph.outputs if v is not None}


def _reshard_matrix(
    value: Value,
    srcs: list[Spec],
    dsts: list[Spec],
    mesh: MeshSpec,
    profile: Profile,
    step: Step,
    copies: int,
) -> np.ndarray:
    """Seconds to reshard ``value`` from each of ``srcs`` to each of ``dsts`` (each distinct
    pair costed once; ``copies``: :func:`a2a_copies`)."""
    rows = {spec: k for k, spec in enumerate(dict.fromkeys(srcs))}
    cols = {spec: k for k, spec in enumerate(dict.fromkeys(dsts))}
    table = np.array(
        [
            [reshard_seconds(value, x, y, mesh, profile, step.repeat, copies) for y in cols]
            for x in rows
        ]
    )
    return table[np.ix_([rows[x] for x in srcs], [cols[y] for y in dsts])]


def _spread(items: list[Spec], problem: Problem) -> list[Spec]:
    if len(items) <= MAX_CHOICES:
        return items
    problem.truncated = True
    return [items[k * len(items) // MAX_CHOICES] for k in range(MAX_CHOICES)]


def _add_dot(
    graph: Graph,
    problem: Problem,
    var_of: dict[int, int],
    k: int,
    step: Step,
    mesh: MeshSpec,
    profile: Profile,
    made: Set[int],
) -> None:
    assert step.op is not None
    sizes = step.op.sizes([graph.values[a].shape for a in step.inputs])
    considered, found = strategies(step.op, sizes, mesh, MAX_CHOICES)
    problem.considered += considered
    d = len(problem.labels)
    problem.labels.append(("dot", k))
    problem.choices.append(found)
    problem.unary.append(np.array([dot_cost(graph, step, s, mesh, profile).seconds for s in found]))
    for slot, a in enumerate(step.inputs):
        u = var_of[graph.find(a)]
        wanted = [t.in_specs(step.op)[slot] for t in found]
        copies = a2a_copies(a, made, into_op=True)
        matrix = _reshard_matrix(
            graph.values[a], problem.choices[u], wanted, mesh, profile, step, copies
        )
        problem.add_edge(u, d, matrix)
    out = var_of[graph.find(step.output)]
    made_specs = [t.out_spec for t in found]
    copies = a2a_copies(step.output, made, into_op=False)
    matrix = _reshard_matrix(
        graph.values[step.output], made_specs, problem.choices[out], mesh, profile, step, copies
    )
    problem.add_edge(d, out, matrix)
