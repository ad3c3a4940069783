"""Follow what a contraction computes through compiled HLO, to the first op that uses it whole.

A dot whose contracted dimensions are split across devices leaves each device a partial sum.
Linear ops may carry a partial sum along (adds, copies, reshapes, slices, moves between
devices, another dot, a sum over a dimension), but an op that is not linear (``maximum``,
``tanh``, a comparison, an index) and the program's result need the whole sum.
:func:`unsummed_use` walks the data flow of SPMD-partitioned HLO text from one instruction,
through fusions, calls, loops and branches, adding up the mesh axes each collective on the
way sums over, and returns the first such use that the sums do not cover.

Everything here is pure: :func:`parse` reads ``compiled.as_text()``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from shardwise._xla.hlo import axes_of_groups, bracketed, collective_groups, stack_frames

_HEAD = re.compile(r"^\s*(ROOT\s+)?%([\w.\-]+)\s*=\s*")
_TYPED_OPCODE = re.compile(r"(\S+)\s+([\w\-]+)\(")
_OPCODE = re.compile(r"\s*([\w\-]+)\(")
_OPERAND = re.compile(r"%([\w.\-]+)")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_TO_APPLY = re.compile(r"\bto_apply=%([\w.\-]+)")
_COMPUTATION = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s+\(.*\{\s*$")
_DIMS = re.compile(r"\b[a-z]+\d*\[([\d,]*)\]")
_CALLS = re.compile(r"\b(calls|body|condition|true_computation|false_computation)=%([\w.\-]+)")
_FRAME = re.compile(r"stack_frame_id=(\d+)")
_SOURCE = re.compile(r'source_file="([^"]*)"\s+source_line=(\d+)')

NONLINEAR = frozenset({
    "maximum", "minimum", "tanh", "exponential", "exponential-minus-one", "log", "log-plus-one",
    "logistic", "rsqrt", "sqrt", "cbrt", "power", "compare", "sign", "abs", "floor", "ceil",
    "round-nearest-afz", "round-nearest-even", "is-finite", "erf", "sine", "cosine", "tan",
    "atan2", "clamp", "sort", "remainder", "not", "and", "or", "xor", "popcnt", "shift-left",
    "shift-right-arithmetic", "shift-right-logical", "select-and-scatter", "cholesky",
    "triangular-solve", "rng", "rng-bit-generator", "topk"
})  # fmt: skip
"""Ops that need their operands whole: a partial sum must be summed before any of them."""

_WHOLE_OPERAND = {"divide": 1, "select": 0, "conditional": 0}
"""Ops linear in all operands but one: a divisor, a predicate, a branch index."""

_INDICES_FROM = {"dynamic-slice": 1, "dynamic-update-slice": 2, "gather": 1}
"""Ops whose operands from this position on are indices."""


@dataclass(frozen=True, slots=True)
class Instr:
    """One HLO instruction: its name, opcode, dimensions of its (first) array, operands, the
    computation it is in, whether it is that computation's root, and the text after its
    operands (attributes and metadata)."""

    name: str
    opcode: str
    dims: tuple[int, ...]
    tuple_out: bool
    operands: tuple[str, ...]
    computation: str
    root: bool
    attrs: str

    def ints(self, attr: str) -> tuple[int, ...]:
        """The integers of attribute ``attr`` (``lhs_contracting_dims={1}`` → ``(1,)``)."""
        m = re.search(rf"\b{attr}=\{{([\d,]*)\}}", self.attrs)
        return tuple(int(t) for t in m.group(1).split(",") if t) if m else ()

    @property
    def op_name(self) -> str:
        """The JAX op behind it, from its metadata (``jit(f)/dot_general``; ``""``: none)."""
        m = _OP_NAME.search(self.attrs)
        return m.group(1) if m else ""


@dataclass(slots=True)
class Module:
    """An HLO module's data flow: instructions by name, each one's users (with the operand
    position), each computation's parameters and root, who calls each computation, and the
    user's ``file:line`` of each stack frame of the metadata."""

    instrs: dict[str, Instr] = field(default_factory=dict)
    users: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    params: dict[str, dict[int, str]] = field(default_factory=dict)
    roots: dict[str, str] = field(default_factory=dict)
    callees: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    callers: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    frames: dict[int, str] = field(default_factory=dict)
    entry: str = ""

    def add(self, instr: Instr) -> None:
        self.instrs[instr.name] = instr
        for k, operand in enumerate(instr.operands):
            self.users.setdefault(operand, []).append((instr.name, k))
        if instr.root:
            self.roots[instr.computation] = instr.name
        if instr.opcode == "parameter":
            index = int(instr.attrs) if instr.attrs.isdigit() else 0
            self.params.setdefault(instr.computation, {})[index] = instr.name
        if "=%" not in instr.attrs and "={%" not in instr.attrs:
            return  # (it calls no computation)
        called = _CALLS.findall(instr.attrs)
        if instr.opcode == "call":
            called += [("calls", c) for c in _TO_APPLY.findall(instr.attrs)]
        branches = re.search(r"\bbranch_computations=\{([^}]*)\}", instr.attrs)
        if branches:
            called += [("branch", c) for c in re.findall(r"%([\w.\-]+)", branches.group(1))]
        for role, computation in called:
            self.callees.setdefault(instr.name, []).append((role, computation))
            self.callers.setdefault(computation, []).append((instr.name, role))

    def combiner(self, instr: Instr) -> str:
        """The opcode at the root of the computation ``instr`` reduces with (``add``)."""
        m = _TO_APPLY.search(instr.attrs)
        root = self.roots.get(m.group(1), "") if m else ""
        return self.instrs[root].opcode if root in self.instrs else ""

    def source(self, instr: Instr) -> str:
        """The user's ``file:line`` behind ``instr``, from its metadata (``""``: none)."""
        found = _SOURCE.search(instr.attrs)
        if found:
            return f"{found.group(1).rsplit('/', 1)[-1]}:{found.group(2)}"
        frame = _FRAME.search(instr.attrs)
        return self.frames.get(int(frame.group(1)), "") if frame else ""


