"""A program's planning problem: a choice for each class of arrays and each dot, what each
choice costs, and what each pair of neighbouring choices costs to connect.

- a **class** of arrays (joined by elementwise ops) chooses a :class:`Spec`, and costs its
  elementwise ops;
- a **dot** chooses a :class:`Strategy` from the einsum enumerator, and costs its own work;
- an **edge** joins a class to a dot that reads or makes it, or two classes a map joins, and
  costs the moves between the two layouts and, for a map, the map's own work;
- an **opaque** op reads its operands whole and makes its result whole: a cost on each of
  their classes' choices.

:mod:`.pricing` fills one in, every cost read from
:class:`~shardwise._program.steps.StepCosts`, the one place each step is costed. Pure: no
devices.
"""

from __future__ import annotations

import dataclasses
import itertools
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shardwise._model.mesh import MeshSpec
from shardwise._model.spec import Spec
from shardwise._program.moves import divides

MAX_CHOICES = 4096
"""The most layouts one array or dot may choose from; past it the planner keeps this many,
spread evenly, and its report says that it stopped early."""


@dataclass(frozen=True, slots=True)
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
        held: the variables held to the layout the program's code asks for, each with the
            line that asks (:mod:`~shardwise._program.constraints`).
    """

    labels: tuple[tuple[str, int], ...]
    choices: tuple[tuple[Any, ...], ...]
    unary: tuple[np.ndarray, ...]
    edges: Mapping[tuple[int, int], np.ndarray]
    considered: int = 0
    truncated: bool = False
    held: tuple[tuple[int, str], ...] = ()

    @staticmethod
    def of(
        choices: Sequence[Sequence[Any]],
        unary: Sequence[np.ndarray],
        edges: Mapping[tuple[int, int], np.ndarray],
        labels: Sequence[tuple[str, int]] = (),
    ) -> Problem:
        """A problem from its parts (labels ``("v", k)`` where none are given)."""
        names = tuple(labels) or tuple(("v", k) for k in range(len(choices)))
        return Problem(names, tuple(tuple(c) for c in choices), tuple(unary),
                       types.MappingProxyType(dict(edges)))  # fmt: skip

    def restrict(self, keep: dict[int, list[int]]) -> Problem:
        """The same problem with variable ``v`` limited to choices ``keep[v]`` (the costs of
        the others, shared with this problem: no one changes a cost in place)."""
        choices, unary = list(self.choices), list(self.unary)
        for v, ix in keep.items():
            choices[v] = tuple(choices[v][i] for i in ix)
            unary[v] = unary[v][ix]
        edges = dict(self.edges)
        for (u, v), m in self.edges.items():
            if u in keep or v in keep:
                m = m[keep[u]] if u in keep else m
                edges[(u, v)] = m[:, keep[v]] if v in keep else m
        return dataclasses.replace(
            Problem.of(choices, unary, edges, self.labels),
            considered=self.considered,
            truncated=self.truncated,
            held=self.held,
        )


def add_edge(edges: dict[tuple[int, int], np.ndarray], u: int, v: int, matrix: np.ndarray) -> None:
    """Add ``matrix`` (rows: ``u``'s choices) to the edge between variables ``u`` and ``v``
    (two of them), kept under whichever order it already has: a new edge is ``matrix``
    itself, never written (steps alike share their matrices, :mod:`.pricing`; a copy of
    each had taken a tenth of the pricing on a mesh of four axes)."""
    if (v, u) in edges:
        edges[(v, u)] = edges[(v, u)] + matrix.T
    elif (u, v) in edges:
        edges[(u, v)] = edges[(u, v)] + matrix
    else:
        matrix.flags.writeable = False  # (shared: a write would change every edge it is)
        edges[(u, v)] = matrix


def splitting(spec: Spec, mesh: MeshSpec) -> Spec:
    """``spec`` without the mesh axes of size 1, which split nothing: the layout the planner
    offers for it (:func:`spec_choices`).

    >>> splitting(Spec.parse("x,y"), MeshSpec.parse("x=1,y=2")).describe()
    '-,y'
    """
    ones = {a for a, n in mesh.axes if n == 1}
    if not ones.intersection(spec.axes):
        return spec
    return Spec(tuple(tuple(a for a in e if a not in ones) for e in spec.entries)).canonical()


def effective_mesh(mesh: MeshSpec) -> MeshSpec:
    """The mesh without axes of size 1 (they split nothing); one axis is always kept."""
    axes = mesh.splitting or mesh.axes[:1]
    return MeshSpec(axes, mesh.axis_type)


def spec_choices(shape: Sequence[int], mesh: MeshSpec) -> tuple[int, list[Spec]]:
    """Every spec of an array of ``shape``: each mesh axis splits one dimension evenly or none
    (axes on one dimension in mesh order; an axis of size 1 none), and how many were
    considered.

    >>> [s.describe() for s in spec_choices((4, 3), MeshSpec.parse("x=2"))[1]]
    ['replicated', 'x']
    """
    out, considered = [], 0
    axes = mesh.splitting
    for pick in itertools.product([None, *range(len(shape))], repeat=len(axes)):
        considered += 1
        entries: list[list[str]] = [[] for _ in shape]
        for (axis, _), d in zip(axes, pick, strict=True):
            if d is not None:
                entries[d].append(axis)
        spec = Spec(tuple(tuple(e) for e in entries))
        if divides(shape, spec, mesh):
            out.append(spec.canonical())
    return considered, out


@dataclass(frozen=True, slots=True)
class Solution:
    """A choice per variable, its cost, and how it was found; ``priced``: where found with
    memory priced into the costs (:func:`~shardwise._program.within.priced`), that problem,
    whose runners-up are the plan's under the budget."""

    choice: tuple[int, ...]
    seconds: float
    optimal: bool
    method: str
    solve_seconds: float
    priced: Problem | None = field(default=None, compare=False, repr=False)


def total(problem: Problem, choice: Sequence[int]) -> float:
    """The cost of one choice per variable."""
    cost = sum(float(u[c]) for u, c in zip(problem.unary, choice, strict=True))
    return cost + sum(float(m[choice[u], choice[v]]) for (u, v), m in problem.edges.items())
