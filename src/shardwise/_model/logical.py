"""Logical axis rules, as Flax and MaxText take them: how logical names (``"embed"``,
``"mlp"``, ``"batch"``) resolve to mesh axes, and the rules that reproduce a plan.

A rule is ``(logical name, mesh axes)``: one axis (``"model"``), several (``("data",
"fsdp")``) or ``None`` (not split). Rules are ordered, and a name may have several:

- **Linen** (``nn.logical_to_mesh_axes``, ``nn.with_logical_constraint``, MaxText): for each
  rule in order, a dimension of that name takes the rule's axes if it has none yet and no
  other dimension of the array took them; a name no rule gave stays unsplit. A second rule
  for a name is a fallback for arrays where the first one's axes are taken.
- **NNX** (``nnx.get_partition_spec`` of variables annotated with ``nnx.with_partitioning``):
  the last rule of a name wins, whatever the other dimensions took.

:func:`rules_for` goes the other way: from a plan's layouts of named arrays to the rules, each
array checked by resolving it again. Where no rules give every array its layout, the arrays
that disagree come back as :class:`Conflict` s, never resolved silently. Pure: no JAX.

>>> rules = (("batch", "data"), ("embed", "data"), ("mlp", "model"))
>>> resolve(("batch", "embed"), rules), resolve(("embed", "mlp"), rules)
((('data',), ()), (('data',), ('model',)))
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, TypeAlias

from shardwise._errors import ArgumentError
from shardwise._model.maxtext import maxtext_config, undefined
from shardwise._model.mesh import MeshSpec

Axes: TypeAlias = "str | tuple[str, ...] | None"
"""A rule's mesh axes, as Flax writes them: one name, a tuple of names, or ``None``."""
Rule: TypeAlias = "tuple[str, Axes]"
Entry: TypeAlias = tuple[str, ...]
"""The mesh axes that split one dimension (``()``: not split), as :class:`~shardwise._model.
spec.Spec` keeps them."""
Style: TypeAlias = Literal["linen", "nnx"]


def entry(axes: Axes) -> Entry:
    """A rule's axes as an entry: ``None`` → ``()``, ``"x"`` → ``("x",)``."""
    if axes is None:
        return ()
    return (axes,) if isinstance(axes, str) else tuple(axes)


def axes_of(e: Entry) -> Axes:
    """An entry as Flax writes a rule's axes: ``()`` → ``None``, ``("x",)`` → ``"x"``."""
    return None if not e else e[0] if len(e) == 1 else tuple(e)


def check_rules(rules: object, where: str = "rules") -> tuple[Rule, ...]:
    """``rules`` read as Flax's ``LogicalRules``: pairs of a name and mesh axes."""
    if isinstance(rules, str) or not isinstance(rules, Sequence):
        raise ArgumentError(
            f"{where} must be a sequence of (logical name, mesh axes) pairs, as Flax's "
            f"nn.logical_axis_rules takes, e.g. [('batch', 'data'), ('mlp', 'model')]; got "
            f"{type(rules).__name__}."
        )
    out: list[Rule] = []
    for k, rule in enumerate(rules):
        ok = isinstance(rule, Sequence) and not isinstance(rule, str) and len(rule) == 2
        axes = rule[1] if ok else None
        ok = ok and isinstance(rule[0], str)
        ok = ok and (
            axes is None
            or isinstance(axes, str)
            or (isinstance(axes, Sequence) and all(isinstance(a, str) for a in axes))
        )
        if not ok:
            raise ArgumentError(
                f"{where}[{k}] is {rule!r}; each rule is a pair (logical name, mesh axes), the "
                "axes a name, a tuple of names or None, e.g. ('mlp', 'model')."
            )
        out.append((rule[0], axes if axes is None or isinstance(axes, str) else tuple(axes)))
    return tuple(out)


def resolve(
    names: Sequence[str | None], rules: Sequence[Rule], style: Style = "linen"
) -> tuple[Entry, ...]:
    """Each dimension's mesh axes, as Flax resolves ``names`` under ``rules``.

    >>> resolve(("embed", "mlp"), (("mlp", "model"), ("embed", "model")))
    ((), ('model',))
    >>> resolve(("embed", "mlp"), (("mlp", "model"), ("embed", "model")), style="nnx")
    (('model',), ('model',))
    """
    if style == "nnx":
        last = {name: entry(axes) for name, axes in rules}
        return tuple(last.get(n, ()) if n is not None else () for n in names)
    dups = sorted({n for n in names if n is not None and names.count(n) > 1})
    if dups:
        raise ArgumentError(f"the names {tuple(names)} give {dups[0]!r} to two dimensions.")
    got: list[Entry | None] = [None] * len(names)
    for name, axes in rules:
        if name not in names:
            continue
        pos, want = names.index(name), entry(axes)
        taken = {a for e in got if e for a in e}
        if got[pos] is None and not taken.intersection(want):
            got[pos] = want
    return tuple(e or () for e in got)


