"""Random sharded einsum cases, for the property test and the slow sweep.

Draws an einsum (1–7 operands over the letters a–h: contractions, batch indices, pure
reductions, outer products, chains, indices shared by several operands), sizes, a mesh,
per-operand specs of every kind that ``jax.jit`` accepts, an output spec, a mode and a dtype,
and checks ``shardwise.einsum`` on it against NumPy (:func:`run_case`).

Two front ends draw the same cases: :func:`cases` (a hypothesis strategy, which shrinks) and
:func:`draw_case` (``random.Random``, for thousands of cases without hypothesis)::

    case = draw_case(random.Random(0))
    print(case.describe())
    outcome = run_case(case)

Importing this module does not start JAX: :func:`run_case` imports it when first called.
"""

from __future__ import annotations

import dataclasses
import math
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np

T = TypeVar("T")

LETTERS = "abcdefgh"
SIZES = (2, 4, 1, 3, 8, 16)
"""Index sizes, simplest first (hypothesis shrinks towards the first)."""
_SIZE_DRAWS = (2, 4, 1, 3, 8, 16, 2, 4, 8, 16)
"""The sizes drawn from: those that split evenly over mesh axes twice as often."""
MAX_OPERAND = 4096
"""Most elements in one operand."""
MAX_TOTAL = 2**16
"""Largest product of all index sizes (NumPy's einsum loops over all of them)."""
MESHES = ("devices=8", "devices=2", "x=2,y=4", "x=4,y=2", "x=2,y=2")
DTYPES = ("float32", "float64", "int32", "int64", "bfloat16")
INT_RANGE = (-3, 3)
SEED = 0
"""Seed of the NumPy generator that fills every case's operands."""

# ------------------------------------------------------------------------------------------
# Drawing


class Drawer(Protocol):
    """The few random choices a case is made of; one implementation per front end."""

    def pick(self, options: Sequence[T]) -> T: ...

    def integer(self, lo: int, hi: int) -> int: ...

    def chance(self, p: float) -> bool: ...


