"""Partition specs and index layouts, parsed once into frozen values.

A :class:`Spec` says, for each dimension of one operand, which mesh axes split
it: written as the tutorial does (``P('devices')``, ``None``, ``P('x', 'y')``)
or as text (``"x,y"``, ``"-,x"``, ``"(x,y),None"``, ``""`` for replicated).

A :class:`Layout` says which mesh axes split each einsum index (``"n=x,d=y"``);
every operand's spec follows from it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeAlias

from jax.sharding import PartitionSpec

from shardwise._errors import ArgumentTypeError, IndivisibleError, SpecError, did_you_mean
from shardwise._model.mesh import MeshSpec

Entry: TypeAlias = tuple[str, ...]
"""Mesh axes that split one dimension, major to minor; ``()`` means unsharded."""

SpecLike: TypeAlias = "Spec | PartitionSpec | str | Sequence[str | Sequence[str] | None] | None"
LayoutLike: TypeAlias = "Layout | str | Mapping[str, str | Sequence[str] | None]"

_UNSHARDED = {"none", "-", ""}


def _entry(value: object, where: str) -> Entry:
    if value is None:
        return ()
    if isinstance(value, str):
        text = value.strip().strip("'\"")
        if text.lower() in _UNSHARDED:
            return ()
        if text.startswith("(") and text.endswith(")"):
            return tuple(a for part in text[1:-1].split(",") for a in _entry(part, where))
        if not text.isidentifier():
            raise SpecError(
                f"cannot read {where}: {value!r} is not a mesh axis name. Write an axis name, "
                "None, '' or - for an unsharded dimension, or (x,y) for one dimension over two "
                "axes."
            )
        return (text,)
    if isinstance(value, Sequence):
        return tuple(a for item in value for a in _entry(item, where))
    raise SpecError(
        f"cannot read {where}: {value!r} is neither an axis name, None, nor a tuple of axis names."
    )


def _split_top(text: str) -> list[str]:
    """Split at commas that are not inside parentheses."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    if depth != 0:
        raise SpecError(f"cannot read spec {text!r}: its parentheses do not match.")
    return parts


