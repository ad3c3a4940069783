"""Terminal views of a whole program's plan: the plans compared, and one plan op by op with
its memory over the program (``shardwise plan --model/--function``, and ``print`` of a
:class:`~shardwise.ProgramPlan` or of its ``report()``)."""

from __future__ import annotations

import math
from typing import Any

from rich.console import Group
from rich.markup import escape
from rich.table import Table

from shardwise._model.logical import axes_text, entry
from shardwise._model.units import format_bytes, format_seconds


def plans_view(report: Any) -> Any:
    """A :class:`ProgramPlan`'s plans as a table, cheapest first, with what was chosen and why."""
    parts: list[Any] = []
    verified = any(p.verified for p in report.plans)
    table = Table(
        title=f"{report.program} on mesh {report.mesh.describe()}, profile {report.profile.name}"
        f"{' (training step)' if report.train else ''}: {report.ops} ops, "
        f"{report.considered:,} layouts considered, solved in {report.solve_seconds:.2f} s by "
        f"{report.method}{'' if report.optimal else ' (not proven optimal)'}",
        title_justify="left",
    )
    for col in ["plan", "inputs", "predicted", "memory/device", "collectives"]:
        table.add_column(col, overflow="fold")
    if verified:
        for col in ["measured", "memory (XLA)", "HLO match"]:
            table.add_column(col, overflow="fold")
    same = report.same_programs()
    for p in report.plans:
        kinds: dict[tuple[str, tuple[str, ...]], int] = {}
        for c in p.predicted.collectives:
            kinds[(c.kind, c.mesh_axes)] = kinds.get((c.kind, c.mesh_axes), 0) + 1
        row = [
            f"[bold]{p.name}[/]" if p.name == report.chosen_name else p.name,
            inputs_text(report, p, same),
            format_seconds(p.predicted.seconds) + _overlapped(p.predicted),
            format_bytes(p.predicted.memory_bytes)
            + ("\n[red]over budget[/]" if p.over_budget else ""),
            "\n".join(f"{n}× {k} {','.join(a)}" for (k, a), n in kinds.items()) or "none",
        ]
        if verified and p.verified is not None:
            v = p.verified
            row += [
                format_seconds(v.seconds),
                format_bytes(v.memory_bytes) if v.memory_bytes is not None else "n/a",
                match_text(v.collectives_match, v.sources_match),
            ]
        table.add_row(*row)
    parts += [table, *([chosen_inputs(report)] if report.graph.names else [])]
    if any(_overlapped(p.predicted) for p in report.plans):
        parts.append(
            "[dim]overlapped: the step time where collectives run beside compute, as XLA runs "
            "them on GPUs and TPUs (the search minimises the time without overlap)[/]"
        )
    for name, why in report.skipped:
        parts.append(f"[yellow]skipped[/] {name}: {escape(why)}")
    over = [p.name for p in report.plans if p.over_budget]
    if over and report.budget is not None and report.over_memory is None:  # (else: none fits)
        parts.append(
            f"[red]over budget[/] {escape(', '.join(over))}: predicted to need more than the "
            f"budget of {format_bytes(report.budget)} per device; shown to compare, never "
            "chosen or run"
        )
    if report.over_memory is not None:
        parts.append(f"[red]over memory:[/] {escape(report.over_memory)}")
    if report.stopped_early:
        parts.append(f"[yellow]incomplete:[/] {escape(report.stopped_early)}")
    parts += chosen_lines(report)
    parts += annotation_lines(report)
    if verified:
        rho = report.spearman
        parts.append(
            "rank correlation (Spearman) of predicted and measured time: "
            + (f"{rho:.2f}" if rho is not None else "n/a")
        )
        if report.ordered is not None:
            parts.append(
                f"plans the devices tell apart (measured more than 25% apart): "
                f"{report.ordered:.0%} of {report.ordered_pairs} pairs ordered as predicted"
            )
        if report.chosen_vs_fastest is not None:
            parts.append(f"chosen plan: {report.chosen_vs_fastest:.2f}× the fastest measured")
        parts += faster_than_chosen(report)
    return Group(*parts)


SHOWN = 8
"""At most this many inputs that a plan lays out otherwise than the chosen one are named in
its row."""