def parse(text: str) -> Module:
    """The data flow of compiled HLO text (``compiled.as_text()``)."""
    module = Module(frames={k: _line(v) for k, v in stack_frames(text).items()})
    computation = ""
    for line in text.splitlines():
        head = _HEAD.match(line)
        if head is None:
            found = _COMPUTATION.match(line)
            if found:
                computation = found.group(2)
                module.entry = computation if found.group(1) else module.entry
            continue
        instr = _instr(line[head.end() :], head.group(2), computation, bool(head.group(1)))
        if instr is not None:
            module.add(instr)
    return module


def _instr(rest: str, name: str, computation: str, root: bool) -> Instr | None:
    """One instruction from the text after ``%name = ``: ``type opcode(operands), attrs``."""
    if rest.startswith("("):
        kind = bracketed(rest, 0, "(", ")")
        op = _OPCODE.match(rest, len(kind))
    else:
        op = _TYPED_OPCODE.match(rest)
        kind = op.group(1) if op else ""
    if op is None:
        return None
    close = rest.find(")", op.end())
    operands = rest[op.end() : close]
    if "(" in operands or close < 0:  # (operands printed with tuple types)
        operands = bracketed(rest, op.end() - 1, "(", ")")[1:-1]
        close = op.end() + len(operands)
    dims = _DIMS.search(kind)
    opcode = op.group(op.lastindex or 1)
    return Instr(
        name=name,
        opcode=opcode,
        dims=tuple(int(d) for d in dims.group(1).split(",") if d) if dims else (),
        tuple_out=kind.startswith("("),
        operands=tuple(_OPERAND.findall(operands)),
        computation=computation,
        root=root,
        attrs=operands if opcode == "parameter" else rest[close + 1 :],
    )


def _line(frame: str) -> str:
    """``/path/models.py:35 (mlp)`` → ``models.py:35``."""
    return frame.split(" ", 1)[0].rsplit("/", 1)[-1]


@dataclass(frozen=True, slots=True)
class Contraction:
    """An instruction of the compiled program that sums products: a ``dot``, a cuBLAS call, or
    the ``reduce`` of a dot XLA rewrote as a multiply and a reduce. ``terms``: how many
    products each device sums into each element of its result; ``backward``: whether JAX made
    it in a transpose (a training step's backward pass); ``batched``: whether it has batch
    dimensions (``None``: not known)."""

    name: str
    terms: int
    source: str
    backward: bool = False
    batched: bool | None = None


def contractions(module: Module) -> Iterator[Contraction]:
    """Every contraction of ``module`` whose user code line is known."""
    for instr in module.instrs.values():
        if instr.opcode not in ("dot", "custom-call", "reduce") or not instr.operands:
            continue
        lhs = module.instrs.get(instr.operands[0])
        source = module.source(instr)
        if lhs is None or not source:
            continue
        batched: bool | None = None
        if instr.opcode == "dot":
            dims = instr.ints("lhs_contracting_dims")
            batched = bool(instr.ints("lhs_batch_dims"))
        elif instr.opcode == "custom-call" and "lhs_contracting_dimensions" in instr.attrs:
            listed = re.search(r'"lhs_contracting_dimensions":\[([^\]]*)\]', instr.attrs)
            dims = tuple(int(d) for d in re.findall(r"\d+", listed.group(1))) if listed else ()
        elif (
            instr.opcode == "reduce"
            and instr.op_name.rsplit("/", 1)[-1] == "dot_general"
            and module.combiner(instr) == "add"
        ):
            dims = instr.ints("dimensions")
        else:
            continue
        if dims and all(d < len(lhs.dims) for d in dims):
            terms = math.prod(lhs.dims[d] for d in dims)
            if terms > 0:  # (an empty contraction sums nothing)
                yield Contraction(instr.name, terms, source, "transpose(" in instr.op_name,
                                  batched)  # fmt: skip