@dataclass(frozen=True, slots=True)
class Named:
    """One array a plan lays out whose dimensions carry logical names.

    Attributes:
        what: how the report names it (``params['Dense_0']['kernel']``, or an op's line for
            an activation under a logical constraint).
        names: each dimension's logical name (``None``: not named).
        layout: each dimension's mesh axes in the plan.
        style: how its names resolve (an NNX variable's, or Linen's).
    """

    what: str
    names: tuple[str | None, ...]
    layout: tuple[Entry, ...]
    style: Style = "linen"


@dataclass(frozen=True, slots=True)
class Conflict:
    """A logical name the plan lays out two ways that no rules reconcile.

    Attributes:
        name: the logical name (``None``: a dimension with no name that the plan splits).
        wants: each layout the plan gives it, with the arrays that have that layout.
    """

    name: str | None
    wants: tuple[tuple[Entry, tuple[str, ...]], ...]

    def describe(self) -> str:
        """In words, with what to do."""
        ways = "; ".join(
            f"{axes_text(e)} in {', '.join(whats[:3])}{' …' if len(whats) > 3 else ''}"
            for e, whats in ((e, _once(whats)) for e, whats in self.wants)
        )
        if self.name is None:
            return (
                f"a dimension with no logical name is split: {ways}. Name it in the model's "
                "annotation, or pin that array with fixed=."
            )
        return (
            f"{self.name!r} is laid out {len(self.wants)} ways: {ways}. Give those arrays "
            f"different logical names (e.g. {self.name}_a, {self.name}_b), or pin one layout "
            "with fixed=."
        )


def _once(whats: Sequence[str]) -> list[str]:
    """``whats`` with each array named once: a parameter Flax constrains where it unboxes it
    is the parameter again, at a line (``w``, ``w (model.py:91)``).

    >>> _once(["w", "w (m.py:9)", "x (m.py:3)"])
    ['w', 'x (m.py:3)']
    """
    seen: dict[str, str] = {}
    for w in whats:
        seen.setdefault(w.split(" (", 1)[0], w)
    return list(seen.values())


def axes_text(e: Entry) -> str:
    """An entry in words: ``"not split"``, or ``"on data×model"``."""
    return "not split" if not e else f"on {'×'.join(e)}"


@dataclass(frozen=True, slots=True)
class LogicalRules:
    """The rules that reproduce a plan's layouts of named arrays, and what they cannot.

    Attributes:
        rules: ordered ``(logical name, mesh axes)`` pairs, as Flax's ``LogicalRules``.
        conflicts: names the plan lays out in ways no rules give (empty: the rules
            reproduce every named array's layout exactly).
        arrays: the named arrays the rules were made from.
    """

    rules: tuple[Rule, ...]
    conflicts: tuple[Conflict, ...]
    arrays: tuple[Named, ...]

    @property
    def exact(self) -> bool:
        """Whether the rules give every named array exactly its layout in the plan."""
        return not self.conflicts

    def to_flax(self) -> tuple[Rule, ...]:
        """The rules as Flax's ``LogicalRules``, for ``nn.logical_axis_rules(...)``."""
        return self.rules

    @property
    def not_in_maxtext(self) -> tuple[str, ...]:
        """The rules' logical names that MaxText's ``base.yml`` does not define."""
        return undefined([name for name, _ in self.rules])

    def to_maxtext(self, mesh: MeshSpec | str, rename: Mapping[str, str] | None = None) -> str:
        """The rules and ``mesh`` as a block of MaxText's YAML config: ``logical_axis_rules``
        (replacing base.yml's: ``override_logical_axis_rules: true``), ``mesh_axes`` and the
        ``ici_*_parallelism`` sizes; comment lines name the logical names MaxText does not
        define and each conflict. ``rename`` maps the mesh's axes to MaxText's (``{"model":
        "tensor"}``); an axis MaxText does not know is an :class:`ArgumentError`.

        >>> made = rules_for([Named("w", ("embed", "mlp"), ((), ("tensor",)))])
        >>> print(made.to_maxtext("tensor=4").splitlines()[5])
          ['embed', []],
        """
        if not self.arrays:
            raise ArgumentError(
                "no array of the plan carries logical names, so there are no rules to write "
                "for MaxText; annotate the parameters (nn.with_logical_partitioning, "
                "nnx.with_partitioning), or write the plan as path rules: ProgramPlan.to_regex()."
            )
        notes = [f"conflict: {c.describe()}" for c in self.conflicts]
        spec = mesh if isinstance(mesh, MeshSpec) else MeshSpec.parse(mesh)
        written = [(name, entry(axes)) for name, axes in self.rules]
        return maxtext_config(written, spec, notes, rename)