class RandomDrawer:
    """Choices from a ``random.Random``."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def pick(self, options: Sequence[T]) -> T:
        return options[self.rng.randrange(len(options))]

    def integer(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def chance(self, p: float) -> bool:
        return self.rng.random() < p


class HypothesisDrawer:
    """Choices from hypothesis's ``data`` (each shrinks towards the first option, the low
    end, and ``False``)."""

    def __init__(self, draw: Callable[..., Any]) -> None:
        from hypothesis import strategies as st

        self._draw = draw
        self._st = st

    def _uniform(self, n: int) -> int:
        # four raw bytes reduced mod n: inside a long composite draw hypothesis draws
        # st.integers(0, n - 1) far from uniformly (towards the low end, so a 25% chance came
        # out 7%), raw bytes close to uniformly; they still shrink towards 0
        return int.from_bytes(self._draw(self._st.binary(min_size=4, max_size=4)), "little") % n

    def pick(self, options: Sequence[T]) -> T:
        return options[self._uniform(len(options))]

    def integer(self, lo: int, hi: int) -> int:
        return lo + self._uniform(hi - lo + 1)

    def chance(self, p: float) -> bool:
        return self._uniform(1000) >= 1000 - round(1000 * p)


def _permute(d: Drawer, items: Sequence[T]) -> list[T]:
    rest, out = list(items), []
    while rest:
        out.append(rest.pop(d.integer(0, len(rest) - 1)))
    return out


def _sample(d: Drawer, items: Sequence[T], k: int) -> list[T]:
    return _permute(d, items)[:k]


def _subset(d: Drawer, items: Sequence[T], p: float) -> list[T]:
    return [i for i in items if d.chance(p)]


@dataclass(frozen=True, slots=True)
class Case:
    """One sharded einsum call.

    ``in_specs`` holds spec text (``"x,-,y"``, ``"(x,y),-"``) or ``None`` per operand, or is
    ``None`` itself when ``layout="auto"``; ``out_spec`` is ``"infer"``, spec text or ``None``
    (replicated).
    """

    equation: str
    shapes: tuple[tuple[int, ...], ...]
    sizes: tuple[tuple[str, int], ...]
    mesh: str
    in_specs: tuple[str | None, ...] | None
    out_spec: str | None
    layout: str | None
    mode: str
    dtype: str
    kind: str = ""
    """Which family of equation and of specs it was drawn from (for the sweep's summary)."""

    @property
    def inputs(self) -> list[str]:
        return self.equation.split("->")[0].split(",")

    @property
    def output(self) -> str:
        return self.equation.split("->")[1]

    @property
    def size_of(self) -> dict[str, int]:
        return dict(self.sizes)

    @property
    def contracted(self) -> str:
        return "".join(i for i, _ in self.sizes if i not in self.output)

    @property
    def empty(self) -> bool:
        return any(n == 0 for _, n in self.sizes)

    def kwargs(self, mesh: Any = None) -> dict[str, Any]:
        """The keyword arguments of ``shardwise.einsum`` (``mesh`` defaults to the text)."""
        out: dict[str, Any] = {"mesh": self.mesh if mesh is None else mesh}
        if self.layout is not None:
            out["layout"] = self.layout
        else:
            out["in_specs"] = list(self.in_specs) if self.in_specs is not None else None
            out["out_specs"] = self.out_spec
        out["mode"] = self.mode
        return out

    def describe(self) -> str:
        """A one-line repro (``make_arrays`` is this module's)."""
        args = ", ".join(f"{k}={v!r}" for k, v in self.kwargs().items())
        shapes = [tuple(s) for s in self.shapes]
        return (
            f"shardwise.einsum({self.equation!r}, *make_arrays({shapes!r}, {self.dtype!r}), {args})"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "equation": self.equation,
            "shapes": [list(s) for s in self.shapes],
            "mesh": self.mesh,
            "in_specs": list(self.in_specs) if self.in_specs is not None else None,
            "out_spec": self.out_spec,
            "layout": self.layout,
            "mode": self.mode,
            "dtype": self.dtype,
            "kind": self.kind,
            "repro": self.describe(),
        }


EQUATION_KINDS = (
    "matmul",
    "single",
    "batch_dot",
    "outer",
    "batched_matmul",
    "chain",
    "star",
    "contract",
    "contract",
    "contract",
    "general",
    "general",
    "general",
)


def _equation(d: Drawer) -> tuple[list[str], str, str]:
    """Operand index strings, output string, and the family drawn from."""
    letters = _permute(d, LETTERS)
    kind = d.pick(EQUATION_KINDS)
    if kind == "single":
        term = letters[: d.integer(1, 4)]
        inputs, output = [term], _subset(d, term, 0.5)
    elif kind == "matmul":
        i, k, j = letters[:3]
        inputs, output = [[i, k], [k, j]], [i, j]
    elif kind == "batch_dot":
        n, c = letters[:2]
        inputs, output = [[n, c], [n, c]], [n]
    elif kind == "outer":
        count = d.integer(2, 3)
        inputs = [letters[2 * k : 2 * k + d.integer(1, 2)] for k in range(count)]
        everything = [i for t in inputs for i in t]
        output = everything if d.chance(0.6) else _subset(d, everything, 0.6)
    elif kind == "contract":  # one index string in each operand, mostly summed away
        term = letters[: d.pick((3, 2, 4, 3))]
        inputs = [_permute(d, term) if d.chance(0.3) else term for _ in range(d.integer(2, 3))]
        output = _subset(d, term, 0.25)
    elif kind == "batched_matmul":
        b, i, k, j = letters[:4]
        inputs, output = [[b, i, k], [b, k, j]], [b, i, j]
    elif kind == "chain":
        count = d.integer(2, 7)
        chain = letters[: count + 1]
        inputs = [[chain[k], chain[k + 1]] for k in range(count)]
        output = [chain[0], chain[-1]] if d.chance(0.7) else _subset(d, chain, 0.4)
    elif kind == "star":
        count = d.integer(2, 7)
        hub, spokes = letters[0], letters[1:]
        inputs = [[hub] + ([spokes[k]] if d.chance(0.7) else []) for k in range(count)]
        used = [i for t in inputs for i in t]
        output = ([hub] if d.chance(0.5) else []) + _subset(d, [i for i in used if i != hub], 0.5)
    else:
        count = d.integer(2, 7)
        pool = letters[: d.integer(2, 8)]
        inputs = [_sample(d, pool, d.integer(1, min(3, len(pool)))) for _ in range(count)]
        used = list(dict.fromkeys(i for t in inputs for i in t))
        output = _subset(d, used, 0.5)
        spare = [i for i in letters if i not in used]
        if spare and d.chance(0.3):  # a batch index: every operand and the output
            batch = spare.pop()
            inputs = [[*t, batch] for t in inputs]
            output.append(batch)
        if spare and d.chance(0.3):  # a pure reduction: one operand, not the output
            inputs[d.integer(0, count - 1)].append(spare.pop())
    inputs = [_permute(d, t) if d.chance(0.3) else list(t) for t in inputs]
    output = list(dict.fromkeys(output))
    if d.chance(0.4):
        output = _permute(d, output)
    return ["".join(t) for t in inputs], "".join(output), kind


def _shrink(inputs: list[str], sizes: dict[str, int]) -> None:
    """Lower the largest sizes until every operand and the whole index space are small."""
    smaller = sorted(set(SIZES))
    while True:
        if math.prod(sizes.values()) > MAX_TOTAL:
            over = list(sizes)
        else:
            big = [t for t in inputs if math.prod(sizes[i] for i in t) > MAX_OPERAND]
            if not big:
                return
            over = list(big[0])
        worst = max(over, key=lambda i: sizes[i])
        sizes[worst] = max(s for s in smaller if s < sizes[worst])


def _mesh_shape(mesh: str) -> dict[str, int]:
    return {name: int(n) for name, _, n in (p.partition("=") for p in mesh.split(","))}


Entry = tuple[str, ...]


def _entries(size: int, free: Sequence[str], mesh: dict[str, int], pairs: bool) -> list[Entry]:
    """Every non-empty entry over ``free`` axes that divides ``size`` evenly."""
    out: list[Entry] = [(a,) for a in free if size % mesh[a] == 0]
    if pairs:
        out += [(a, b) for a in free for b in free if a != b and size % (mesh[a] * mesh[b]) == 0]
    return out


def _draw_entry(
    d: Drawer, size: int, free: Sequence[str], mesh: dict[str, int], p_split: float
) -> Entry:
    options = _entries(size, free, mesh, pairs=d.chance(0.3))
    if not options or not d.chance(p_split):
        return ()
    return d.pick(options)


def _draw_layout(
    d: Drawer,
    letters: Sequence[str],
    contracted: str,
    sizes: dict[str, int],
    mesh: dict[str, int],
    first: bool = False,
) -> dict[str, Entry]:
    """One index → axes map, each axis on at most one index; contracted indices first
    (so that they get split) when ``first``, else half the time."""
    order = _permute(d, letters)
    if first or d.chance(0.5):
        order = [i for i in order if i in contracted] + [i for i in order if i not in contracted]
    free = list(mesh)
    layout: dict[str, Entry] = {}
    for index in order:
        entry = _draw_entry(d, sizes[index], free, mesh, 0.9 if first else 0.75)
        if entry:
            layout[index] = entry
            free = [a for a in free if a not in entry]
    return layout


def _draw_operand(
    d: Drawer, term: str, sizes: dict[str, int], mesh: dict[str, int], p_split: float
) -> list[Entry]:
    """One operand's entries, drawn on their own (each axis at most once in the operand)."""
    free = list(mesh)
    entries: dict[str, Entry] = {}
    for index in _permute(d, term):
        entry = _draw_entry(d, sizes[index], free, mesh, p_split)
        entries[index] = entry
        free = [a for a in free if a not in entry]
    return [entries[i] for i in term]


def _move(
    d: Drawer,
    term: str,
    entries: list[Entry],
    sizes: dict[str, int],
    mesh: dict[str, int],
    contracted: str = "",
) -> list[Entry] | None:
    """The same operand with one mesh axis moved from one dimension to another (``None`` if
    no move divides evenly), most often from one contracted index to another. The other
    operands keep the axis where it was: the same axis on two indices, as in ``"x,y"``
    against ``"x,-,y"``."""
    moves = [
        (src, axis, dst)
        for src, entry in enumerate(entries)
        for axis in entry
        for dst in range(len(term))
        if dst != src
        and sizes[term[dst]] % (math.prod(mesh[a] for a in entries[dst]) * mesh[axis]) == 0
    ]
    if not moves:
        return None
    within = [
        m
        for m in moves
        if term[m[0]] in contracted and term[m[2]] in contracted and not entries[m[2]]
    ]
    src, axis, dst = d.pick(within if within and d.chance(0.7) else moves)
    out = list(entries)
    out[src] = tuple(a for a in entries[src] if a != axis)
    out[dst] = (*entries[dst], axis)
    return out


def _perturb(
    d: Drawer,
    term: str,
    entries: list[Entry],
    sizes: dict[str, int],
    mesh: dict[str, int],
    contracted: str,
    p_move: float = 0.5,
) -> list[Entry]:
    """The same operand with one mesh axis moved to another dimension (:func:`_move`, with
    chance ``p_move``), or else one dimension split another way or no longer split."""
    if d.chance(p_move):
        moved = _move(d, term, entries, sizes, mesh, contracted)
        if moved is not None:
            return moved
    dim = d.integer(0, len(term) - 1)
    others = {a for k, e in enumerate(entries) if k != dim for a in e}
    free = [a for a in mesh if a not in others]
    options = [(), *_entries(sizes[term[dim]], free, mesh, pairs=True)]
    options = [e for e in options if e != entries[dim]]
    if not options:
        return entries
    out = list(entries)
    out[dim] = d.pick(options)
    return out


def _entry_text(entry: Entry) -> str:
    return "-" if not entry else entry[0] if len(entry) == 1 else f"({','.join(entry)})"


def _spec_text(d: Drawer, entries: Sequence[Entry]) -> str | None:
    """Spec text for ``entries``: ``None`` (or a spec of dashes) when nothing is split;
    trailing unsplit dimensions are left out half the time."""
    parts = [_entry_text(e) for e in entries]
    if not any(entries):
        return ",".join(parts) if parts and d.chance(0.2) else None
    if d.chance(0.5):
        while parts and parts[-1] == "-":
            parts.pop()
    return ",".join(parts)


SPEC_KINDS = (
    "shared",
    "shared",
    "perturbed",
    "perturbed",
    "moved",
    "moved",
    "independent",
    "replicated",
)
"""How the operands' specs relate: ``shared`` follow one index layout; ``perturbed`` and
``moved`` start from one and change one or two operands (``moved``: an axis moves to another
index, with contracted indices split first); ``independent`` are drawn per operand;
``replicated`` split nothing."""


def _draw_specs(
    d: Drawer, inputs: list[str], output: str, sizes: dict[str, int], mesh: dict[str, int]
) -> tuple[list[str | None], str]:
    letters = list(dict.fromkeys("".join(inputs)))
    contracted = "".join(i for i in letters if i not in output)
    kind = d.pick(SPEC_KINDS)
    if kind == "replicated":
        per_operand = [[()] * len(t) for t in inputs]
    elif kind == "independent":
        per_operand = [_draw_operand(d, t, sizes, mesh, 0.6) for t in inputs]
    else:
        layout = _draw_layout(d, letters, contracted, sizes, mesh, first=kind == "moved")
        per_operand = [[layout.get(i, ()) for i in t] for t in inputs]
        if kind != "shared":
            p_move = 1.0 if kind == "moved" else 0.5
            count = 1 if kind == "moved" else d.integer(1, min(2, len(inputs)))
            for k in _sample(d, range(len(inputs)), count):
                per_operand[k] = _perturb(
                    d, inputs[k], per_operand[k], sizes, mesh, contracted, p_move
                )
    specs = [_spec_text(d, entries) for entries in per_operand]
    if kind not in ("replicated", "moved") and d.chance(0.3):  # some operands replicated
        specs = [None if d.chance(0.4) else s for s in specs]
    return specs, kind


def _draw_out_spec(
    d: Drawer, output: str, sizes: dict[str, int], mesh: dict[str, int]
) -> str | None:
    entries = _draw_operand(d, output, sizes, mesh, 0.5)
    return _spec_text(d, entries)


def draw_with(d: Drawer) -> Case:
    """One case, from any :class:`Drawer`."""
    inputs, output, eq_kind = _equation(d)
    letters = list(dict.fromkeys("".join(inputs)))
    sizes = {i: d.pick(_SIZE_DRAWS) for i in letters}
    _shrink(inputs, sizes)
    if d.chance(0.03):
        sizes[d.pick(letters)] = 0
    mesh_text = d.pick(MESHES)
    mesh = _mesh_shape(mesh_text)
    mode = "manual" if d.chance(0.25) else "auto"
    dtype = d.pick(DTYPES)
    equation = f"{','.join(inputs)}->{output}"
    shapes = tuple(tuple(sizes[i] for i in t) for t in inputs)
    if d.chance(0.1):
        in_specs, out_spec, layout, spec_kind = None, "infer", "auto", "layout=auto"
    else:
        specs, spec_kind = _draw_specs(d, inputs, output, sizes, mesh)
        in_specs = tuple(specs)
        out_spec = "infer" if d.chance(0.5) else _draw_out_spec(d, output, sizes, mesh)
        layout = None
    return Case(
        equation=equation,
        shapes=shapes,
        sizes=tuple(sizes.items()),
        mesh=mesh_text,
        in_specs=in_specs,
        out_spec=out_spec,
        layout=layout,
        mode=mode,
        dtype=dtype,
        kind=f"{eq_kind}/{spec_kind}",
    )


def draw_case(rng: random.Random) -> Case:
    """One case from a seeded ``random.Random``."""
    return draw_with(RandomDrawer(rng))


def cases() -> Any:
    """The hypothesis strategy of cases."""
    from hypothesis import strategies as st

    @st.composite
    def strategy(draw: Callable[..., Any]) -> Case:
        return draw_with(HypothesisDrawer(draw))

    return strategy()


# ------------------------------------------------------------------------------------------
# Expectations


def _entries_of(spec: str | None, rank: int) -> list[Entry]:
    """Spec text → one entry per dimension (the parse of ``shardwise.Spec``, without JAX)."""
    if spec is None or spec.strip().lower() in ("", "-", "none"):
        return [()] * rank
    parts, depth, start = [], 0, 0
    for k, ch in enumerate(spec):
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(spec[start:k])
            start = k + 1
    parts.append(spec[start:])
    out: list[Entry] = []
    for part in parts:
        text = part.strip().strip("()")
        out.append(tuple(a.strip() for a in text.split(",") if a.strip() not in ("", "-", "None")))
    return out + [()] * (rank - len(out))


def manual_refusal(case: Case) -> str | None:
    """Why manual mode must refuse ``case`` (``None``: it must not).

    ``"disagree"``: two operands split one index differently (replicated ``()`` against split
    counts), the rule of ``layout_from_specs`` in ``shardwise._model.plan``. ``"axis-reuse"``: the
    operands agree index by index, but their one layout gives a mesh axis to two indices.
    """
    if case.mode != "manual" or case.in_specs is None:
        return None
    found: dict[str, Entry] = {}
    for term, spec in zip(case.inputs, case.in_specs, strict=True):
        for index, entry in zip(term, _entries_of(spec, len(term)), strict=True):
            if found.setdefault(index, entry) != entry:
                return "disagree"
    owner: dict[str, str] = {}
    for index, entry in found.items():
        for axis in entry:
            if owner.setdefault(axis, index) != index:
                return "axis-reuse"
    return None


def expect_manual_refusal(case: Case) -> bool:
    """Whether manual mode must refuse ``case`` with a ``SpecError`` (see
    :func:`manual_refusal`)."""
    return manual_refusal(case) is not None


# ------------------------------------------------------------------------------------------
# Arrays and the reference


def np_dtype(name: str) -> np.dtype[Any]:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def make_arrays(
    shapes: Sequence[Sequence[int]], dtype: str, seed: int = SEED
) -> list[np.ndarray[Any, Any]]:
    """The operands: standard normal floats, or integers in :data:`INT_RANGE`."""
    rng = np.random.default_rng(seed)
    target = np_dtype(dtype)
    if dtype.startswith("int"):
        lo, hi = INT_RANGE
        return [rng.integers(lo, hi + 1, size=tuple(s)).astype(target) for s in shapes]
    return [rng.standard_normal(tuple(s)).astype(target) for s in shapes]


def arrays_of(case: Case) -> list[np.ndarray[Any, Any]]:
    return make_arrays(case.shapes, case.dtype)


@dataclass(frozen=True, slots=True)
class Reference:
    """NumPy's result (float64, or int64 for integer cases) and, for floats, the elementwise
    magnitude ``einsum(|a|, |b|, ...)`` that rounding errors scale with."""

    value: np.ndarray[Any, Any]
    magnitude: np.ndarray[Any, Any] | None
    terms: int
    operands: int


def reference(case: Case, arrays: Sequence[Any]) -> Reference:
    """The exact result: float64 for floats, int64 (exact: |values| ≤ 3, few terms) for ints."""
    terms = math.prod(case.size_of[i] for i in case.contracted)
    if case.dtype.startswith("int"):
        value = np.einsum(case.equation, *(np.asarray(a, dtype=np.int64) for a in arrays))
        return Reference(np.asarray(value), None, terms, len(arrays))
    exact = [np.asarray(a, dtype=np.float64) for a in arrays]
    value = np.einsum(case.equation, *exact)
    magnitude = np.einsum(case.equation, *(np.abs(a) for a in exact))
    return Reference(np.asarray(value), np.asarray(magnitude), terms, len(arrays))


def _eps(dtype: np.dtype[Any]) -> float:
    import ml_dtypes

    return float(ml_dtypes.finfo(dtype).eps)


def compare(ref: Reference, result: Any) -> tuple[bool, float, float]:
    """``(ok, max error, tolerance)`` of ``result`` against ``ref``.

    Integers must be exact. Floats: the bound of ``shardwise._xla.check.check_einsum``,
    ``(K + 2) * eps * einsum(|a|, ...)`` elementwise, widened by the operand count (each
    product of n operands, and each pairwise step of a many-operand einsum, rounds once
    more); ``eps`` is the result dtype's machine epsilon (bfloat16: 2**-7), so a result
    computed in a narrower dtype than asked is reported as a dtype mismatch, not twice.
    """
    got = np.asarray(result)
    if ref.value.shape != got.shape:
        return False, math.inf, 0.0
    if ref.magnitude is None:
        if not np.issubdtype(got.dtype, np.integer):
            diff = np.abs(got.astype(np.float64) - ref.value)
        else:
            diff = np.abs(got.astype(np.int64) - ref.value)
        worst = float(diff.max()) if diff.size else 0.0
        return worst == 0.0, worst, 0.0
    exact = got.astype(np.float64)
    error = np.abs(exact - ref.value)
    eps = _eps(got.dtype) if not np.issubdtype(got.dtype, np.integer) else 0.0
    bound = (ref.terms + ref.operands + 2) * eps * ref.magnitude + np.finfo(np.float64).tiny
    bad = ~(error <= bound)  # NaN counts as wrong
    worst = float(np.nanmax(np.where(np.isnan(error), np.inf, error))) if error.size else 0.0
    return not bool(bad.any()), worst, float(bound.max()) if bound.size else 0.0


# ------------------------------------------------------------------------------------------
# Running one case

PROBLEMS = {
    "refused-valid": "a valid layout was refused with a ShardwiseError",
    "auto-mode-message": "an auto-mode error talks about manual mode",
    "manual-not-refused": "manual mode accepted operands that disagree",
    "manual-refusal-message": "manual mode refused, but not with SpecError mentioning Manual mode",
    "exception": "an exception that is not a ShardwiseError",
    "wrong-result": "values differ from NumPy beyond rounding",
    "wrong-shape": "the result's shape differs from NumPy's",
    "wrong-dtype": "the result's dtype differs from the inputs'",
    "wrong-sharding": "the result is not laid out as the explicit out_spec says",
    "explain-failed": "explain_einsum raised where einsum ran",
    "collectives-unparsed": "the collectives of a compiled program could not be read",
    "unsound": "shardwise's own program fails the contraction check (a sum left out)",
    "check-missed": "raw jit returned a wrong result and the contraction check did not flag it",
    "kernel-adds-collectives": "a kernel path has more collectives or bytes than the plain einsum",
    "differs-from-jit": "operands that agree, plain einsum, yet not raw jit's collectives",
}
"""Every failure class :func:`run_case` reports, and what it means."""


@dataclass(frozen=True, slots=True)
class Raw:
    """The same einsum as plain ``jax.jit(jnp.einsum)`` with the same shardings (x64 on for
    64-bit dtypes, so the user's dtype is kept), for comparison."""

    status: str
    """``"ok"``, ``"wrong"`` (values off, as shardwise's may be), or ``"error"``."""
    message: str = ""
    max_error: float = 0.0
    collectives: tuple[Any, ...] = ()
    dtype: str = ""
    unparsed: tuple[str, ...] = ()
    """Collective lines of the compiled HLO that ``shardwise._xla.hlo.collectives`` missed."""

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "message": self.message,
            "max_error": self.max_error,
            "dtype": self.dtype,
            "collectives": [c.to_json() for c in self.collectives],
            "unparsed": list(self.unparsed),
        }