def sums(
    module: Module, mesh: Mapping[str, int], kinds: frozenset[str]
) -> dict[str, frozenset[str]]:
    """The collectives of ``kinds`` (``all-reduce``, …; their ``-start`` too), by name, with
    the mesh axes each spans (every axis where its device groups cannot be read)."""
    found = {}
    for instr in module.instrs.values():
        kind = instr.opcode.removesuffix("-start")
        if kind not in kinds:
            continue
        groups = collective_groups(kind, instr.attrs, math.prod(mesh.values()))
        found[instr.name] = frozenset(axes_of_groups(groups, dict(mesh)) if groups else mesh)
    return found


State = tuple[str, frozenset[str], int, tuple[int, ...]]
"""A value on the walk: the instruction, the mesh axes summed over so far, the factor by which
local sums (a ``reduce`` with ``add``) have grown the terms, and, where the value is a tuple,
the path to the element that holds the partial sum (``()``: the value itself)."""

MAX_STEPS = 200_000
"""A walk longer than this gives up (finds nothing): the check never refuses what it cannot
read to the end."""


def unsummed_use(
    module: Module,
    start: str,
    sums: Mapping[str, frozenset[str]],
    enough: Callable[[frozenset[str], int], bool],
) -> tuple[Instr, frozenset[str]] | None:
    """The first op that uses what ``start`` computes whole (a non-linear op, or the program's
    result) while ``enough(axes, factor)`` is false of the sums on the way there, with those
    axes; ``None`` if every use is covered. ``sums``: the collectives that sum, by name, with
    the mesh axes each sums over.

    >>> module = parse('''ENTRY %main (a: f32[4,4], b: f32[4,4]) -> f32[4,4] {
    ...   %a = f32[4,4]{1,0} parameter(0)
    ...   %b = f32[4,4]{1,0} parameter(1)
    ...   %d = f32[4,4]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
    ...   %t = f32[4,4]{1,0} transpose(%d), dimensions={1,0}
    ...   ROOT %e = f32[4,4]{1,0} tanh(%t)
    ... }''')
    >>> use, axes = unsummed_use(module, "d", {}, lambda axes, factor: False)
    >>> use.opcode, sorted(axes)
    ('tanh', [])
    """
    todo: list[State] = [(start, frozenset(), 1, ())]
    seen: set[State] = set()
    while todo and len(seen) < MAX_STEPS:
        state = todo.pop()
        if state in seen or enough(state[1], state[2]):
            continue
        seen.add(state)
        for step in _steps(module, state, sums):
            if isinstance(step, Instr):
                return step, state[1]
            todo.append(step)
    return None


def _steps(
    module: Module, state: State, sums: Mapping[str, frozenset[str]]
) -> Iterator[State | Instr]:
    """Where the value of ``state`` goes: the states it flows into, or an :class:`Instr` that
    uses it whole."""
    name, axes, factor, path = state
    instr = module.instrs[name]
    if instr.root:
        if instr.computation == module.entry:
            yield instr  # the program returns it
        for caller, role in module.callers.get(instr.computation, ()):
            if role != "condition":
                yield (caller, axes, factor, path)
            if role == "body":  # and round the loop again
                yield (module.params[instr.computation][0], axes, factor, path)
    for user, k in module.users.get(name, ()):
        u = module.instrs[user]
        if u.opcode == "tuple":
            yield (user, axes, factor, (k, *path))
        elif u.opcode == "get-tuple-element":
            index = re.search(r"\bindex=(\d+)", u.attrs)
            if not path or (index and int(index.group(1)) == path[0]):
                yield (user, axes, factor, path[1:])
        elif _whole(module, u, k) and not path:
            yield u
        elif user in module.callees:
            yield from _into(module, u, k, state)
        elif user in sums:
            yield (user, axes | sums[user], factor, (k,) if u.tuple_out else ())
        elif u.opcode == "reduce" and k < len(u.operands) // 2:
            extra = math.prod(instr.dims[d] for d in u.ints("dimensions") if d < len(instr.dims))
            yield (user, axes, factor * extra, ())
        else:
            yield (user, axes, factor, (k,) if u.tuple_out and len(u.operands) > 1 else ())


def _whole(module: Module, u: Instr, k: int) -> bool:
    """Whether ``u`` needs its operand ``k`` whole."""
    if u.opcode in NONLINEAR or _WHOLE_OPERAND.get(u.opcode) == k:
        return True
    if u.opcode in ("reduce", "reduce-window", "all-reduce", "all-reduce-start", "reduce-scatter"):
        return module.combiner(u) not in ("add", "or", "")  # (booleans are summed with `or`)
    return u.opcode in _INDICES_FROM and k >= _INDICES_FROM[u.opcode]


def _into(module: Module, u: Instr, k: int, state: State) -> Iterator[State]:
    """A value passed as operand ``k`` of ``u`` into the computations ``u`` calls."""
    _, axes, factor, path = state
    called = module.callees[u.name]
    for n, (role, computation) in enumerate(called):
        params = module.params.get(computation, {})
        if role in ("body", "condition"):
            target = params.get(0)
        elif role == "branch" or role.endswith("_computation"):
            branch = (
                n if role == "branch" else ("true_computation", "false_computation").index(role)
            )
            target = params.get(0) if k == branch + 1 else None
        else:
            target = params.get(k)
        if target is not None:
            yield (target, axes, factor, path)
