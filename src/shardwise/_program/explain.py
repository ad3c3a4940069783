"""Why each collective of a plan is there: every collective attributed to the op that causes it
(a dot's partial sums, an operand read in another layout than it is held in, a result kept in
another layout than it is made in, a map that needs dimensions whole), with the reason in
words, and each op's share of the time."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping, Sequence, Set
from typing import TYPE_CHECKING, Any

from shardwise._model.cost import PredictedCollective
from shardwise._model.reshard import reshard_moves
from shardwise._model.spec import Spec
from shardwise._model.strategy import Strategy
from shardwise._program.graph import Graph
from shardwise._program.moves import Cost
from shardwise._program.nodes import Step
from shardwise._program.steps import StepCosts, broadcast_read, map_specs

if TYPE_CHECKING:
    from shardwise._program.solution import Layouts


def layout_text(spec: Spec, dims: Sequence[str] | int) -> str:
    """A layout with its dimensions named: ``dims`` is an einsum term (``"bf"``), the names, or
    a rank (``d0, d1…``).

    >>> layout_text(Spec.parse("-,model"), "bf")
    'b, f:model'
    >>> layout_text(Spec(), 2)
    'd0, d1 (whole)'
    """
    names = [f"d{k}" for k in range(dims)] if isinstance(dims, int) else list(dims)
    if not names:
        return "scalar"
    entries = spec.padded(len(names))
    text = ", ".join(f"{n}:{'+'.join(e)}" if e else n for n, e in zip(names, entries, strict=True))
    return text + (" (whole)" if not spec.axes else "")


def dims_of(step: Step, position: int, rank: int) -> str | int:
    """A step operand's (``position`` ≥ 0) or result's (``-1``) dimension names: the einsum
    letters of a dot, else the rank (``d0, d1…``)."""
    if step.op is None:
        return rank
    return step.op.output if position < 0 else step.op.inputs[position]


def _less(cost: Cost, skip: int, repeat: int) -> Cost:
    """``cost`` without its first ``skip`` collectives (an earlier move made them) and their
    time."""
    gone = sum(c.seconds for c, _ in cost.collectives[:skip]) * repeat
    return Cost(cost.seconds - gone, cost.collectives[skip:], cost.flops)


HOISTED = -2
"""A collective's ``side`` where it moves a whole stack before its scan's loop
(:meth:`StepCosts.hoisted`)."""


def runs(step: Step, side: int) -> int:
    """How many times a collective that ``step``'s tally found on ``side`` runs."""
    return step.repeat if side == HOISTED else step.runs(side < 0)


def laid_out_at(graph: Graph, k: int, side: int) -> str:
    """The user's line where the array a collective of step ``k`` on ``side`` moves (its
    operand ``side``, or the stack it slices, :data:`HOISTED`) is last laid out before the
    step reads it: where the call's or scan's body or the cond's branch that ``k`` runs in
    takes it, if it was made before that began (the plan's program lays out there again each
    array a body takes), else where the op that made it ran; ``""`` for a collective after
    its step, or an argument the step's own scope reads."""
    step = graph.steps[k]
    a = step.inputs[0] if side == HOISTED else side
    if a < 0:
        return ""
    entry = graph.entered.get(step.key[:-1])
    if entry is not None and graph.born[a] <= entry[0]:
        return entry[1]
    return graph.values[a].source


def stacked_as_read(graph: Graph, lay: Layouts, step: Step) -> bool:
    """Whether a scan's stacked result is made in the layout it is kept in from a copy of
    its slice that an op in the loop already reads moved (each slice kept as a local slice
    of that copy): XLA stacks the moved copy instead of moving the stack after the loop (seen
    in the compiled HLO: no all-to-all of the stacked activations where the loop's dot reads
    each of them resharded)."""
    a, entries = step.inputs[0], lay.specs[step.output].entries
    if not entries or entries[0]:
        return False
    kept, rank, held = Spec(entries[1:]), len(graph.values[a].shape), lay.specs[a].canonical()
    for r in graph.steps:
        found = lay.steps.get(r.key) if a in r.inputs else None
        if found is None:
            continue
        for b, used in zip(r.inputs, found[0], strict=False):
            moves = reshard_moves(used, kept, rank) if b == a else [None]
            if used.canonical() != held and all(m and m.kind == "slice" for m in moves):
                return True
    return False