def inputs_text(report: Any, plan: Any, same: dict[str, str]) -> str:
    """A plan's cell of the plans table: where the inputs are (the chosen plan's, in full,
    in the table below it), else the same program as which plan, else each input laid out
    otherwise than in the chosen plan (the first :data:`SHOWN`): a row per plan, not per
    input and plan, which for a model's parameters and optimizer state ran to hundreds."""
    chosen = report.chosen
    if plan.name == chosen.name:
        return "[dim]listed below[/]"
    twin = same.get(plan.name, plan.name)
    if twin == same.get(chosen.name, chosen.name):
        return f"[dim]the same program as {escape(chosen.name)}[/]"
    if twin != plan.name:
        return f"[dim]the same program as {escape(twin)}[/]"
    names = report.graph.names
    moved = [
        f"{n}: {s.describe()}"
        for n, s, c in zip(names, plan.in_specs, chosen.in_specs, strict=True)
        if s.canonical() != c.canonical()
    ]
    if not moved:
        return f"[dim]inputs as {escape(chosen.name)}[/]"
    more = f"\n[dim]and {len(moved) - SHOWN} more[/]" if len(moved) > SHOWN else ""
    return f"[dim]as {escape(chosen.name)} but[/] " + escape("\n".join(moved[:SHOWN])) + more


def chosen_inputs(report: Any) -> Table:
    """The chosen plan's layout of each input, one row each, the full pytree path wide
    enough to be read whole."""
    table = Table(title=f"inputs of plan {report.chosen.name!r}", title_justify="left")
    table.add_column("input", overflow="fold", ratio=3)
    table.add_column("layout", overflow="fold", ratio=1)
    for name, spec in zip(report.graph.names, report.chosen.in_specs, strict=True):
        table.add_row(escape(name), escape(spec.describe()))
    return table


def chosen_lines(report: Any) -> list[str]:
    """What was chosen and why: the search's plan against each baseline's prediction, or
    after ``tune`` the plan that ran fastest when tuned, against the search's measured time."""
    search = report.get("search")
    if not report.tuned and report.chosen_name != "search":  # (choose_mesh's, by its measure)
        mine = report.chosen.predicted
        return [
            f"[bold]chosen:[/] {escape(report.chosen_name)}, the fastest plan within a device's "
            f"memory with collectives beside compute ({format_seconds(mine.overlapped_seconds)}"
            f"; the search's plan {format_seconds(search.predicted.overlapped_seconds)}), as "
            "the mesh search ranks them"
        ]
    if report.tuned:
        line = (
            f"[bold]chosen:[/] {escape(report.chosen_name)}, the plan that ran fastest when tuned"
        )
        mine, theirs = report.chosen.verified, search.verified
        if report.chosen_name != "search" and mine and theirs and mine.seconds > 0:
            line += f"; the search's plan took {theirs.seconds / mine.seconds:.2f}× its time"
        return [line]
    best = search.predicted.seconds
    others = [p for p in report.plans if not p.searched]
    if not others:
        return []
    if best <= 0:
        return ["[bold]chosen:[/] the search's plan"]
    return [
        "[bold]chosen:[/] the search's plan, predicted "
        + ", ".join(
            f"{p.predicted.seconds / best:.2f}× as long for {p.name}"
            + (" (over budget)" if p.over_budget else "")
            for p in others
        )
    ]


def annotation_lines(report: Any) -> list[str]:
    """What the model's own annotations would cost beside the search's plan (and the
    collectives they cause that it avoids), and the logical axis rules that give the chosen
    plan (each with the op that first reads an array of that name), or the names no rules
    reconcile."""
    annotations = getattr(report, "annotations", None)
    if not annotations:
        return []
    lines = []
    compared = report.annotations_compared()
    if compared is not None:
        lines.append(
            f"[bold]your annotations:[/] {compared['time_ratio']:.2f}× the search's predicted "
            f"time, {compared['memory_ratio']:.2f}× its memory per device (plan 'annotations')"
        )
        lines += [
            f"  they cause {c['count']}× {c['kind']} {'+'.join(c['axes'])} "
            f"({format_bytes(c['bytes'])}) at {escape(c['source'] or 'an op')}, which the "
            "search's plan avoids"
            for c in compared["avoided"]
        ]
    elif report.respect == "annotations":
        lines.append("[bold]respect='annotations':[/] the search laid the inputs out as annotated")
    if not any(a.logical for a in annotations.by_input.values()):
        return lines
    made = report.logical_rules()
    reasons = report.rule_reasons()
    if reasons:
        lines.append("[bold]logical axis rules[/] that give the chosen plan (logical_rules()):")
    for name, axes, array, op in reasons:
        to = axes_text(entry(axes))
        why = f": {array}" + (f", read by {op}" if op else "") if array else ""
        lines.append(f"  {escape(name)} → {escape(to)}{escape(why)}")
    lines += [f"  [red]conflict:[/] {escape(c.describe())}" for c in made.conflicts]
    return lines


