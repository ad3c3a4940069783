"""Pricing a program: its :class:`~shardwise._program.problem.Problem` filled in, step by step,
from :class:`~shardwise._program.steps.StepCosts`: each class's elementwise work for each of
its layouts, each dot's strategies and their own work, and the moves between every two
layouts that each edge joins (:mod:`.moves`' grids); once for all steps alike.

Pure: no devices.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from shardwise._errors import ArgumentError
from shardwise._model.mesh import MeshSpec
from shardwise._model.profile import Profile
from shardwise._model.spec import Spec
from shardwise._program import stages
from shardwise._program.beside import Beside
from shardwise._program.graph import Graph
from shardwise._program.moves import grids_kept, reshard_grid
from shardwise._program.nodes import Step
from shardwise._program.problem import MAX_CHOICES, Problem, add_edge, spec_choices
from shardwise._program.steps import StepCosts, a2a_copies, broadcast_read, dot_strategies

_T = TypeVar("_T")

THREADED_PAIRS = 4_000_000
"""The fewest pairs of layouts (about: :func:`_pairs`) for which threads price the steps
ahead of the caller (:func:`_priced_ahead`). Measured on a 2-core x86 machine with 24 GiB,
one thread against two: meshes of three axes (1.2 to 1.8 million pairs, 1-2 s) gained
nothing; a mesh of four axes, 10.7 million pairs (the built-in transformer's step), went
from 11.3 s to 8.8 s, and 55 million (Llama-3 8B's AdamW step) from 47 s to 30 s."""


class _Draft:
    """A :class:`Problem` while :func:`build_problem` fills it in from ``costs``."""

    def __init__(self, costs: StepCosts) -> None:
        self.costs, self.graph = costs, costs.graph
        self.labels: list[tuple[str, int]] = []
        self.choices: list[list[Any]] = []
        self.unary: list[np.ndarray] = []
        self.edges: dict[tuple[int, int], np.ndarray] = {}
        self.considered = 0
        self.truncated = False
        self.classes: dict[int, int] = {}  # each class's variable
        self.menus: list[Any] = []  # what each variable's choices depend on (:meth:`once`)
        self.known: dict[tuple[Any, ...], Any] = {}  # for :meth:`once`
        self.ahead: dict[tuple[Any, ...], int] = {}  # each task's key (:func:`_priced_ahead`)
        self.beside: Beside[Any] | None = None

    def var(self, a: int) -> int:
        """The variable of array ``a``'s class."""
        return self.classes[self.graph.find(a)]

    def once(self, key: tuple[Any, ...], make: Callable[..., _T], *args: Any) -> _T:
        """``make(*args)``, made once for all steps alike (``key``: all it depends on, the
        variables' choices by their :attr:`menus`): a model written as a Python loop of layers
        repeats the same few steps once per layer, as a scan's layers repeat its body."""
        if key not in self.known:
            task = self.ahead.get(key)  # (made, or being made, beside: :func:`_priced_ahead`)
            if task is None or self.beside is None:
                self.known[key] = make(*args)
            else:
                self.known[key] = self.beside.result(task)
        found: _T = self.known[key]
        return found

    def value(self, a: int) -> tuple[Any, ...]:
        """What array ``a``'s costs depend on: its shape and dtype, and whether an op that
        cannot cut it up for an all-to-all makes it (:func:`~.steps.a2a_copies`)."""
        value = self.graph.values[a]
        return value.shape, value.dtype, a in self.costs.made

    def add_edge(self, u: int, v: int, matrix: np.ndarray) -> None:
        if u == v:
            self.unary[u] = self.unary[u] + np.diag(matrix)
        else:
            add_edge(self.edges, u, v, matrix)

    def freeze(self) -> Problem:
        problem = Problem.of(self.choices, self.unary, self.edges, self.labels)
        return dataclasses.replace(problem, considered=self.considered, truncated=self.truncated)


def build_problem(
    graph: Graph, mesh: MeshSpec, profile: Profile, pinned: dict[int, Spec] | None = None,
    time_limit: float | None = None,
) -> Problem:  # fmt: skip
    """The planning problem of ``graph`` on ``mesh``; ``pinned`` fixes some classes' specs.
    Pricing every step between every two layouts stops with an :class:`ArgumentError` that
    says what to do once it takes longer than ``time_limit`` seconds (a mesh of four axes
    gives an array hundreds of layouts: it had run for many minutes, saying nothing)."""
    deadline = None if time_limit is None else time.perf_counter() + time_limit
    pinned = pinned or {}
    costs = StepCosts(graph, mesh, profile)
    problem = _Draft(costs)
    for root in sorted(set(graph.classes)):
        value = graph.values[root]
        considered, specs = problem.once(("specs", value.shape), spec_choices, value.shape, mesh)
        problem.considered += considered
        menu: Any = value.shape  # the same shape, the same choices
        if root in pinned:
            specs, menu = [pinned[root]], ("pinned", root)
        specs = _spread(specs, problem)
        problem.classes[root] = len(problem.labels)
        problem.labels.append(("class", root))
        problem.choices.append(specs)
        problem.menus.append(menu)
        key = ("elementwise", menu, value.dtype, costs.runs.get(root, 0))
        problem.unary.append(problem.once(key, _each, costs.elementwise, root, specs))
    told, n = stages.listener(), len(graph.steps)
    every = max(1, -(-n // 100))  # (some hundred times at most: an unrolled model has thousands)
    with grids_kept():
        _priced_ahead(problem)
        try:
            for k, step in enumerate(graph.steps):
                if deadline is not None and time.perf_counter() > deadline:
                    raise _too_long(mesh, problem.choices, k, n, time_limit)
                if told is not None and (k % every == 0 or k + 1 == n):
                    told(f"pricing the layouts: step {k + 1} of {n}")
                if step.kind == "dot":
                    _add_dot(problem, k, step)
                elif step.kind == "map":
                    _add_map(problem, step)
                else:
                    _add_opaque(problem, k, step)
        finally:
            if problem.beside is not None:
                problem.beside.cancel()  # (none left where all went well)
    return problem.freeze()


Work = tuple[tuple[Any, ...], Callable[..., Any], tuple[Any, ...]]
"""Costs of a step made once for all steps alike (:meth:`_Draft.once`): their key, all they
depend on, and the function that makes them, with its arguments."""


def _priced_ahead(problem: _Draft) -> None:
    """Where pricing is large (:data:`THREADED_PAIRS` pairs of layouts or more, about: a mesh
    of four axes), each step's costs made in threads beside the caller, in step
    order, while the caller adds them to the problem in the same order (:meth:`_Draft.once`
    takes each from its task, the caller making it where no thread has taken it yet): the
    same costs, the same sums. Most of it is NumPy over grids of a million pairs, which
    runs with the GIL released: on two cores Llama-3 8B's AdamW step on
    ``data=2,fsdp=2,sequence=2,tensor=4`` prices in 27 s, 43 s in one thread."""
    if _pairs(problem) < THREADED_PAIRS:
        return  # (threads would only take turns with the caller for the GIL)
    tasks: list[Callable[[], Any]] = []
    for step in problem.graph.steps:
        for key, make, args in _works(problem, step):
            if key not in problem.ahead and key not in problem.known:
                problem.ahead[key] = len(tasks)
                tasks.append(functools.partial(make, *args))
    problem.beside = Beside(tasks, alone=False)


def _pairs(problem: _Draft) -> int:
    """About how many pairs of layouts pricing joins: each step's operands' layouts by its
    result's (a dot has about as many strategies), once for steps alike (the same op on
    arrays of the same menus of layouts: the layers of a Python loop)."""
    seen, pairs, choices = set(), 0, problem.choices
    for step in problem.graph.steps:
        ins, out = [problem.var(a) for a in step.inputs], problem.var(step.output)
        alike = (step.prim, *(problem.menus[u] for u in ins), problem.menus[out])
        if alike not in seen:
            seen.add(alike)
            pairs += sum(len(choices[u]) for u in ins) * len(choices[out])
    return pairs


def _works(problem: _Draft, step: Step) -> list[Work]:
    """What ``step``'s costs are made of (:data:`Work`), in the order it adds them."""
    if step.kind == "dot":
        return [_dot_work(problem, step)]
    if step.kind == "map":
        return [_map_work(problem, step)]
    return _opaque_works(problem, step)


def _too_long(
    mesh: MeshSpec, choices: Sequence[Sequence[Any]], done: int, steps: int, limit: Any
) -> ArgumentError:
    """Why the pricing stopped, and what to do."""
    most = max((len(c) for c in choices), default=0)
    merge = (
        "merge axes that the plan need not tell apart (data=2,fsdp=2 as fsdp=4), "
        if len(mesh.axes) > 1
        else ""
    )
    return ArgumentError(
        f"pricing the layouts on mesh {mesh.describe()} takes longer than the time limit "
        f"({limit:g} s; {done} of {steps} steps priced): an array has up to {most} layouts "
        f"on it, and each step is priced between every two. To plan, {merge}pin some inputs "
        "(fixed=, --fixed), or give a longer limit (--time-limit 600, plan(..., time_limit=600))."
    )


def _add_opaque(problem: _Draft, k: int, step: Step) -> None:
    """An opaque op: each operand moved whole, its own work, its result moved from whole to
    its class's layout (the work, the same for every choice, is put on the result's class)."""
    *feeds, made = [problem.once(key, make, *args) for key, make, args in
                    _opaque_works(problem, step)]  # fmt: skip
    for a, feed in zip(step.inputs, feeds, strict=True):
        u = problem.var(a)
        problem.unary[u] = problem.unary[u] + feed[:, 0]
    out = problem.var(step.output)
    problem.unary[out] = problem.unary[out] + (problem.costs.opaque(k).seconds + made[0])


def _opaque_works(problem: _Draft, step: Step) -> list[Work]:
    """An opaque step's moves: each operand's to whole, then its result's from whole."""
    costs, works = problem.costs, []
    for a in step.inputs:
        u = problem.var(a)
        key = ("feed", problem.value(a), step.repeat, problem.menus[u])
        works.append((key, _moves, (costs, step, a, problem.choices[u], [Spec()], True)))
    out = problem.var(step.output)
    key = ("made", problem.value(step.output), step.repeat, problem.menus[out])
    args = (costs, step, step.output, [Spec()], problem.choices[out], False)
    return [*works, (key, _moves, args)]


def _add_map(problem: _Draft, step: Step) -> None:
    """A map: an edge from its operand's class to its result's, :meth:`StepCosts.map` for
    every pair of layouts, the part before the result's move computed once per operand
    layout, the move once per layout the map makes; once for all maps alike."""
    key, make, args = _map_work(problem, step)
    problem.add_edge(problem.var(step.inputs[0]), problem.var(step.output),
                     problem.once(key, make, *args))  # fmt: skip


def _map_work(problem: _Draft, step: Step) -> Work:
    """A map's matrix: its own work and its result's move, for every pair of layouts."""
    a, b = problem.var(step.inputs[0]), problem.var(step.output)
    key = ("map", problem.value(step.inputs[0]), problem.value(step.output), step.dim_map,
           step.local, step.reduced, step.runs(False), step.runs(True), step.implicit,
           problem.menus[a], problem.menus[b])  # fmt: skip
    return key, _map_matrix, (step, problem.choices[a], problem.choices[b], problem.costs)


def _map_matrix(step: Step, sa: list[Spec], sb: list[Spec], costs: StepCosts) -> np.ndarray:
    if step.implicit:  # its operand moved to the result's layout (:func:`~.steps.broadcast_read`)
        reads = [broadcast_read(costs.graph, step, t, costs.mesh) for t in sb]
        own = np.array([costs.broadcast_bytes(step, r) for r in reads])
        a = step.inputs[0]
        return np.asarray(_moves(costs, step, a, sa, reads, True) + own[None, :])
    heads = [costs.map_head(step, s) for s in sa]
    after = _moves(costs, step, step.output, [mapped for _, mapped in heads], sb, False)
    return np.asarray(np.array([head.seconds for head, _ in heads])[:, None] + after)


def _moves(
    costs: StepCosts, step: Step, a: int, srcs: list[Spec], dsts: list[Spec], into_op: bool
) -> np.ndarray:
    """Seconds to move array ``a`` for ``step`` from each of ``srcs`` to each of ``dsts``
    (each distinct pair costed once, all at once by :func:`~.moves.reshard_grid` but where a
    scan's slice moves its whole stack first, :meth:`StepCosts.hoisted`: a fifth of the pairs
    of Llama's stacked weights on a mesh of four axes)."""
    rows = {spec: k for k, spec in enumerate(dict.fromkeys(srcs))}
    cols = {spec: k for k, spec in enumerate(dict.fromkeys(dsts))}
    if costs.moves_nothing(step, a):
        table = np.zeros((len(rows), len(cols)))
    else:
        copies = a2a_copies(a, costs.made, into_op)
        table = reshard_grid(costs.graph.values[a], list(rows), list(cols), costs.mesh,
                             costs.profile, step.runs(a == step.output), copies)  # fmt: skip
        if costs.hoists(step, a):  # (the pairs whose move opens with all-to-alls, one by one)
            for (x, i), (y, j) in itertools.product(rows.items(), cols.items()):
                if costs.hoisted(step, a, x, y) is not None:
                    table[i, j] = costs.move_seconds(step, a, x, y, into_op)
    if len(rows) < len(srcs):  # (each distinct pair's cost where it repeats)
        table = table[[rows[x] for x in srcs]]
    return table if len(cols) == len(dsts) else table[:, [cols[y] for y in dsts]]


def _each(cost: Callable[[int, Spec], float], root: int, specs: list[Spec]) -> np.ndarray:
    """``cost(root, spec)`` for each of ``specs``."""
    return np.array([cost(root, spec) for spec in specs])


def _spread(items: list[Spec], problem: _Draft) -> list[Spec]:
    if len(items) <= MAX_CHOICES:
        return items
    problem.truncated = True
    return [items[k * len(items) // MAX_CHOICES] for k in range(MAX_CHOICES)]


def _add_dot(problem: _Draft, k: int, step: Step) -> None:
    """A dot: a variable for its strategy, its own work, and an edge to each operand's class
    and to its result's (the moves between their layouts and the strategy's); once for all
    dots alike."""
    key, make, args = _dot_work(problem, step)
    considered, found, unary, feeds, made = problem.once(key, make, *args)
    operands, out = args[2], args[3]
    problem.considered += considered
    d = len(problem.labels)
    problem.labels.append(("dot", k))
    problem.choices.append(found)
    problem.menus.append(key)
    problem.unary.append(unary)
    for u, matrix in zip(operands, feeds, strict=True):
        problem.add_edge(u, d, matrix)
    problem.add_edge(d, out, made)


def _dot_work(problem: _Draft, step: Step) -> Work:
    """A dot's strategies, their own costs and the moves of its operands and result."""
    operands = [problem.var(a) for a in step.inputs]
    out = problem.var(step.output)
    key = ("dot", step.op, step.prim, step.whole, step.flops,
           tuple(problem.value(a) for a in step.inputs),
           problem.value(step.output), step.repeat, tuple(problem.menus[u] for u in operands),
           problem.menus[out])  # fmt: skip
    return key, _dot_costs, (problem, step, operands, out)


def _dot_costs(
    problem: _Draft, step: Step, operands: list[int], out: int
) -> tuple[int, list[Any], np.ndarray, list[np.ndarray], np.ndarray]:
    """A dot's strategies (and how many were considered), their own costs, and the moves
    from each operand's class to the layout each strategy reads it in, and from the layout
    each makes its result in to the result's class."""
    assert step.op is not None
    costs, graph = problem.costs, problem.graph
    considered, found = dot_strategies(graph, step, costs.mesh, MAX_CHOICES)
    unary = np.array([costs.dot(step, s).seconds for s in found])
    feeds = []
    for slot, (a, u) in enumerate(zip(step.inputs, operands, strict=True)):
        wanted = [t.in_specs(step.op)[slot] for t in found]
        feeds.append(_moves(costs, step, a, problem.choices[u], wanted, True))
    made = [t.out_spec for t in found]
    return (
        considered,
        found,
        unary,
        feeds,
        _moves(costs, step, step.output, made, problem.choices[out], False),
    )