@dataclass(frozen=True, slots=True)
class Spec:
    """Which mesh axes split each dimension of one operand.

    Shorter than the operand's rank means the remaining dimensions are unsharded.

    >>> Spec.parse("(x,y),-")
    Spec(entries=(('x', 'y'), ()))
    >>> Spec.parse(None).describe()
    'replicated'
    >>> Spec.parse("x,y").to_json(3)
    ['x', 'y', None]
    """

    entries: tuple[Entry, ...] = ()

    @classmethod
    def parse(cls, value: SpecLike, where: str = "spec") -> Spec:
        """Read a spec from a ``PartitionSpec``, ``None``, text, or a sequence of entries."""
        if isinstance(value, Spec):
            return value
        if value is None:
            return cls(())
        if isinstance(value, PartitionSpec):
            return cls(tuple(_entry(e, where) for e in value))
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("P(") and text.endswith(")"):
                text = text[2:-1]
            if text.lower() in _UNSHARDED or text.lower() == "replicated":  # (as reports say)
                return cls(())
            return cls(tuple(_entry(p, where) for p in _split_top(text)))
        if isinstance(value, Sequence):
            return cls(tuple(_entry(e, where) for e in value))
        raise ArgumentTypeError(
            f"cannot read {where}: expected a PartitionSpec, None or text like 'x,y', got "
            f"{type(value).__name__}."
        )

    def canonical(self) -> Spec:
        """Drop trailing unsharded entries, so equal layouts compare equal."""
        if not self.entries or self.entries[-1]:
            return self
        entries = list(self.entries)
        while entries and not entries[-1]:
            entries.pop()
        return Spec(tuple(entries))

    @property
    def axes(self) -> tuple[str, ...]:
        """Every mesh axis the spec uses, in order."""
        return tuple(a for e in self.entries for a in e)

    def padded(self, rank: int) -> tuple[Entry, ...]:
        """One entry per dimension of an operand of ``rank`` dimensions."""
        return self.entries + ((),) * (rank - len(self.entries))

    def to_partition_spec(self) -> PartitionSpec:
        """The JAX ``PartitionSpec``."""
        return PartitionSpec(*(None if not e else e[0] if len(e) == 1 else e for e in self.entries))

    def to_json(self, rank: int) -> list[str | list[str] | None]:
        """One entry per dimension: ``None``, an axis name, or a list of axis names."""
        return [None if not e else e[0] if len(e) == 1 else list(e) for e in self.padded(rank)]

    def describe(self) -> str:
        """Text form, e.g. ``'x,y'`` or ``'(x,y),-'``; ``'replicated'`` when nothing is split."""
        if not self.axes:
            return "replicated"
        return ",".join(
            "-" if not e else e[0] if len(e) == 1 else f"({','.join(e)})" for e in self.entries
        )

    def check_axes(self, mesh: MeshSpec, what: str) -> None:
        """Check that every axis the spec names is one of ``mesh``'s, used once.

        Raises:
            SpecError: an unknown axis (with the closest name), or an axis used twice.
        """
        sizes = mesh.shape
        used: set[str] = set()
        for axis in self.axes:
            if axis not in sizes:
                raise SpecError(
                    f"{what} has spec {self.describe()!r}, which names mesh axis {axis!r}"
                    f"{did_you_mean(axis, sizes)}, but the mesh {mesh.describe()!r} has only "
                    f"axes {', '.join(sizes)}."
                )
            if axis in used:
                raise SpecError(
                    f"{what} has spec {self.describe()!r}, which uses mesh axis {axis!r} twice; "
                    "an axis can split at most one dimension of an operand."
                )
            used.add(axis)

    def validate(self, mesh: MeshSpec, shape: Sequence[int], what: str) -> None:
        """Check the spec against a mesh and an operand shape.

        Raises:
            SpecError: an unknown axis, an axis used twice, or more entries than dimensions.
            IndivisibleError: a dimension whose size the number of its shards does not divide.
        """
        self.check_axes(mesh, what)
        if len(self.entries) > len(shape):
            raise SpecError(
                f"{what} has {len(shape)} dimension{'s' if len(shape) != 1 else ''} "
                f"(shape {tuple(shape)}), but its spec {self.describe()!r} has "
                f"{len(self.entries)} entries; give at most one entry per dimension."
            )
        for dim, (entry, size) in enumerate(zip(self.padded(len(shape)), shape, strict=True)):
            check_divisible(size, entry, mesh, f"dimension {dim} of {what}")

    def shard_shape(self, mesh: MeshSpec, shape: Sequence[int]) -> tuple[int, ...]:
        """The per-device block of an operand of ``shape`` (assumes :meth:`validate` passed)."""
        sizes = mesh.shape
        return tuple(
            n // math.prod(sizes[a] for a in entry)
            for entry, n in zip(self.padded(len(shape)), shape, strict=True)
        )