FASTER = 0.95
"""A measured plan is pointed out when it ran in less than this share of the chosen plan's
time (closer than that, two runs of the same plan may trade places)."""


def faster_than_chosen(report: Any) -> list[str]:
    """A line naming the plan that ran fastest on the devices at hand (of those that keep
    the inputs ``fixed`` pins, as ``tune`` chooses), where it beat the chosen plan clearly:
    the prediction missed something there, and the user can run it."""
    fastest = report.fastest_measured()
    chosen = report.chosen.verified
    if fastest is None or chosen is None:
        return []
    if fastest.verified.seconds <= 0 or fastest.verified.seconds >= FASTER * chosen.seconds:
        return []
    return [
        f"[yellow]measured fastest here:[/] {escape(fastest.name)} ran "
        f"{chosen.seconds / fastest.verified.seconds:.2f}× as fast as the chosen plan on these "
        f"devices; plan.sharded({fastest.name!r}) runs it"
        + ("" if report.tuned else ", and --tune (plan.tune()) chooses the fastest measured")
    ]


def match_text(collectives: bool, sources: bool) -> str:
    """The "HLO match" cell: the collectives (kind, axes, bytes), then the ops and source lines
    XLA's metadata gives them.

    >>> match_text(True, True), match_text(True, False), match_text(False, True)
    ('[green]yes[/]', '[yellow]collectives yes, ops/lines no[/]', '[red]no[/]')
    """
    if not collectives:
        return "[red]no[/]"
    return "[green]yes[/]" if sources else "[yellow]collectives yes, ops/lines no[/]"


SPARK = "▁▂▃▄▅▆▇█"