class Tally:
    """The collectives and time of one plan, op by op, each collective with its reason, from
    the same step costs the solver's matrices hold (:class:`StepCosts`). An operand moved the
    same way twice in one scope is counted once, as XLA computes it once, and so are the first
    steps that two of its moves share (``shared=False`` counts each move, as the matrices
    do)."""

    def __init__(
        self,
        graph: Graph,
        lay: Layouts,
        costs: StepCosts,
        shared: bool = True,
        prior: Tally | None = None,
        dirty: Set[int] = frozenset(),
    ) -> None:
        self.graph, self.lay, self.costs, self.shared = graph, lay, costs, shared
        self.mesh = costs.mesh
        self.found: list[tuple[Any, int, str, int]] = []
        """Each collective found: the collective, its step, why, and the operand it moves
        before the step runs, or ``-1``: after (a dot's partial sums, a result moved to the
        layout it is kept in)."""
        self.seconds = [0.0] * len(graph.steps)
        self.flops = 0.0
        self.moved: set[tuple[int, Spec, Spec, tuple[int, ...]]] = set()
        self.prior, self.dirty = prior, dirty
        """A plan's tally whose moves of the arrays not ``dirty`` this one repeats
        (:meth:`near`)."""
        self.fed: dict[tuple[int, int], tuple[Cost, Callable[[], str]] | None] = {}
        """Each step operand's move as added (``None``: nothing), by (step, position)."""
        self.heads: dict[int, int | None] = {}
        """Each map's gathers an earlier move made (:meth:`_shared`), by step."""
        self.starts: list[int] = []
        """Where each step's collectives begin in :attr:`found`."""
        self.own_flops = [0.0] * len(graph.steps)
        """Each step's FLOPs."""
        self.own_seconds = [0.0] * len(graph.steps)
        """Each dot's own time (:meth:`without`)."""

    def add(self, k: int, cost: Cost, why: Callable[[], str], side: int = -1) -> None:
        """Step ``k``'s ``cost``, each of its collectives for the reason ``why()`` says (put
        in words only where there are any: most moves of most plans have none); ``side``:
        the operand they move before the step, or ``-1``: they come after it."""
        self.seconds[k] += cost.seconds
        if cost.collectives:
            text = why()
            self.found.extend((c, k, text, side) for c, _ in cost.collectives)

    def step(self, k: int, strategy: Strategy | None) -> None:
        """Step ``k``'s cost under the plan (``strategy``: a dot's)."""
        step = self.graph.steps[k]
        self.starts.append(len(self.found))
        if step.kind == "dot":
            assert strategy is not None
            self.dot(k, step, strategy)
        elif step.kind == "map":
            self.map(k, step)
        else:
            self.opaque(k, step)

    def _text(self, spec: Spec, step: Step, position: int, a: int) -> str:
        return layout_text(spec, dims_of(step, position, len(self.graph.values[a].shape)))

    def feed(self, k: int, step: Step, position: int, a: int, dst: Spec) -> None:
        """Operand ``a`` moved to the layout ``step`` reads it in."""
        if self.prior is not None and a not in self.dirty:
            done = self.prior.fed[(k, position)]  # the same move, after the same ones
            if done is not None:
                self.add(k, *done, side=a)
            return
        src = self.lay.specs[a]
        shared = None if src == dst else self._shared(a, src, dst, step.key[:-1])
        if shared is None:
            self.fed[(k, position)] = None
            return
        value = self.graph.values[a]
        cost = _less(self.costs.move(step, a, src, dst, True), shared, step.runs(False))

        def why() -> str:
            return (
                f"{value.name} is held as [{self._text(src, step, position, a)}]; "
                f"{step.prim} reads it as [{self._text(dst, step, position, a)}]"
            )

        self.fed[(k, position)] = (cost, why)
        self.add(k, cost, why, side=a)

    def _shared(self, a: int, src: Spec, dst: Spec, scope: tuple[int, ...]) -> int | None:
        """How many of the collectives that move ``a`` from ``src`` to ``dst`` an earlier move
        of ``a`` in ``scope`` already made (XLA computes the same constraint on the same array
        once: a backward pass that reads ``x`` gathered on one axis reuses the forward pass's
        gather on its way to another layout); ``None`` where it made every step."""
        if not self.shared:
            return 0
        before, shared, fresh = src.canonical(), 0, False
        for move in reshard_moves(src, dst, len(self.graph.values[a].shape)):
            key = (a, before, move.spec, scope)
            fresh = fresh or key not in self.moved
            self.moved.add(key)
            if not fresh and move.axis is not None and self.mesh.shape[move.axis] > 1:
                shared += 1
            before = move.spec
        return shared if fresh else None

    def dot(self, k: int, step: Step, strategy: Strategy) -> None:
        assert step.op is not None
        own = self.costs.dot(step, strategy)
        self.flops += own.flops
        self.own_flops[k], self.own_seconds[k] = own.flops, own.seconds
        self.add(k, own, lambda: _partial_sums(step, strategy))
        for position, (a, spec) in enumerate(
            zip(step.inputs, strategy.in_specs(step.op), strict=True)
        ):
            self.feed(k, step, position, a, spec)
        self._result(k, step, strategy.out_spec, "the dot")

    def _result(self, k: int, step: Step, made: Spec, who: str) -> None:
        out = self.graph.values[step.output]
        kept = self.lay.specs[step.output]
        mid = self.costs.hoisted(step, step.output, made, kept)
        if mid is not None:
            stack = self.graph.values[step.inputs[0]]
            self.add(
                k,
                self.costs.stack_move(step, made, mid),
                lambda: (
                    f"{who} slices {out.name} from {stack.name}: the whole stack moves before "
                    f"the loop, as XLA moves it, to [{self._text(mid, step, -1, step.output)}] "
                    "per layer"
                ),
                HOISTED,
            )
            made = mid
        self.add(
            k,
            self.costs.move(step, step.output, made, kept, False),
            lambda: (
                f"{who} makes {out.name} as [{self._text(made, step, -1, step.output)}]; "
                f"it is kept as [{self._text(kept, step, -1, step.output)}]"
            ),
        )

    def map(self, k: int, step: Step) -> None:
        a = step.inputs[0]
        src = self.lay.specs[a]
        if step.implicit:  # the operand moved to the result's layout, as the matrices count it
            read = broadcast_read(self.graph, step, self.lay.specs[step.output], self.mesh)
            self.feed(k, step, 0, a, read)
            self.seconds[k] += self.costs.broadcast_bytes(step, read)
            return
        head, mapped = self.costs.map_head(step, src)
        # the gather to the whole operand comes first; what an earlier move of the operand
        # made (a backward scan slices the stack the forward one gathered) is not made again
        whole = map_specs(self.graph, step, src, self.mesh)[0]
        if self.prior is not None and a not in self.dirty:
            shared = self.prior.heads[k]
        else:
            shared = self._shared(a, src, whole, step.key[:-1]) if src != whole else 0
        self.heads[k] = shared
        gathers = sum(c.kind != "all-reduce" for c, _ in head.collectives)
        head = _less(head, gathers if shared is None else shared, step.runs(False))
        for c, _ in head.collectives:
            if c.kind == "all-reduce":
                kind = _COMBINED.get(step.prim, "sum")  # (reduce_max combines by the maximum)
                why = (
                    f"{step.prim} reduces over split dimensions: each device holds a partial {kind}"
                )
            else:
                need = ", ".join(f"d{d}" for d in step.local) or "its split dimensions"
                why = f"{step.prim} needs {need} of [{self._text(src, step, 0, a)}] whole"
            self.found.append((c, k, why, -1 if c.kind == "all-reduce" else a))
        self.seconds[k] += head.seconds
        if (
            step.role == "scan stack"
            and self.shared
            and stacked_as_read(self.graph, self.lay, step)
        ):
            return  # (made as kept: nothing moves after the loop; the matrices count the move)
        self._result(k, step, mapped, step.prim)

    def opaque(self, k: int, step: Step) -> None:
        for position, a in enumerate(step.inputs):
            self.feed(k, step, position, a, Spec())
        own = self.costs.opaque(k)
        self.flops += own.flops
        self.own_flops[k] = own.flops
        self.add(k, own, lambda: f"{step.prim} runs on one device; every device gets its result")
        what = step.prim if step.modelled else f"{step.prim} (not modelled)"
        self._result(k, step, Spec(), what)

    def without(self, dots: Set[int]) -> Tally:
        """This tally with the work of ``dots`` taken away, their moves kept: dots XLA does
        not run (a recomputation merged with the forward pass,
        :func:`~shardwise._program.remat.twins`; XLA still moves their operands as the plan
        reads them, seen in the compiled HLO of a checkpointed layer's data × tensor plan:
        the recomputed layer's all-gather kept); itself where there are none."""
        if not dots:
            return self
        out = copy.copy(self)
        out.seconds = [s - self.own_seconds[k] if k in dots else s
                       for k, s in enumerate(self.seconds)]  # fmt: skip
        out.own_flops = [0.0 if k in dots else f for k, f in enumerate(self.own_flops)]
        out.flops = _in_order(out.own_flops)
        return out

    def collectives(self) -> tuple[PredictedCollective, ...]:
        """Every collective found, each with its op, source line, repeats, step and why, and
        where one that moves an array before its step found that array laid out
        (:func:`laid_out_at`: XLA may name it after that line,
        :func:`~shardwise._versions.moves_named_after_operand`)."""
        steps = self.graph.steps
        return tuple(
            dataclasses.replace(
                c,
                op_name=steps[k].prim,
                source=steps[k].source,
                repeat=runs(steps[k], side),
                step=k,
                why=why,
                operand_source=laid_out_at(self.graph, k, side),
            )
            for c, k, why, side in self.found
            if c.bytes
        )