@dataclass(frozen=True)
class Outcome:
    """What happened to one case: ``problems`` empty means it passed."""

    case: Case
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    """One line per problem (and a few facts worth knowing)."""
    max_error: float | None = None
    tolerance: float | None = None
    exception: str | None = None
    """``Type: message`` of what shardwise raised, if anything."""
    result_dtype: str | None = None
    raw: Raw | None = None
    explanation: Any = field(default=None, repr=False, compare=False)
    """``shardwise.explain_einsum``'s answer (auto mode, explicit specs, non-empty)."""

    @property
    def ok(self) -> bool:
        return not self.problems

    def collectives_verdict(self) -> str | None:
        """How shardwise's collectives compare with raw jit's, where both exist."""
        if self.explanation is None or self.raw is None or self.raw.status == "error":
            return None
        ours = _signature(self.explanation.collectives)
        theirs = _signature(self.raw.collectives)
        if ours == theirs:
            return "same"
        mine = sum(c.bytes for c in self.explanation.collectives)
        raw = sum(c.bytes for c in self.raw.collectives)
        if mine < raw:
            return "fewer bytes than raw jit"
        if mine > raw:
            return "more bytes than raw jit"
        return "same bytes, other collectives"

    def report(self) -> str:
        lines = [self.case.describe(), *self.notes]
        return "\n  ".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "case": self.case.to_json(),
            "problems": list(self.problems),
            "notes": list(self.notes),
            "max_error": self.max_error,
            "tolerance": self.tolerance,
            "exception": self.exception,
            "result_dtype": self.result_dtype,
            "raw": self.raw.to_json() if self.raw is not None else None,
            "collectives": (
                [c.to_json() for c in self.explanation.collectives]
                if self.explanation is not None
                else None
            ),
            "collectives_verdict": self.collectives_verdict(),
        }