def check_divisible(size: int, entry: Entry, mesh: MeshSpec, what: str) -> None:
    """Raise :class:`IndivisibleError` unless ``size`` splits evenly over ``entry``'s axes."""
    shards = math.prod(mesh.shape[a] for a in entry)
    if size % shards == 0:
        return
    padded = -(-size // shards) * shards
    axes = " × ".join(f"{a}={mesh.shape[a]}" for a in entry)
    fits = _dividing(size, mesh)  # (only splits this mesh can make)
    mesh_hint = f", or split it over {' or '.join(fits)}" if fits else ", or leave it unsharded"
    raise IndivisibleError(
        f"{what} has size {size}, which cannot be split evenly into {shards} shards "
        f"(mesh axes {axes}). Pad it to {padded}{mesh_hint}."
    )


def _dividing(size: int, mesh: MeshSpec, most: int = 3) -> list[str]:
    """Up to ``most`` sets of ``mesh``'s axes whose shards divide ``size``, the most shards
    first (``"data × model (8 shards)"``).

    >>> _dividing(30, MeshSpec.parse("data=2,model=4")), _dividing(16, MeshSpec.parse("data=3"))
    (['data (2 shards)'], [])
    """
    axes = [a for a, n in mesh.axes if n > 1]
    found = [
        (math.prod(mesh.shape[a] for a in combo), combo)
        for k in range(1, len(axes) + 1)
        for combo in itertools.combinations(axes, k)
    ]
    fits = sorted((n, c) for n, c in found if size % n == 0)
    return [f"{' × '.join(c)} ({n} shards)" for n, c in sorted(fits, key=lambda f: -f[0])[:most]]


@dataclass(frozen=True, slots=True)
class Layout:
    """Which mesh axes split each einsum index; unnamed indices are unsharded.

    >>> lay = Layout.parse("n=x,d=y")
    >>> lay
    Layout(assignment=(('d', ('y',)), ('n', ('x',))))
    >>> lay.spec_for("nd")
    Spec(entries=(('x',), ('y',)))
    >>> Layout.parse("b=(x,y)").spec_for("bd").describe()
    '(x,y)'
    """

    assignment: tuple[tuple[str, Entry], ...] = ()

    def __post_init__(self) -> None:
        seen: dict[str, str] = {}
        for index, axes in self.assignment:
            for axis in axes:
                if axis in seen:
                    raise SpecError(
                        f"layout {self.describe()!r} gives mesh axis {axis!r} to both index "
                        f"{seen[axis]!r} and index {index!r}; an axis can split at most one index."
                    )
                seen[axis] = index

    @classmethod
    def parse(cls, value: LayoutLike) -> Layout:
        """Read ``"n=x,d=y"``, ``"b=(x,y)"``, or a dict of index → axis or axes."""
        if isinstance(value, Layout):
            return value
        pairs: Iterable[tuple[str, object]]
        if isinstance(value, Mapping):
            pairs = value.items()
        elif isinstance(value, str):
            items = []
            for part in _split_top(value.strip()) if value.strip() else []:
                index, sep, axes = part.partition("=")
                if not sep or len(index.strip()) != 1 or not index.strip().isalpha():
                    raise SpecError(
                        f"cannot read layout {value!r}: write index=axis pairs separated by "
                        "commas, e.g. 'n=x,d=y' or 'b=(x,y)', where each index is one letter of "
                        "the equation."
                    )
                items.append((index.strip(), axes))
            pairs = items
        else:
            raise ArgumentTypeError(
                f"a layout is text like 'n=x,d=y' or a dict; got {type(value).__name__}."
            )
        assignment = {}
        for index, given in pairs:
            entry = _entry(given, f"layout entry for index {index!r}")
            if index in assignment:
                raise SpecError(f"layout {value!r} names index {index!r} twice.")
            if entry:
                assignment[index] = entry
        return cls(tuple(sorted(assignment.items())))

    def axes_of(self, index: str) -> Entry:
        """The mesh axes that split ``index`` (``()`` when unsharded)."""
        for i, entry in self.assignment:  # a few pairs: a scan beats building a dict
            if i == index:
                return entry
        return ()

    def spec_for(self, indices: str) -> Spec:
        """The spec of an operand whose dimensions are ``indices``."""
        return Spec(tuple(self.axes_of(i) for i in indices)).canonical()

    def describe(self) -> str:
        """Text form, e.g. ``'d=y,n=x'``; ``'replicated'`` when nothing is split."""
        if not self.assignment:
            return "replicated"
        return ",".join(
            f"{i}={a[0]}" if len(a) == 1 else f"{i}=({','.join(a)})" for i, a in self.assignment
        )


def placements(spec: Spec, rank: int, mesh: MeshSpec, partial: tuple[str, ...] = ()) -> str:
    """Per mesh axis, in mesh order: ``S(d)`` splits dimension d, ``P(a)`` holds a partial sum
    over axis a, ``R`` replicated (the notation of PyTorch DTensor).

    >>> placements(Spec.parse("x"), 1, MeshSpec.parse("x=2,y=4"), partial=("y",))
    '(S(0), P(y))'
    """
    entries = spec.padded(rank)
    out = []
    for axis in mesh.names:
        dims = [d for d, e in enumerate(entries) if axis in e]
        out.append(f"S({dims[0]})" if dims else f"P({axis})" if axis in partial else "R")
    return "(" + ", ".join(out) + ")"


def blocks(spec: Spec, shape: Sequence[int], mesh: MeshSpec) -> list[tuple[tuple[int, int], ...]]:
    """For each device (by position in the mesh), the ``[start, stop)`` range it holds per dim.

    >>> blocks(Spec.parse("x"), (4, 3), MeshSpec.parse("x=2,y=2"))[2]
    ((2, 4), (0, 3))
    """
    sizes = mesh.shape
    names = mesh.names
    out = []
    for pos in range(mesh.size):
        coords: dict[str, int] = {}
        rest = pos
        for name in reversed(names):
            coords[name] = rest % sizes[name]
            rest //= sizes[name]
        ranges = []
        for entry, n in zip(spec.padded(len(shape)), shape, strict=True):
            block, shards = 0, 1
            for axis in entry:
                block = block * sizes[axis] + coords[axis]
                shards *= sizes[axis]
            step = n // shards
            ranges.append((block * step, (block + 1) * step))
        out.append(tuple(ranges))
    return out
