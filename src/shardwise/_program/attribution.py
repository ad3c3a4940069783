"""Which op and source line each compiled collective belongs to: a program plan predicts
every collective with the op and ``file:line`` behind it, and XLA's HLO metadata names the
ones it compiled (:func:`attributed` compares the two)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shardwise._model.collective import Collective as BaseCollective
from shardwise._program.nodes import Loop
from shardwise._versions import combined_names_every_part, moves_named_after_operand


def _line(source: str) -> str:
    """``file:line`` of an HLO source (``/path/models.py:35 (mlp)`` → ``models.py:35``)."""
    return source.split(" ", 1)[0].rsplit("/", 1)[-1]


def _ops(op_name: str) -> set[str]:
    """The ops behind one HLO collective, from its ``op_name``: one, or several where XLA
    combined collectives (``jit(f)/(jvp()/reduce_sum:transpose(jvp())/dot_general)``; parts
    of the same name are named once). A name outside the program's ops (``args[0]``: from
    JAX 0.11, XLA names the change of an argument's layout after the argument) is a layout
    change."""
    if op_name and "/" not in op_name:
        return {LAYOUT_CHANGE}
    start = op_name.find("/(")
    if start < 0 or not op_name.endswith(")"):
        return {op_name.rsplit("/", 1)[-1]}
    parts, depth, word = [], 0, ""
    for ch in op_name[start + 2 : -1]:
        depth += (ch == "(") - (ch == ")")
        if ch == ":" and depth == 0:
            parts.append(word)
            word = ""
        else:
            word += ch
    return {part.rsplit("/", 1)[-1] for part in [*parts, word]}


LAYOUT_CHANGE = "sharding_constraint"
"""What XLA names a collective that changes a layout the plan constrains: it stands for
whichever op the plan moves the array for."""

SCAN_OPS = frozenset({"scan slice", "scan stack"})
"""A scan's own slicing and stacking: XLA does them with ops of its choosing (``squeeze``,
``dynamic-slice``, ``dynamic-update-slice``) and names the collective after those."""

_TRIES = 200_000


def attributed(predicted: Sequence[BaseCollective], compiled: Sequence[BaseCollective]) -> bool:
    """Whether the compiled collectives belong to the ops and source lines the plan says.

    Each compiled collective stands for some predicted ones of its kind and axes (XLA
    combines collectives, and names each op once): their bytes add up to its bytes, its
    ``source_line`` is one of theirs (a combined one keeps its first part's), and their ops are
    the ops its ``op_name`` gives (:data:`LAYOUT_CHANGE` stands for any op, and any op for one
    of :data:`SCAN_OPS`; one named after an argument, with no line, for any op and line).
    Where XLA names a layout change after the op that laid out the array it moves
    (:func:`~shardwise._versions.moves_named_after_operand`), that op's line (a predicted
    collective's ``operand_source``) is its line too. Every predicted collective must be
    stood for, once.

    >>> def said(op, source):
    ...     return [BaseCollective("all-reduce", ("model",), 8, op_name=op, source=source)]
    >>> attributed(said("dot_general", "m.py:3"), said("jit(f)/dot_general", "/src/m.py:3 (f)"))
    True
    >>> attributed(said("dot_general", "m.py:3"), said("jit(f)/dot_general", "/src/m.py:4 (f)"))
    False
    >>> attributed(said("mul (broadcast)", "m.py:3"), said("jit(f)/mul", "/src/m.py:3 (f)"))
    True
    """
    groups = {c.group for c in [*predicted, *compiled]}
    return all(
        _paired(
            sorted(((c.bytes, _ops(c.op_name), _line(c.source)) for c in compiled if c.group == g),
                   key=lambda c: (len(c[1]), -c[0])),
            sorted((p.bytes, _op(p.op_name), p.source, _operand_line(p)) for p in predicted
                   if p.group == g),
        )
        for g in groups
    )  # fmt: skip


Part = tuple[int, str, str, str]
"""A predicted collective as attributed: its bytes, op, line, and the line where the array it
moves was laid out before (``""``: none, or XLA does not name a move after it)."""


def _operand_line(c: BaseCollective) -> str:
    """The line XLA may name ``c`` after besides its own: where the array it moves was laid
    out before, where XLA names a move after its operand."""
    return str(getattr(c, "operand_source", "")) if moves_named_after_operand() else ""


def _at(part: Part, line: str, names: set[str]) -> bool:
    """Whether a compiled collective at ``line`` named ``names`` may be ``part``'s: at its own
    line, or, named as a layout change, at the line where the array it moves was laid out
    (as XLA names the moves it was measured to: ``part[3]``, :func:`_operand_line`)."""
    return part[2] == line or (bool(part[3]) and part[3] == line and LAYOUT_CHANGE in names)


def _paired(found: list[tuple[int, set[str], str]], left: list[Part]) -> bool:
    """:func:`_stands_for`, first with each compiled collective that is one predicted one
    (its bytes and line) paired with it at once: the search alone ran out of tries on a
    training step of 27 all-gathers each its own, and said that they were not."""
    rest, unpaired = list(left), []
    for nbytes, names, line in found:
        same = [p for p in rest if p[0] == nbytes]  # (its own line's first, then its operand's)
        twin = next((p for p in same if p[2] == line), None) or next(
            (p for p in same if _at(p, line, names)), None
        )
        if twin is not None and _fits(names, line, [twin]):
            rest.remove(twin)
        else:
            unpaired.append((nbytes, names, line))
    return _stands_for(unpaired, rest) or _stands_for(found, list(left))


def _op(name: str) -> str:
    """A predicted op's primitive, as XLA names it: ``mul``, not ``mul (broadcast)`` (an
    elementwise op one of whose operands the plan broadcasts)."""
    return name.removesuffix(" (broadcast)")


def _fits(names: set[str], line: str, parts: list[Part]) -> bool:
    ops = {p[1] for p in parts}
    named = names - {LAYOUT_CHANGE}
    # (an older XLA names a combined collective after its first part alone)
    first_only = len(names) == 1 and not combined_names_every_part()
    return (
        # the change of an argument's layout, named after the argument, has no line
        ((not line and names == {LAYOUT_CHANGE}) or any(_at(p, line, names) for p in parts))
        and (ops - SCAN_OPS <= names or LAYOUT_CHANGE in names or first_only)
        and (named <= ops or bool(ops & SCAN_OPS))
    )


def _stands_for(found: list[tuple[int, set[str], str]], left: list[Part]) -> bool:
    """Whether ``found`` (bytes, ops, line) of one kind and axes can each stand for a set of
    ``left`` (:data:`Part`), sorted, using each once and all; a bounded backtracking search
    that tries each distinct set once."""
    tries = [0]

    def subsets(need: int, start: int, chosen: list[Part], order: list[Any]) -> Any:
        if need == 0:
            yield list(chosen)
            return
        for i in range(start, len(order)):
            tries[0] += 1
            if (i > start and order[i] == order[i - 1]) or order[i][0] > need or tries[0] > _TRIES:
                continue
            chosen.append(order[i])
            yield from subsets(need - order[i][0], i + 1, chosen, order)
            chosen.pop()

    def match(k: int) -> bool:
        if k == len(found):
            return not left
        nbytes, names, line = found[k]
        # its own line's parts first, the largest first: the few sets it is are tried before
        # the many that small parts of other lines make (a ViT's 4-byte norms had run the
        # search out of tries)
        order = sorted(left, key=lambda p: (not _at(p, line, names), -p[0], p[1], p[2], p[3]))
        for parts in subsets(nbytes, 0, [], order):
            if _fits(names, line, parts):
                for p in parts:
                    left.remove(p)
                if match(k + 1):
                    return True
                left.extend(parts)
                left.sort()
        return False

    return match(0)


def as_compiled(loops: Sequence[Loop], predicted: Sequence[Any]) -> list[Any]:
    """The ``predicted`` collectives as the compiled program lists them: one in the body of a
    scan that JAX unrolls (``unroll=``) once per copy of the body the program holds (nested
    scans' copies multiplied); the others once. A scan unrolled whole, or by 2, had failed
    ``verify`` for every plan with a collective in its body (``optax.contrib.muon``).

    >>> from shardwise._model.cost import PredictedCollective as C
    >>> found = as_compiled([Loop(0, 9, 4, frozenset(), (1, 3), unroll=4)],
    ...                     [C("all-reduce", ("x",), 8, step=k) for k in (0, 2)])
    >>> [c.step for c in found]
    [0, 2, 2, 2, 2]
    """
    out = []
    for c in predicted:
        copies = 1
        for loop in loops:
            if loop.steps[0] <= getattr(c, "step", -1) < loop.steps[1]:
                copies *= loop.copies
        out += [c] * copies
    return out
