"""Check what shardwise returns: a result against a float64 NumPy reference with a rigorous
rounding bound, a compiled einsum program against the sums its einsum needs, and any compiled
program against the sums each of its contractions needs."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax._src import source_info_util

from shardwise._errors import MiscompileError
from shardwise._model.op import Op
from shardwise._model.plan import Plan
from shardwise._model.reshard import common_layout
from shardwise._model.spec import Layout
from shardwise._xla import flow
from shardwise._xla.hlo import KINDS, Collective


@dataclass(frozen=True, slots=True)
class Check:
    """How far a result is from the float64 reference, and whether that is within rounding."""

    max_abs_error: float
    tolerance: float
    ok: bool


def check_einsum(op: Op, arrays: Sequence[Any], result: Any) -> Check:
    """Compare ``result`` with ``np.einsum`` in float64 (complex128 for complex results).

    The bound is the classic one for a sum of ``K`` products computed in working precision:
    ``|error| <= (K + 2) * eps * sum(|a| * |b| ...)``, elementwise, with ``K`` the number of
    terms summed into each output element. Integer and boolean results must be exact: NumPy's
    einsum in the result's dtype (integers wrap around as in XLA, so the sums agree whatever
    their order).

    >>> a = np.arange(6, dtype=np.int64).reshape(2, 3)
    >>> check_einsum(Op.parse("ij,ij->i"), [a, a], np.array([5, 50])).ok
    True
    """
    got = np.asarray(result)
    if got.dtype == np.bool_ or np.issubdtype(got.dtype, np.integer):
        wide = np.int64 if got.dtype.kind in "bi" else np.uint64
        exact = np.einsum(op.equation, *(np.asarray(a).astype(wide) for a in arrays))
        exact = exact.astype(got.dtype) if got.dtype != np.bool_ else exact != 0
        error = np.abs(got.astype(np.float64) - exact.astype(np.float64))
        return Check(float(error.max()) if error.size else 0.0, 0.0, bool(np.all(got == exact)))
    work = np.complex128 if np.iscomplexobj(got) else np.float64
    exact_in = [np.asarray(a).astype(work) for a in arrays]
    info = jnp.finfo(got.dtype)  # type: ignore[no-untyped-call]
    with np.errstate(invalid="ignore", over="ignore"):  # (NaN and infinity compared below)
        reference = np.einsum(op.equation, *exact_in)
        magnitude = np.einsum(op.equation, *(np.abs(a) for a in exact_in))
        sizes = op.sizes([a.shape for a in exact_in])
        terms = int(np.prod([sizes[i] for i in op.contracted], dtype=np.int64))
        error = np.abs(got.astype(work) - reference)
        # a result that underflows is off by up to the smallest normal number per term
        bound = (terms + 2) * (float(info.eps) * magnitude + float(info.tiny))
        fits = (error <= bound) | (np.isnan(got) & np.isnan(reference)) | (got == reference)
        # where the products overflow in the result's dtype, any result is rounding's
        fits |= ~(magnitude <= float(info.max))
    missed = ~fits
    # the largest error: of the elements that miss the bound where any do, else of all those
    # whose error is a number (NaN and infinity matched above are not errors)
    finite = error[np.isfinite(error)]
    largest = error[missed].max() if missed.any() else (finite.max() if finite.size else 0.0)
    return Check(
        max_abs_error=float(largest),
        tolerance=float(np.nanmax(bound)) if bound.size and not np.isnan(bound).all() else 0.0,
        ok=bool(fits.all()),
    )


REDUCES = frozenset({"all-reduce", "reduce-scatter", "all-gather", "all-to-all"})
"""Collectives that can take a mesh axis off a contracted index where the operands meet:
summing the partial results over it (all-reduce, reduce-scatter), or gathering or moving the
split away (all-gather, all-to-all)."""


def contraction_problems(
    plan: Plan,
    found: Sequence[Collective],
    layout: Layout | None = None,
    platform: str = "cpu",
) -> tuple[str, ...]:
    """What is wrong with a compiled einsum program, from its collectives.

    Two rules, each a necessary condition (they read only which collectives span which axes):

    - a mesh axis that splits a contracted index of an operand must carry some collective, or
      no device ever sees the other devices' terms;
    - a mesh axis that splits a contracted index of ``layout``, the layout the operands meet
      in (by default the one they all follow, if they do), must be summed over or gathered
      away (all-reduce, reduce-scatter, all-gather, all-to-all): a collective-permute only
      moves blocks.

    A collective whose device groups could not be read counts as spanning every axis, and off
    CPU the second rule accepts any collective (XLA's windowed einsum on TPU sums a
    contraction with a loop of collective-permutes): the check never refuses a program it
    cannot read. ``()`` when nothing is wrong. They find the miscompile of JAX 0.10.2's
    partitioner on operands that disagree on how a contracted index is split
    (openxla/xla#40034 is related).

    >>> from shardwise._xla.hlo import collectives
    >>> plan = Plan.make("ij,jk->ik", [(8, 8)] * 2, mesh="x=2", in_specs=["-,x", "x"])
    >>> line = "%ar = f32[8,8]{1,0} all-reduce(%d), replica_groups={{0,1}}, to_apply=%add"
    >>> contraction_problems(plan, collectives(line, {"x": 2}))
    ()
    >>> print(contraction_problems(plan, [])[0].split(" of ")[0])
    the compiled program never sums over mesh axis `x`, which splits contracted index `j`
    """
    if plan.empty:
        return ()  # an empty operand has nothing to sum
    if layout is None:
        layout = common_layout(plan.op, plan.in_specs)
    arrays = list(zip(plan.op.inputs, plan.in_specs, strict=True))
    if layout is not None:
        arrays.append(("".join(plan.op.contracted), layout.spec_for(plan.op.contracted)))
    problems = []
    for axis in plan.mesh.names:
        if plan.mesh.shape[axis] == 1:
            continue
        over = {c.kind for c in found if axis in c.mesh_axes or not c.groups}
        if platform != "cpu" and over:
            continue
        for k, (term, spec) in enumerate(arrays):
            where = [
                i
                for i, entry in zip(term, spec.padded(len(term)), strict=True)
                if axis in entry and i in plan.op.contracted
            ]
            met = k == len(plan.op.inputs)  # the layout the operands meet in
            if where and not (over & REDUCES if met else over):
                array = "where the operands meet" if met else f"of operand {k}"
                problems.append(
                    f"the compiled program never sums over mesh axis `{axis}`, which splits "
                    f"contracted index `{where[0]}` {array}: each device's result would lack "
                    "the other devices' terms. This is a miscompile in XLA's SPMD partitioner "
                    "(a related report: openxla/xla#40034)"
                )
                break
    return tuple(problems)


def ensure_sound(
    plan: Plan, found: Sequence[Collective], layout: Layout | None = None, platform: str = "cpu"
) -> None:
    """Raise :class:`MiscompileError` when :func:`contraction_problems` finds anything."""
    problems = contraction_problems(plan, found, layout, platform)
    if problems:
        given = ", ".join(s.describe() for s in plan.in_specs)
        fact = (
            f"{plan.op.equation!r} with operands laid out {given} on mesh "
            f"{plan.mesh.describe()}: {'; '.join(problems)}. shardwise returns no result from "
            "this program. Give the operands one agreed layout (or "
        )
        report = "), and please report the equation, shapes and layouts to shardwise."
        raise MiscompileError(f"{fact}mode='manual'{report}", shell=f"{fact}--mode manual{report}")


def ensure_close(plan: Plan, arrays: Sequence[Any], result: Any) -> None:
    """Raise :class:`MiscompileError` unless ``result`` is NumPy's within rounding."""
    found = check_einsum(plan.op, [np.asarray(a).astype(plan.dtype) for a in arrays], result)
    if not found.ok:
        fact = (
            f"{plan.op.equation!r} on mesh {plan.mesh.describe()} with operands laid out "
            f"{', '.join(s.describe() for s in plan.in_specs)} ({plan.mode} mode) returned a "
            f"result {found.max_abs_error:.3g} away from NumPy's, where rounding allows "
            f"{found.tolerance:.3g}. Please report it with the equation, shapes and layouts; "
        )
        raise MiscompileError(
            f"{fact}mode='manual' computes it another way.",
            shell=f"{fact}--mode manual computes it another way.",
        )


@dataclass(frozen=True, slots=True)
class DotTerms:
    """What a program's source says of one contraction (a ``dot_general``): the user's
    ``file:line`` it comes from, how many products are summed into each element of its result,
    the mesh axes a plan splits its contracted indices over (``None`` where no plan says),
    whether it is part of a training step's backward pass (``None``: not known), how to
    name it (an einsum equation), and whether it has batch indices (``None``: not known)."""

    source: str
    terms: int
    axes: tuple[str, ...] | None = None
    backward: bool | None = None
    what: str = "dot_general"
    batched: bool | None = None


SUMS = frozenset({"all-reduce", "reduce-scatter"})
"""Collectives that add up partial sums across devices."""


def jaxpr_dots(closed: Any) -> tuple[DotTerms, ...]:
    """Every ``dot_general`` of a (closed) jaxpr and the jaxprs inside it, as
    :class:`DotTerms` (inside ``shard_map`` shapes are per device, so nothing looks split)."""
    found: list[DotTerms] = []
    todo = [getattr(closed, "jaxpr", closed)]
    while todo:
        for eqn in todo.pop().eqns:
            for value in eqn.params.values():
                for inner in value if isinstance(value, tuple | list) else (value,):
                    if hasattr(inner, "eqns") or hasattr(getattr(inner, "jaxpr", None), "eqns"):
                        todo.append(getattr(inner, "jaxpr", inner))
            if eqn.primitive.name != "dot_general":
                continue
            (contracting, _), (batch, _) = eqn.params["dimension_numbers"]
            shape = eqn.invars[0].aval.shape
            where = source_info_util.user_frame(eqn.source_info.traceback)
            if where is not None and all(isinstance(n, int) for n in shape):
                line = f"{where.file_name.rsplit('/', 1)[-1]}:{where.start_line}"
                backward = "transpose(" in str(eqn.source_info.name_stack)
                terms = math.prod(shape[d] for d in contracting)
                found.append(DotTerms(line, terms, backward=backward, batched=bool(batch)))
    return tuple(found)


def dot_problems(
    text: str, dots: Sequence[DotTerms], mesh: Mapping[str, int], platform: str = "cpu"
) -> tuple[str, ...]:
    """What is wrong with a compiled program's contractions: each that XLA split across
    devices (it sums fewer terms on a device than its ``dot_general`` has) must be summed over
    the devices that hold its other terms before anything uses it whole (a non-linear op, or
    the program's result); see :func:`~shardwise._xla.flow.unsummed_use`.

    ``dots`` say what the program's source asks (:func:`jaxpr_dots`, or a plan's steps with the
    axes each splits); each compiled contraction is matched with those of its source line (and
    pass, forward or backward; a batched one only with dots that have batch indices: XLA
    splits a dot without making batch dimensions, and a batched dot fused with a reshape can
    carry the reshape's line), and checked as each of them split as a plan says (it is wrong
    only where it is summed as none of them needs: a backward pass's two products of one
    line can leave as many terms on a device), else as split the fewest ways any of them
    allows. A contraction without a source line, or none to match, is
    not checked, and off CPU any collective counts as a sum (as for
    :func:`contraction_problems`): the check never refuses what it cannot read. ``()`` when
    nothing is wrong.
    """
    module = flow.parse(text)
    sums = flow.sums(module, mesh, SUMS if platform == "cpu" else frozenset(KINDS))
    by_line: dict[str, list[DotTerms]] = {}
    for said in dots:
        by_line.setdefault(said.source, []).append(said)
    problems = []
    for local in flow.contractions(module):
        found = [
            _problem(module, local, dot, sums, mesh)
            for dot in _match(local, by_line.get(local.source, ()), mesh)
        ]
        if found and all(found):  # (refused only where it is none of its dots' sum)
            problems.append(found[0])
    return tuple(dict.fromkeys(p for p in problems if p))


def _problem(
    module: flow.Module, local: flow.Contraction, dot: DotTerms,
    sums: Mapping[str, frozenset[str]], mesh: Mapping[str, int],
) -> str:  # fmt: skip
    """What is wrong with compiled contraction ``local`` as (part of) ``dot``; ``""`` where
    nothing is."""
    ways = dot.terms // local.terms
    if ways == 1 or math.prod(mesh.values()) % ways:
        return ""  # not split across devices (or not as a mesh splits)
    named = dot.axes if dot.axes and math.prod(mesh[a] for a in dot.axes) == ways else ()
    enough = functools.partial(_enough, mesh=mesh, ways=ways, named=frozenset(named))
    found = flow.unsummed_use(module, local.name, sums, enough)
    if found is None:
        return ""
    use, summed = found
    if use.root and use.computation == module.entry:
        how = "the program returns it"
    else:
        at = f" at {module.source(use)}" if module.source(use) else ""
        how = f"`{use.opcode}` ({use.op_name or use.name}{at}) uses it"
    return _unsummed(dot, ways, named, how, summed)


def _match(
    local: flow.Contraction, dots: Sequence[DotTerms], mesh: Mapping[str, int]
) -> list[DotTerms]:
    """The dots of the source that compiled contraction ``local`` may compute (some of the
    terms of), of ``dots`` at its line: those split as their plan says (two dots of one line
    and pass, a backward pass's two products, can both leave ``local``'s terms on a device),
    else the one that leaves it split the fewest ways; ``[]`` if none can be."""
    matched = [
        d for d in dots
        if d.terms > 0 and d.terms % local.terms == 0 and d.backward in (None, local.backward)
        and not (local.batched and d.batched is False)
    ]  # fmt: skip
    planned = [
        d for d in matched
        if d.axes is not None and d.terms // local.terms == math.prod(mesh[a] for a in d.axes)
    ]  # fmt: skip
    if planned:
        return sorted(dict.fromkeys(planned), key=lambda d: d.terms)
    return sorted(matched, key=lambda d: d.terms)[:1]


def _enough(
    axes: frozenset[str], factor: int, mesh: Mapping[str, int], ways: int, named: frozenset[str]
) -> bool:
    """Whether sums over ``axes`` and local sums growing the terms ``factor`` times cover a
    contraction split ``ways`` ways, over the axes ``named`` where a plan names them."""
    covered = factor * math.prod(mesh[a] for a in axes) >= ways
    return covered and (factor > 1 or named <= axes)


def _unsummed(
    dot: DotTerms, ways: int, named: tuple[str, ...], how: str, summed: frozenset[str]
) -> str:
    axes = ", ".join(f"`{a}`" for a in named)
    split = f"mesh axis {axes}" if len(named) == 1 else f"mesh axes {axes}" if named else ""
    over = ", ".join(f"`{a}`" for a in sorted(summed))
    return (
        f"the contraction ({dot.what}) at {dot.source} is split {ways} ways across devices"
        f"{' over ' + split if split else ''} (each sums 1/{ways} of its "
        f"{dot.terms:,} terms), but {how} "
        f"{'after summing over ' + over + ' only' if over else 'before any sum across devices'}"
        ": each device's result would lack the other devices' terms. This is a miscompile in "
        "XLA's SPMD partitioner (a related report: openxla/xla#40034)"
    )


def ensure_dots_summed(problems: Sequence[str], program: str, fix: str) -> None:
    """Raise :class:`MiscompileError` for :func:`dot_problems`' ``problems``, if any: what
    ``program`` is, what is wrong, and ``fix``."""
    if problems:
        raise MiscompileError(
            f"{program}: {'; '.join(problems)}. shardwise returns no result from this program. "
            f"{fix}; and please report the function, shapes and layouts to shardwise."
        )
