"""Layouts by path, as EasyDeL and many training scripts write them: ordered ``(regex, spec)``
rules where the first regex that ``re.search`` finds in an array's path gives its layout.

:func:`path_rules` finds short rules that give every path exactly its spec: each rule
matches the path's last components (``(?:^|/)kernel$``, or with every run of digits
generalised, ``(?:^|/)layers_\\d+/kernel$``) and is kept only where every path it matches
has the spec it gives, so the rules hold in any order; the spec that would take the most
rules is given by a last ``.*``. The rules are checked by applying them again. Pure.

>>> paths = ["params/layers_0/w", "params/layers_1/w", "params/layers_0/b", "x"]
>>> specs = [Spec.parse(s) for s in ("-,model", "-,model", "-", "data")]
>>> [(regex, spec.describe()) for regex, spec in path_rules(paths, specs)]
[('(?:^|/)b$', 'replicated'), ('(?:^|/)x$', 'data'), ('.*', '-,model')]
"""

from __future__ import annotations

import heapq
import re
from collections import Counter
from collections.abc import Sequence

from shardwise._errors import ArgumentError
from shardwise._model.spec import Spec

Part = tuple[str | None, ...]
"""A path component cut at its runs of digits, each run ``None`` (generalised)."""
Key = tuple[str, int, tuple[object, ...]]
"""What one candidate rule matches: its kind (``exact``, ``general`` or ``whole``), how many
of the path's last components, and those components (cut as :data:`Part` where general)."""

ANY = ".*"
"""The last rule: every path no earlier rule matched."""


def _general(component: str) -> Part:
    """``"layers_12"`` → ``("layers_", None, "")``: the runs of digits generalised."""
    return tuple(None if k % 2 else s for k, s in enumerate(re.split(r"(\d+)", component)))


def _keys(parts: Sequence[str]) -> list[Key]:
    """The candidate rules that match a path of these components, shortest first."""
    keys: list[Key] = []
    for n in range(1, len(parts) + 1):
        tail = tuple(parts[-n:])
        keys.append(("exact", n, tail))
        if any(re.search(r"\d", c) for c in tail):
            keys.append(("general", n, tuple(_general(c) for c in tail)))
    keys.append(("whole", len(parts), tuple(parts)))
    return keys


def _regex(key: Key) -> str:
    kind, _, tail = key
    parts = [
        "".join(r"\d+" if s is None else re.escape(s) for s in c)
        if isinstance(c, tuple)
        else re.escape(str(c))
        for c in tail
    ]
    return ("^" if kind == "whole" else "(?:^|/)") + "/".join(parts) + "$"


def _cover(leaves: set[int], candidates: dict[Key, set[int]]) -> list[tuple[Key, set[int]]]:
    """Few candidates that together match every one of ``leaves``, greedily: the one that
    matches the most not yet matched (the shorter on a tie). What a candidate adds only
    shrinks as others are taken, so each is re-counted only when it comes to the top."""

    def rank(key: Key, hits: set[int]) -> tuple[int, int, bool, str]:
        return (-len(hits), key[1], key[0] != "exact", _regex(key))

    heap = [(rank(key, hits), key) for key, hits in candidates.items()]
    heapq.heapify(heap)
    left, chosen = set(leaves), []
    while left:
        _, key = heapq.heappop(heap)
        hits = candidates[key] & left
        now = rank(key, hits)
        if hits and (not heap or now <= heap[0][0]):
            chosen.append((key, hits))
            left -= hits
        elif hits:
            heapq.heappush(heap, (now, key))
    return chosen


def path_rules(paths: Sequence[str], specs: Sequence[Spec]) -> tuple[tuple[str, Spec], ...]:
    """Ordered ``(regex, spec)`` rules under which the first regex found (``re.search``) in
    each of ``paths`` (components joined with ``/``) gives it its spec in ``specs``."""
    wanted = [s.canonical() for s in specs]
    twice = sorted(p for p, n in Counter(paths).items() if n > 1)
    if twice:
        raise ArgumentError(
            f"two arrays have the path {twice[0]!r}, so rules by path cannot tell them apart; "
            "give the pytree's keys distinct names (a key holding '/' reads as two)."
        )
    matches: dict[Key, set[int]] = {}
    for k, path in enumerate(paths):
        for key in _keys(path.split("/")):
            matches.setdefault(key, set()).add(k)
    groups: dict[Spec, set[int]] = {}
    for k, spec in enumerate(wanted):
        groups.setdefault(spec, set()).add(k)
    own: dict[Spec, dict[Key, set[int]]] = {spec: {} for spec in groups}
    for key, hits in matches.items():
        alike = {wanted[k] for k in hits}
        if len(alike) == 1:  # a rule that gives every path it matches its spec
            own[alike.pop()][key] = hits
    covers = {spec: _cover(leaves, own[spec]) for spec, leaves in groups.items()}
    rest = max(  # the spec whose rules ``.*`` saves (on a tie: the most paths; not split)
        groups, key=lambda s: (len(covers[s]), len(groups[s]), not s.entries), default=None
    )
    rules = sorted(
        ((min(hits), _regex(key), spec) for spec, cover in covers.items() if spec != rest
         for key, hits in cover),
    )  # fmt: skip
    out = tuple((regex, spec) for _, regex, spec in rules)
    out += ((ANY, rest),) if rest is not None else ()
    for path, spec in zip(paths, wanted, strict=True):  # they hold: checked as they are used
        given = next(s for regex, s in out if re.search(regex, path))
        assert given == spec, (path, given, spec)
    return out
