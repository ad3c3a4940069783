"""Plans that logical axis rules can write: with ``respect="names"``, every plan lays out the
model's annotated parameters, and the activations its code constrains by logical names, so
that one rule per logical name gives them all their layouts,
under Flax Linen's resolution and NNX's alike (NNX keeps no fallback rules).

Two things make it so, both on the planning problem, before any search:

- a dimension the annotations leave unnamed is never split (rules cannot reach it): each
  annotated input's choices keep only those layouts;
- every dimension of one name has the same mesh axes in every array: the annotated inputs
  that share a name are joined in a chain, each link an edge whose cost is nothing where the
  two layouts agree on every name they share and :data:`DISAGREE` where they do not. A
  chain is enough (agreement carries along it), and the search never pays that cost while
  an agreeing plan exists: laying everything out whole always agrees.

The costs the plans are ranked and reported by are the step costs; this edge cost only steers.
"""

from __future__ import annotations

import dataclasses
import types

import numpy as np

from shardwise._model.spec import Spec
from shardwise._program.annotations import Annotations
from shardwise._program.graph import Graph
from shardwise._program.pins import input_vars
from shardwise._program.problem import Problem, Solution, add_edge

Names = tuple[str | None, ...]
"""Each dimension's logical name (``None``: unnamed)."""

DISAGREE = 1e6
"""Seconds charged where two arrays lay out one logical name differently: past any plan's
cost, so the search takes it only where nothing agrees (never: whole always does)."""


def writable(graph: Graph, problem: Problem, annotations: Annotations) -> Problem:
    """``problem`` restricted to plans that rules over the annotations' logical names write."""
    variables = input_vars(graph, problem)
    named: dict[int, Names] = {}  # variable → its names
    for k, a in annotations.by_input.items():
        if a.logical and a.names:
            named.setdefault(variables[k], a.dims)
    # the activations the code names (nn.with_logical_constraint): rules lay them out too
    var_of = {label[1]: k for k, label in enumerate(problem.labels) if label[0] == "class"}
    for value, names, _ in annotations.activations:
        var = var_of.get(graph.find(value))
        if var is not None and any(n is not None for n in names):
            named.setdefault(var, tuple(names))
    keep = {
        v: [i for i, spec in enumerate(problem.choices[v]) if _unnamed_whole(spec, names)]
        for v, names in named.items()
    }
    narrowed = problem.restrict(keep)
    edges = dict(narrowed.edges)
    last: dict[str, int] = {}
    for v, names in named.items():
        for n in dict.fromkeys(n for n in names if n is not None):
            if n in last and last[n] != v:
                u = last[n]
                add_edge(edges, u, v, _disagreement(narrowed, u, named[u], v, names))
            last[n] = v
    return dataclasses.replace(narrowed, edges=types.MappingProxyType(edges))


def agrees(solution: Solution) -> bool:
    """Whether ``solution`` of a :func:`writable` problem pays no :data:`DISAGREE`."""
    return solution.seconds < DISAGREE


def _unnamed_whole(spec: Spec, names: Names) -> bool:
    return all(n is not None or not e for n, e in zip(names, spec.padded(len(names)), strict=True))


def _disagreement(problem: Problem, u: int, u_names: Names, v: int, v_names: Names) -> np.ndarray:
    """``DISAGREE`` where choice ``i`` of ``u`` and ``j`` of ``v`` lay a shared name out apart."""
    shared = [n for n in dict.fromkeys(u_names) if n is not None and n in v_names]

    def axes(spec: Spec, names: Names) -> tuple[tuple[str, ...], ...]:
        entries = spec.padded(len(names))
        return tuple(entries[names.index(n)] for n in shared)

    left = [axes(s, u_names) for s in problem.choices[u]]
    right = [axes(s, v_names) for s in problem.choices[v]]
    return np.array([[0.0 if a == b else DISAGREE for b in right] for a in left])