def _signature(found: Sequence[Any]) -> list[tuple[str, tuple[str, ...], int]]:
    return sorted((c.kind, tuple(c.mesh_axes), int(c.bytes)) for c in found)


_MESHES: dict[str, Any] = {}


def jax_mesh(text: str) -> Any:
    """The JAX mesh of ``text``, built once."""
    if text not in _MESHES:
        from shardwise._model.mesh import MeshSpec, build_mesh

        _MESHES[text] = build_mesh(MeshSpec.parse(text))
    return _MESHES[text]


def _short(e: BaseException, limit: int = 400) -> str:
    text = f"{type(e).__name__}: {e}"
    text = re.sub(r"\s+", " ", text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


XLA_CHOOSES = object()
"""The raw program's output spec when shardwise's inferred one is unknown: XLA's choice."""


def _run_raw(case: Case, arrays: Sequence[Any], ref: Reference, out_spec: Any) -> Raw:
    """``jax.jit(jnp.einsum)`` with the case's shardings (``out_spec``: spec text, ``None``
    for replicated, or :data:`XLA_CHOOSES`): its collectives and its result."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding

    from shardwise import Spec
    from shardwise._xla.hlo import collectives

    assert case.in_specs is not None
    mesh = jax_mesh(case.mesh)
    x64 = case.dtype in ("float64", "int64")
    in_sh = tuple(NamedSharding(mesh, Spec.parse(s).to_partition_spec()) for s in case.in_specs)
    out_sh = (
        None
        if out_spec is XLA_CHOOSES
        else NamedSharding(mesh, Spec.parse(out_spec).to_partition_spec())
    )
    equation = case.equation
    try:
        with jax.enable_x64(x64):
            fn = jax.jit(
                lambda *xs: jnp.einsum(equation, *xs), in_shardings=in_sh, out_shardings=out_sh
            )
            dtype = np_dtype(case.dtype)
            structs = [
                jax.ShapeDtypeStruct(s, dtype, sharding=sh)
                for s, sh in zip(case.shapes, in_sh, strict=True)
            ]
            compiled = fn.lower(*structs).compile()
            text = compiled.as_text() or ""
            result = np.asarray(
                compiled(*(jax.device_put(a, sh) for a, sh in zip(arrays, in_sh, strict=True)))
            )
    except Exception as e:
        return Raw("error", _short(e))
    ok, worst, _ = compare(ref, result)
    unparsed: tuple[str, ...] = ()
    try:
        found = tuple(collectives(text, _mesh_shape(case.mesh)))
    except Exception as e:
        found, unparsed = (), (_short(e),)
    names = {c.hlo_name for c in found}
    unparsed += tuple(
        line.strip()[:200]
        for line in text.splitlines()
        if (m := _COLLECTIVE_LINE.match(line)) and m.group(1) not in names
    )
    return Raw("ok" if ok else "wrong", "", worst, found, str(result.dtype), unparsed)


_COLLECTIVE_LINE = re.compile(
    r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=.*?\s(?:all-reduce|all-gather|reduce-scatter|all-to-all|"
    r"collective-permute|collective-broadcast|ragged-all-to-all)(?:-start)?\("
)
"""An HLO instruction line of any collective (those :mod:`shardwise._xla.hlo` reads, and more)."""


def run_case(case: Case, *, compare_raw: bool = True) -> Outcome:
    """Run ``case`` through ``shardwise.einsum`` and every check; never raises for a failing
    case (the failure is in the outcome's ``problems``)."""
    from jax.sharding import NamedSharding

    import shardwise
    from shardwise._xla.hlo import KINDS

    arrays = arrays_of(case)
    ref = reference(case, arrays)
    mesh = jax_mesh(case.mesh)
    refusal = manual_refusal(case)
    problems: list[str] = []
    notes: list[str] = []
    fields: dict[str, Any] = {}

    def problem(name: str, note: str) -> None:
        if name not in problems:
            problems.append(name)
        notes.append(f"{name}: {note}")

    result = None
    try:
        out = shardwise.einsum(case.equation, *arrays, **case.kwargs(mesh))
        result = np.asarray(out)
    except Exception as e:
        fields["exception"] = _short(e)
        message = str(e)
        if refusal is not None:
            if not (isinstance(e, shardwise.SpecError) and "Manual mode" in message):
                problem("manual-refusal-message", f"({refusal}) {_short(e)}")
        elif isinstance(e, shardwise.ShardwiseError):
            problem("refused-valid", _short(e))
        else:
            problem("exception", _short(e))
        if case.mode == "auto" and "Manual mode" in message:
            problem("auto-mode-message", _short(e, 160))
    if result is not None:
        if refusal is not None:
            problem("manual-not-refused", f"operands {refusal}, yet manual mode ran")
        fields["result_dtype"] = str(result.dtype)
        if str(result.dtype) != case.dtype:
            problem("wrong-dtype", f"{case.dtype} in, {result.dtype} out")
        if result.shape != ref.value.shape:
            problem("wrong-shape", f"{result.shape} != NumPy's {ref.value.shape}")
        else:
            ok, worst, tol = compare(ref, result)
            fields["max_error"], fields["tolerance"] = worst, tol
            if not ok:
                problem("wrong-result", f"max error {worst:.3g} > tolerance {tol:.3g}")
        if case.layout is None and case.out_spec != "infer":
            from shardwise import Spec

            want = NamedSharding(mesh, Spec.parse(case.out_spec).to_partition_spec())
            if not out.sharding.is_equivalent_to(want, result.ndim):
                problem("wrong-sharding", f"{out.sharding.spec} is not {want.spec}")

    explanation = None
    raw = None
    explicit = case.layout is None and case.in_specs is not None
    if case.mode == "auto" and explicit and not case.empty and result is not None:
        try:
            explanation = shardwise.explain_einsum(
                case.equation,
                case.shapes,
                mesh=mesh,
                dtype=case.dtype,
                in_specs=list(case.in_specs or ()),
                out_specs=case.out_spec,
                mode=case.mode,
            )
        except Exception as e:
            problem("explain-failed", _short(e))
    if compare_raw and case.mode == "auto" and explicit:
        out_spec: Any = case.out_spec
        if out_spec == "infer":
            out_spec = explanation.outputs[0].spec if explanation is not None else XLA_CHOOSES
        raw = _run_raw(case, arrays, ref, out_spec)
        if "wrong-result" in problems:
            notes.append(f"raw jit with the same shardings: {raw.status} {raw.message}".rstrip())
        elif raw.status == "wrong":
            notes.append(f"raw jit with the same shardings is wrong (max {raw.max_error:.3g})")
    if raw is not None and raw.unparsed:
        problem("collectives-unparsed", f"raw jit: {raw.unparsed[0]}")
    if explanation is not None:
        _check_programs(case, explanation, raw, problem, notes)
    names = set(_mesh_shape(case.mesh))
    for label, found in (
        ("shardwise", explanation.collectives if explanation is not None else ()),
        ("raw jit", raw.collectives if raw is not None else ()),
    ):
        for c in found:
            if c.kind not in KINDS or not set(c.mesh_axes) <= names or c.bytes < 0:
                problem("collectives-unparsed", f"{label}: {c}")
    return Outcome(
        case,
        tuple(problems),
        tuple(notes),
        raw=raw,
        explanation=explanation,
        **fields,
    )


def _check_programs(
    case: Case,
    expl: Any,
    raw: Raw | None,
    problem: Callable[[str, str], None],
    notes: list[str],
) -> None:
    """shardwise's compiled program against the contraction check, against its own plain
    ``jnp.einsum`` program (a kernel may add no collective), and against raw jit's (operands
    that agree and no kernel: the very same program); raw jit's program against the check."""
    import jax
    from jax.sharding import NamedSharding

    from shardwise._model.plan import Plan
    from shardwise._model.reshard import common_layout
    from shardwise._xla.check import contraction_problems
    from shardwise._xla.hlo import collectives
    from shardwise._xla.lower import _auto_kernel, lower, reorders, target_layout

    if expl.problems:
        problem("unsound", expl.problems[0])
    mesh = jax_mesh(case.mesh)
    x64 = case.dtype in ("float64", "int64")
    with jax.enable_x64(x64):
        plan = Plan.make(
            case.equation,
            case.shapes,
            mesh=case.mesh,
            dtype=np_dtype(case.dtype),
            in_specs=list(case.in_specs or ()),
            out_specs=case.out_spec,
        )
        target = target_layout(plan, "cpu")
        kernel = _auto_kernel(plan, mesh, target)
        ours = _signature(expl.collectives)
        if kernel != "einsum":
            structs = [
                jax.ShapeDtypeStruct(
                    shape,
                    np_dtype(case.dtype),
                    sharding=NamedSharding(mesh, spec.to_partition_spec()),
                )
                for shape, spec in zip(plan.shapes, plan.in_specs, strict=True)
            ]
            plain = lower(plan, mesh, kernels=False).lower(*structs).compile()
            theirs = collectives(plain.as_text() or "", plan.mesh.shape)
            mine = (len(ours), sum(c[2] for c in ours))
            other = (len(theirs), sum(c.bytes for c in theirs))
            if mine[0] > other[0] or mine[1] > other[1]:
                problem(
                    "kernel-adds-collectives",
                    f"{kernel}: {mine[0]} collectives, {mine[1]} B; jnp.einsum: {other[0]}, "
                    f"{other[1]} B",
                )
    if raw is None or raw.status == "error":
        return
    flagged = contraction_problems(plan, raw.collectives)
    # XLA's misordered blocks (a summed result moved in the same step): shardwise makes the
    # result in the operands' layout and moves it after, so its program differs, and the
    # check, which reads sums only, is not what catches raw jit's (see docs/guide/trust.md)
    avoided = plan.mode == "auto" and reorders(plan, target_layout(plan))
    if raw.status == "wrong" and not flagged and not avoided:
        problem("check-missed", f"raw jit wrong by {raw.max_error:.3g}, check silent")
    if raw.status == "ok" and flagged:
        notes.append(f"the check flags raw jit's right program: {flagged[0][:120]}")
    agree = common_layout(plan.op, plan.in_specs) is not None
    if agree and kernel == "einsum" and not avoided and ours != _signature(raw.collectives):
        problem("differs-from-jit", f"{ours} != raw jit's {_signature(raw.collectives)}")


def with_changes(case: Case, **changes: Any) -> Case:
    """``case`` with some fields replaced (for minimizing a repro by hand)."""
    return dataclasses.replace(case, **changes)