def retally(
    prior: Tally, lay: Layouts, strategies: Mapping[int, Strategy], before: Mapping[int, Strategy]
) -> Tally:
    """The tally of a plan near the one ``prior`` tallied in full (its dots' strategies
    ``before``), the same as a tally of its own: a step that makes no array laid out otherwise,
    keeps its strategy and reads no array that is laid out otherwise or that a dot with
    another strategy reads is the prior's; the others are tallied again, in order, each move of
    an array that nothing moves otherwise as the prior made it (the moves an earlier one made
    of the same array are then the same, :meth:`Tally._shared`)."""
    assert prior.prior is None
    graph, specs, old = prior.graph, lay.specs, prior.lay.specs
    roots = {r for r in set(graph.classes) if specs[r] != old[r]}
    changed = {v for v, r in enumerate(graph.classes) if r in roots}
    redone = {k for k, s in strategies.items() if s != before.get(k)}
    dirty = changed | {a for k in redone for a in graph.steps[k].inputs}
    tally = Tally(graph, lay, prior.costs, prior.shared, prior, dirty)
    ends = [*prior.starts[1:], len(prior.found)]
    for k, step in enumerate(graph.steps):
        if k in redone or step.output in changed or any(a in dirty for a in step.inputs):
            tally.step(k, strategies.get(k))
            continue
        tally.starts.append(len(tally.found))
        tally.found.extend(prior.found[prior.starts[k] : ends[k]])
        tally.seconds[k] = prior.seconds[k]
        tally.own_flops[k], tally.own_seconds[k] = prior.own_flops[k], prior.own_seconds[k]
    tally.flops = _in_order(tally.own_flops)
    return tally


def _in_order(flops: Sequence[float]) -> float:
    """The steps' ``flops`` added in step order, as a tally of its own adds them (the same
    float, bit for bit)."""
    total = 0.0
    for each in flops:
        total += each
    return total


def _partial_sums(step: Step, strategy: Strategy) -> str:
    """Why a dot under ``strategy`` leaves partial sums, in words."""
    assert step.op is not None
    summed = [(i, a) for i, a in strategy.layout.assignment if a and i in step.op.contracted]
    split = ", ".join(f"{i} split on {'+'.join(a)}" for i, a in summed)
    axes = "+".join(sorted({x for _, a in summed for x in a}))
    return (
        f"{step.op.equation} sums over {split}: each device holds a partial sum, added "
        f"across {axes}"
    )


_COMBINED = {
    "reduce_max": "maximum",
    "reduce_min": "minimum",
    "reduce_prod": "product",
    "reduce_and": "and",
    "reduce_or": "or",
    "argmax": "maximum",
    "argmin": "minimum",
}
"""What the devices' parts of a reduction other than a sum are (each holds a partial one)."""
