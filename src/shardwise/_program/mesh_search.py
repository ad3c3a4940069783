"""Choose the mesh: split a number of devices over named roles and plan each split.

The roles are mesh axis names (``data``, ``fsdp``, ``tensor``, ...): each candidate is an
ordered factorisation of the devices, one size per role, and the planner's own search lays
every array out over those axes. The planner gives a role no meaning of its own: ``data`` and
``fsdp`` are both just axes, and whether an axis ends up splitting only the batch (data
parallelism) or the weights too (FSDP) is the search's choice, by cost. The names matter for
the report, where each becomes MaxText's ``ici_<role>_parallelism``.

Candidates are pruned before planning (too many ways of tensor parallelism, a batch or heads
that a role's size does not divide) and, past a cap, ranked by the scaling book's closed form
for mixed FSDP × tensor parallelism (:func:`~shardwise._model.scaling.optimal_fsdp`): the
ones whose batch-splitting ways are furthest from the book's optimum are left out, and the
result says which and why.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shardwise._errors import ArgumentError, ArgumentTypeError, did_you_mean
from shardwise._model.mesh import MeshSpec
from shardwise._model.profile import Profile
from shardwise._model.profile_files import load_profile
from shardwise._model.scaling import optimal_fsdp
from shardwise._program.plans import ProgramPlan
from shardwise._program.program import plan
from shardwise._program.splits import (
    BATCH_ROLES,
    MAX_TENSOR,
    ROLES,
    factorisations,
    idle,
    mesh_text,
    most_usable,
    why_not,
)

MAX_PLANNED = 24
"""Most candidates planned by default (a plan of Llama-3 8B on 256 devices takes 1-3 s)."""


@dataclass(frozen=True, slots=True)
class Candidate:
    """One split of the devices over the roles.

    Attributes:
        sizes: the ways of each role, in the roles' order (of a mesh given in ``also``: of
            each of its ``axes``).
        mesh: the mesh text (roles of size 1 left out), e.g. ``"fsdp=64,tensor=4"``.
        seconds: the best plan's predicted step time on it, its collectives overlapping
            compute where the platform runs them so (``None``: not planned).
        memory_bytes: that plan's predicted peak memory per device (``None``: not planned).
        fits: whether ``memory_bytes`` is within the profile's memory (``True`` where the
            profile gives none; ``None``: not planned).
        skipped: why it was not planned (``None``: it was).
        variant: which of the programs given as variants the best plan is of (a remat
            policy's name; ``None``: the program itself, where no variants are given).
        axes: a mesh given in ``also``: its axes (``()``: the roles).
        plan: the name of that plan (``search``, or a baseline faster by this time).
    """

    sizes: tuple[int, ...]
    mesh: str
    seconds: float | None = None
    memory_bytes: int | None = None
    fits: bool | None = None
    skipped: str | None = None
    variant: str | None = None
    axes: tuple[str, ...] = ()
    plan: str = "search"


@dataclass(frozen=True, slots=True)
class MeshChoice:
    """The meshes tried for one program, best first, and the best one's plan.

    Attributes:
        devices: how many devices were split.
        profile: the device profile's name.
        roles: the roles, in order (the mesh's axes in that order).
        candidates: the planned candidates: those that fit first, each group by predicted time.
        skipped: the candidates not planned, each with why.
        ranked_by: how candidates past the cap were chosen.
        best: the plan of the first candidate.
        wall_seconds: how long the search took here.
        used: how many of the devices the candidates use: ``devices``, or the most that some
            split can use where no split of them all divides the model (the rest idle).
        idle_why: why not all the devices are used (``None``: all are).
    """

    devices: int
    profile: str
    roles: tuple[str, ...]
    candidates: tuple[Candidate, ...]
    skipped: tuple[Candidate, ...]
    ranked_by: str
    best: ProgramPlan = field(repr=False)  # (printed whole, it filled a screen)
    wall_seconds: float
    used: int
    idle_why: str | None = None

    @property
    def mesh(self) -> str:
        """The best candidate's mesh text."""
        return self.candidates[0].mesh

    @property
    def variant(self) -> str | None:
        """The best candidate's variant (``None`` where no variants were given)."""
        return self.candidates[0].variant

    def ici(self) -> dict[str, int]:
        """MaxText's ``ici_<role>_parallelism`` integers for the best mesh (1 where a role is
        not split)."""
        best = self.candidates[0]
        sizes = dict.fromkeys(self.roles, 1) | dict(
            zip(best.axes or self.roles, best.sizes, strict=True)
        )
        return {f"ici_{r}_parallelism": n for r, n in sizes.items()}

    def __rich__(self) -> Any:
        from rich.console import Group

        from shardwise.render.program import choice_notes, choice_table

        return Group(choice_table(self), *choice_notes(self))

    def __str__(self) -> str:
        from shardwise.render.terminal import plain_text

        return plain_text(self)

    def to_json(self) -> dict[str, Any]:
        rows = [*self.candidates, *self.skipped]
        return {
            "devices": self.devices,
            "used": self.used,
            "idle_why": self.idle_why,
            "profile": self.profile,
            "mesh": self.mesh,
            "variant": self.variant,
            "ici": self.ici(),
            "ranked_by": self.ranked_by,
            "wall_seconds": self.wall_seconds,
            "candidates": [
                {"mesh": c.mesh, "variant": c.variant, "plan": c.plan, "seconds": c.seconds,
                 "memory_bytes": c.memory_bytes, "fits": c.fits, "skipped": c.skipped}
                for c in rows
            ],
        }  # fmt: skip


def _check(devices: int, roles: Sequence[str], max_tensor: int, limit: int, args: Any) -> None:
    if isinstance(args, Mapping) or not isinstance(args, Sequence):
        raise ArgumentTypeError(
            f"choose_mesh takes the function's arguments as a tuple, fn(*args); got "
            f"{type(args).__name__}: pass (x, params), not {{'x': ..., 'params': ...}}."
        )
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise ArgumentError(f"devices is {devices!r}; give a whole number of devices, 1 or more.")
    if not roles:
        raise ArgumentError(f"give at least one role to split the devices over: {ROLES}.")
    for r in roles:
        if r not in ROLES:
            raise ArgumentError(
                f"unknown role {r!r}{did_you_mean(r, ROLES)}; the roles are {', '.join(ROLES)}."
            )
    if len(set(roles)) != len(roles):
        raise ArgumentError(f"roles {tuple(roles)} name a role twice; name each once.")
    if max_tensor < 1 or limit < 1:
        raise ArgumentError(f"max_tensor ({max_tensor}) and limit ({limit}) must be 1 or more.")


def _ranking(
    devices: int, batch: int | None, seq: int | None, ffn: int | None
) -> tuple[str, Callable[[dict[str, int]], tuple[float, ...]]]:
    """How to order candidates past the cap: by the book's closed form where the tokens and
    the MLP width are known, else fewest ways of tensor parallelism first."""

    def simple(split: dict[str, int]) -> tuple[float, ...]:
        return (split.get("tensor", 1), sum(n > 1 for n in split.values()))

    if batch is None or ffn is None:
        return "fewest ways of tensor parallelism, then fewest axes", simple
    tokens = batch * (seq or 1)
    best = min(max(optimal_fsdp(tokens, ffn, devices), 1.0), float(devices))

    def book(split: dict[str, int]) -> tuple[float, ...]:
        ways = math.prod(split.get(r, 1) for r in BATCH_ROLES)
        return (abs(math.log2(ways) - math.log2(best)), *simple(split))

    how = (
        f"distance from the scaling book's X_opt = sqrt(B/F·2·N) = {best:.0f} ways of "
        f"batch splitting (B = {tokens} tokens, F = {ffn}, N = {devices})"
    )
    return how, book


def choose_mesh(
    fn: Callable[..., Any],
    args: Sequence[Any],
    devices: int,
    profile: Profile | str,
    *,
    train: bool = False,
    roles: Sequence[str] = ("fsdp", "tensor"),
    top: int = 5,
    batch: int | None = None,
    seq: int | None = None,
    heads: int | None = None,
    ffn: int | None = None,
    max_tensor: int = MAX_TENSOR,
    limit: int = MAX_PLANNED,
    variants: Mapping[str, tuple[Callable[..., Any], Sequence[Any]]] | None = None,
    on_step: Callable[[int, int], None] | None = None,
    donate_argnums: int | Sequence[int] | None = (),
    also: Sequence[str] = (),
) -> MeshChoice:
    """Split ``devices`` over ``roles`` every way there is, plan ``fn(*args)`` on each split
    (the mesh need not exist here), and report them best first.

    The roles are just mesh axis names to the planner: ``data`` and ``fsdp`` differ only in
    what the search makes of them (it may shard the weights over either), so the report's
    ``ici_*`` integers are MaxText's reading of the chosen axes.

    Args:
        fn, args: the program and its argument shapes, as :func:`shardwise.plan` takes them.
        devices: how many devices to split. Where no split of them all divides the model
            (the scaling book's 2048 rows and 64 heads on a v5p pod of 8960 chips), the
            most that some split can use are split and the rest left idle, as
            :attr:`MeshChoice.used` and :attr:`MeshChoice.idle_why` say.
        profile: the devices' profile: each split's plan is the fastest within its memory
            (where none fits, the fastest, marked as not fitting).
        train: plan a training step of the loss ``fn`` (as :func:`shardwise.plan`).
        roles: mesh axis names, in the mesh's order (see :data:`ROLES`); by default the
            scaling book's mixed FSDP × tensor parallelism. A third role multiplies the
            layouts of every array: planning each split takes seconds on two axes, tens of
            seconds on three (Llama-3 8B's training step on 256 chips).
        top: how many of the planned candidates to keep in :attr:`MeshChoice.candidates`.
        batch, seq, heads, ffn: the model's batch rows, sequence length, query heads and
            MLP width, where known: they prune splits that do not divide them and rank the
            rest by the scaling book's closed form.
        max_tensor: the most ways of ``tensor`` tried.
        limit: the most candidates planned.
        variants: other ways to write the same step, by name, each ``(fn, args)`` (the
            model under each remat policy), planned instead of ``fn``: the fastest that fits.
        on_step: called as ``on_step(k, n)`` before planning the k-th of n candidates.
        donate_argnums: the donated arguments, as :func:`shardwise.plan` takes them.
        also: meshes planned beside the splits (the one run today: ``data=2,fsdp=256``),
            so the choice is never slower than they are: axes named by roles, all devices.

    >>> import shardwise
    >>> fn, args = shardwise.model("mlp", batch=64, hidden=32, ffn=128)
    >>> c = choose_mesh(fn, args, 4, "cpu-2core", batch=64, top=2)
    >>> len(c.candidates), math.prod(c.ici().values())
    (2, 4)
    """
    _check(devices, roles, max_tensor, limit, args)
    start = time.perf_counter()
    prof = load_profile(profile) if isinstance(profile, str) else profile
    used, idle_why = devices, None
    kept, skipped = _splits(used, roles, max_tensor, batch, seq, heads)
    if not kept:
        fewer = most_usable(devices, roles, max_tensor, batch, seq, heads)
        assert fewer is not None  # only where a role bounded by nothing splits every count
        idle_why, used = idle(devices, fewer, roles, max_tensor, batch, seq, heads), fewer
        kept, skipped = _splits(used, roles, max_tensor, batch, seq, heads)
    how, key = _ranking(used, batch, seq, ffn)
    kept.sort(key=key)
    todo = _to_plan(kept, roles, limit, _given(also, devices), skipped)
    programs = dict(variants) if variants else {"": (fn, args)}
    planner = functools.partial(plan, profile=prof, train=train, top=1,
                                donate_argnums=donate_argnums)  # fmt: skip
    planned, best = _plan_each(programs, planner, prof, todo, on_step)
    return MeshChoice(
        devices, prof.name, tuple(roles), tuple(planned[:top]), tuple(skipped), how, best,
        time.perf_counter() - start, used, idle_why,
    )  # fmt: skip


def _to_plan(
    kept: list[dict[str, int]], roles: Sequence[str], limit: int, given: list[Candidate],
    skipped: list[Candidate],
) -> list[Candidate]:  # fmt: skip
    """The first ``limit`` splits of ``kept`` (ranked) and the meshes ``given`` besides them;
    the splits past the limit (and not given) are added to ``skipped``, saying so."""
    for k, split in enumerate(kept[limit:]):
        sizes = tuple(split.values())
        why = f"ranked {limit + k + 1} of {len(kept)}, past the {limit} planned (limit)"
        if (text := mesh_text(roles, sizes)) not in {c.mesh for c in given}:
            skipped.append(Candidate(sizes, text, skipped=why))
    todo = [Candidate(tuple(s.values()), mesh_text(roles, tuple(s.values())))
            for s in kept[:limit]]  # fmt: skip
    return todo + [c for c in given if c.mesh not in {t.mesh for t in todo}]


def _given(meshes: Sequence[str], devices: int) -> list[Candidate]:
    """The meshes of ``also`` as candidates, each checked: axes named by roles, ``devices``
    in all."""
    out = []
    for text in meshes:
        spec = MeshSpec.parse(text)
        unknown = [a for a in spec.names if a not in ROLES]
        if unknown or spec.size != devices:
            why = (f"axis {unknown[0]!r} is not a role ({', '.join(ROLES)})" if unknown
                   else f"it has {spec.size} devices, not {devices}")  # fmt: skip
            raise ArgumentError(f"also={text!r}: {why}; give meshes of roles over all of them.")
        out.append(Candidate(tuple(spec.shape.values()), spec.describe(), axes=spec.names))
    return out


def _splits(
    devices: int, roles: Sequence[str], max_tensor: int, batch: int | None, seq: int | None,
    heads: int | None,
) -> tuple[list[dict[str, int]], list[Candidate]]:  # fmt: skip
    """Every split of ``devices`` over ``roles``: those left to plan, and those pruned (why)."""
    kept: list[dict[str, int]] = []
    skipped: list[Candidate] = []
    for sizes in factorisations(devices, len(roles)):
        split = dict(zip(roles, sizes, strict=True))
        why = why_not(split, max_tensor, batch, seq, heads)
        if why is None:
            kept.append(split)
        else:
            skipped.append(Candidate(sizes, mesh_text(roles, sizes), skipped=why))
    return kept, skipped


def _plan_each(
    programs: Mapping[str, tuple[Callable[..., Any], Sequence[Any]]],
    planner: Callable[..., ProgramPlan], prof: Profile, splits: Sequence[Candidate],
    on_step: Callable[[int, int], None] | None,
) -> tuple[list[Candidate], ProgramPlan]:  # fmt: skip
    """Plan each split with each program (named ``""`` where no variants are given): the
    candidates (each split's best program), those that fit first, each group by predicted
    time, and the first one's plan (only the best plan is kept, to bound the memory held)."""
    out: list[Candidate] = []
    best_plan: ProgramPlan | None = None
    steps = len(splits) * len(programs)
    for k, split in enumerate(splits):
        sizes, text = split.sizes, split.mesh
        tried: list[tuple[Candidate, ProgramPlan]] = []
        for j, (variant, (fn, args)) in enumerate(programs.items()):
            if on_step is not None:
                on_step(k * len(programs) + j, steps)
            # the fastest within a device's memory, by the time candidates are ranked by
            # (collectives beside compute: a baseline may beat the search's plan, whose
            # search adds them up); where none fits, the fastest, marked
            p = planner(fn, *args, mesh=text)
            fitting = [q for q in p.plans if _fits(q.predicted.memory_bytes, prof)]
            q = min(fitting or p.plans, key=lambda q: q.predicted.overlapped_seconds)
            best = q.predicted
            c = Candidate(sizes, text, best.overlapped_seconds, best.memory_bytes,
                          bool(fitting), variant=variant or None, axes=split.axes,
                          plan=q.name)  # fmt: skip
            tried.append((c, dataclasses.replace(p, chosen_name=q.name)))  # (the plan ranked)
        c, p = min(tried, key=lambda t: _order(t[0]))
        if best_plan is None or _order(c) < min(_order(o) for o in out):
            best_plan = p
        out.append(c)
    assert best_plan is not None  # splits is never empty
    return sorted(out, key=_order), best_plan


def _fits(memory_bytes: int, prof: Profile) -> bool:
    """Whether ``memory_bytes`` is within the profile's memory per device (it may give none)."""
    return prof.memory_bytes is None or memory_bytes <= prof.memory_bytes


def _order(c: Candidate) -> tuple[bool, float]:
    """Those that fit first, then by predicted time."""
    return (not c.fits, c.seconds if c.seconds is not None else math.inf)