def sparkline(points: list[int] | tuple[int, ...], width: int = 60) -> str:
    """A row of block characters that rises and falls with ``points`` (resampled to at most
    ``width`` characters, each the largest value it covers).

    >>> sparkline([0, 1, 2, 4])
    '▁▃▅█'
    """
    if not points:
        return ""
    step = max(1, -(-len(points) // width))
    peaks = [max(points[k : k + step]) for k in range(0, len(points), step)]
    top = max(peaks) or 1
    return "".join(SPARK[min(len(SPARK) - 1, int(p / top * (len(SPARK) - 1) + 0.5))] for p in peaks)


def _arrays(views: Any) -> str:
    lines = []
    for a in views:
        text = a.to_json()
        lines.append(escape(f"{a.name} [{text['used_text']}]"))
        if a.held.canonical() != a.used.canonical():
            lines.append("[dim]" + escape(f"  (held as [{text['held_text']}])") + "[/]")
    return "\n".join(lines)


def ops_view(report: Any, quiet: bool = False) -> Any:
    """A :class:`ProgramReport`: one plan op by op (``quiet``: only the ops that cause
    collectives), then its memory over the program."""
    parts: list[Any] = []
    table = Table(
        title=f"plan {report.plan!r} op by op: what each op reads and makes, on each device, and "
        "the collectives it causes",
        title_justify="left",
        show_lines=True,
    )
    for col in ("op", "reads", "makes", "collectives and why", "time"):
        table.add_column(col, overflow="fold")
    for row in report.rows:
        if quiet and not row.collectives:
            continue
        where = " · ".join(w for w in (row.source, row.module) if w)
        where = f"\n[dim]{escape(where)}[/]" if where else ""
        back = f"\n[italic]backward of {escape(row.mirrors)}[/]" if row.mirrors else ""
        repeat = f"\n×{row.repeat} (scan)" if row.repeat > 1 else ""
        moves = "\n".join(
            f"[bold]{c.kind}[/] {','.join(c.mesh_axes)} {format_bytes(c.bytes)}"
            f"{f' ×{c.repeat}' if c.repeat > 1 else ''}: {escape(c.why)}"
            for c in row.collectives
        )
        table.add_row(
            escape(row.op) + where + back + repeat,
            _arrays(row.inputs),
            _arrays((row.output,)),
            moves or "[dim]none[/]",
            f"{row.share:.0%}",
        )
    parts.append(table)
    total = report.seconds or 1.0
    if report.maps_seconds + report.elementwise_seconds > 0.005 * total:
        parts.append(
            f"the other {(report.maps_seconds + report.elementwise_seconds) / total:.0%} of the "
            f"time: elementwise ops {report.elementwise_seconds / total:.0%}, layout maps that "
            f"move no data between devices {report.maps_seconds / total:.0%}"
        )
    if report.not_modelled:
        parts.append(
            f"[bold]not modelled[/] (planned whole on each device, costed by the bytes they "
            f"read and write): {escape(', '.join(report.not_modelled))}"
        )
    mem = report.memory
    parts.append(
        f"memory per device over the program: {sparkline(mem.points)}  peak "
        f"{format_bytes(mem.peak)} at point {mem.at} of {len(mem.points) - 1}"
    )
    held = ", ".join(f"{escape(n)} {format_bytes(b)}" for n, b in mem.alive[:8])
    more = f" and {len(mem.alive) - 8} more" if len(mem.alive) > 8 else ""
    if mem.others:  # (the peak had seemed to hold half what it said)
        more += f"; and {format_bytes(mem.others)} of copies for moves, partial sums and buffers"
    parts.append(f"held at the peak: {held}{more}")
    return Group(*parts)


def _overlapped(predicted: Any) -> str:
    """The time with collectives overlapping compute, where it is less, as a second line."""
    if predicted.overlapped_seconds >= 0.995 * predicted.seconds:
        return ""
    return f"\n{format_seconds(predicted.overlapped_seconds)} overlapped"


def choice_table(choice: Any) -> Table:
    """A :class:`~shardwise.MeshChoice`'s meshes planned, best first, as a table."""
    table = Table(
        title=f"{choice.devices} devices ({choice.profile}) over {', '.join(choice.roles)}: "
        f"{len(choice.candidates)} best of those planned, in {choice.wall_seconds:.1f} s",
        title_justify="left",
        caption="predicted step: with collectives beside compute where XLA runs them so "
        "(GPUs, TPUs); plan: each mesh's fastest within a device's memory by that time",
        caption_justify="left",
    )
    remat = choice.variant is not None
    for col in ("#", "mesh", "MaxText", *(["remat_policy"] if remat else []), "plan",
                "predicted step", "memory/device", "fits"):  # fmt: skip
        table.add_column(col)
    for k, c in enumerate(choice.candidates):
        split = zip(choice.roles, c.sizes, strict=True)
        ici = " ".join(f"ici_{r}_parallelism={n}" for r, n in split if n > 1)
        table.add_row(
            str(k + 1), c.mesh, ici or "-", *([c.variant or "-"] if remat else []), c.plan,
            format_seconds(c.seconds) if c.seconds is not None else "-",
            format_bytes(c.memory_bytes) if c.memory_bytes is not None else "-",
            "yes" if c.fits else "[red]no[/]",
        )  # fmt: skip
    return table


def choice_notes(choice: Any) -> list[str]:
    """What :func:`choice_table` leaves out: why devices idle, how candidates past the cap
    were ranked, why the others were not planned, and the chosen mesh (rich markup)."""
    lines = []
    best = choice.candidates[0]
    step = [math.nan if c.seconds is None else c.seconds for c in choice.candidates]
    tied = [
        c.mesh
        for c, seconds in zip(choice.candidates, step, strict=True)
        if (c.memory_bytes, c.fits) == (best.memory_bytes, best.fits)
        and math.isclose(seconds, step[0], rel_tol=1e-9)
    ]
    if len(tied) > 1:  # (said: a tie had read as a choice)
        lines.append(escape(f"{', '.join(tied)} tie (the same predicted step and memory); the "
                            "first is chosen"))  # fmt: skip
    if choice.idle_why is not None:
        lines.append(f"[yellow]{escape(choice.idle_why)}[/]")
    if any("(limit)" in (c.skipped or "") for c in choice.skipped):
        lines.append(f"past the cap, ranked by {choice.ranked_by}")
    if choice.skipped:
        reasons = "; ".join(f"{c.mesh}: {c.skipped}" for c in choice.skipped[:3])
        more = len(choice.skipped) - 3
        lines.append(escape(f"not planned: {reasons}" + (f"; and {more} more" if more > 0 else "")))
    ici = ", ".join(f"{k}: {v}" for k, v in choice.ici().items())
    policy = f", remat_policy: {choice.variant}" if choice.variant is not None else ""
    lines.append(f"[bold]chosen mesh:[/] {choice.mesh} ({ici}{policy})\n")
    return lines