def _wanted(arrays: Sequence[Named]) -> dict[str | None, dict[Entry, list[str]]]:
    """Each logical name's layouts in the plan, with the arrays that have each."""
    wants: dict[str | None, dict[Entry, list[str]]] = {}
    for a in arrays:
        for name, e in zip(a.names, a.layout, strict=True):
            if name is None and not e:
                continue
            wants.setdefault(name, {}).setdefault(e, [])
            if a.what not in wants[name][e]:
                wants[name][e].append(a.what)
    return wants


def _order(wants: dict[str | None, dict[Entry, list[str]]]) -> list[Rule]:
    """The rules to try, in order: first the names laid out one way (their rule, ``None``
    included), then each name laid out several ways, its split layouts only (the most arrays
    first): under Linen's resolution a later rule reaches a dimension only where the earlier
    rules left its axes free, so ``("batch", "data")`` before ``("embed", "data")`` splits a
    weight's ``embed`` on ``data`` and leaves an activation's whole beside its batch."""
    one: list[Rule] = []
    several: list[Rule] = []
    for name, by in wants.items():
        if name is None:
            continue
        ranked = sorted(by.items(), key=lambda kv: -len(kv[1]))
        if len(ranked) == 1:
            one.append((name, axes_of(ranked[0][0])))
        else:
            several.extend((name, axes_of(e)) for e, _ in ranked if e)
    return one + several


def rules_for(arrays: Sequence[Named]) -> LogicalRules:
    """The rules that give each of ``arrays`` its layout, checked by resolving each again;
    the names no rules reconcile come back as conflicts (their rules kept as tried).

    >>> up = Named("w1", ("embed", "mlp"), ((), ("model",)))
    >>> down = Named("w2", ("mlp", "embed"), (("model",), ()))
    >>> act = Named("h", ("batch", "mlp"), (("data",), ("model",)))
    >>> rules_for([up, down, act]).rules
    (('embed', None), ('mlp', 'model'), ('batch', 'data'))
    >>> fsdp = [Named("w", ("embed", "mlp"), (("data",), ())),
    ...         Named("x", ("batch", "embed"), (("data",), ()))]
    >>> rules_for(fsdp).rules, rules_for(fsdp).exact
    ((('mlp', None), ('batch', 'data'), ('embed', 'data')), True)
    >>> clash = rules_for([Named("a", ("embed",), (("model",),)), Named("b", ("embed",), ((),))])
    >>> clash.exact, clash.conflicts[0].wants
    (False, ((('model',), ('a',)), ((), ('b',))))
    """
    wants = _wanted(arrays)
    rules = _no_axis_twice(list(_order(wants)), wants, [a for a in arrays if a.style == "nnx"])
    wrong: set[str | None] = set()
    for a in arrays:
        got = resolve(a.names, rules, a.style)
        wrong.update(
            n for n, want, have in zip(a.names, a.layout, got, strict=True) if want != have
        )
    conflicts = tuple(
        Conflict(name, tuple((e, tuple(whats)) for e, whats in wants[name].items()))
        for name in wants
        if name in wrong
    )
    return LogicalRules(rules=rules, conflicts=conflicts, arrays=tuple(arrays))


def _no_axis_twice(
    rules: list[Rule], wants: dict[str | None, dict[Entry, list[str]]], nnx: Sequence[Named]
) -> tuple[Rule, ...]:
    """``rules`` where no NNX array (``nnx``) resolves to a mesh axis on two of its
    dimensions: NNX takes each name's last rule whatever the other dimensions took, and Flax
    raises ``DuplicateSpecError`` for such a spec. So a name the plan lays out several ways
    (its rules cannot be exact) keeps one rule, the one NNX would take: its layout with the
    most arrays that puts no axis twice, or none (not split).

    >>> up = Named("up", ("embed", "mlp"), ((), ("data", "model")), "nnx")
    >>> biases = [Named(b, ("embed",), (("model",),), "nnx") for b in ("b1", "b2")]
    >>> rules_for([up, *biases]).rules  # (("embed", "model") puts model twice in up)
    (('mlp', ('data', 'model')), ('embed', None))
    >>> kernels = [Named(w, ("mlp",), (("data", "model"),), "nnx") for w in ("w1", "w2")]
    >>> rules_for([Named("b", ("mlp",), (("data",),), "nnx"), *kernels]).rules
    (('mlp', ('data', 'model')),)
    """
    for name, by in wants.items():
        if name is None or len(by) < 2:
            continue
        holding = [a for a in nnx if name in a.names]
        if not holding:
            continue
        for e, _ in sorted(by.items(), key=lambda kv: -len(kv[1])):
            rules = [r for r in rules if r[0] != name] + [(name, axes_of(e))]
            if not any(_axis_twice(resolve(a.names, rules, "nnx")) for a in holding):
                break
        else:
            rules = [r for r in rules if r[0] != name] + [(name, None)]
    return tuple(rules)


def _axis_twice(entries: Sequence[Entry]) -> bool:
    """Whether a mesh axis splits two of ``entries``."""
    axes = [a for e in entries for a in e]
    return len(axes) != len(set(axes))
