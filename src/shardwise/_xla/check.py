"""Check what shardwise returns: a result against a float64 NumPy reference with a rigorous
rounding bound, and a compiled program against the sums its einsum needs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax.numpy as jnp
import numpy as np

from shardwise._errors import MiscompileError
from shardwise._model.op import Op
from shardwise._model.plan import Plan
from shardwise._model.reshard import common_layout
from shardwise._model.spec import Layout
from shardwise._xla.hlo import Collective


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
    reference = np.einsum(op.equation, *exact_in)
    magnitude = np.einsum(op.equation, *(np.abs(a) for a in exact_in))
    sizes = op.sizes([a.shape for a in exact_in])
    terms = int(np.prod([sizes[i] for i in op.contracted], dtype=np.int64))
    eps = float(jnp.finfo(got.dtype).eps)  # type: ignore[no-untyped-call]
    error = np.abs(got.astype(work) - reference)
    bound = (terms + 2) * eps * magnitude + np.finfo(np.float64).tiny
    return Check(
        max_abs_error=float(error.max()) if error.size else 0.0,
        tolerance=float(bound.max()) if bound.size else 0.0,
        ok=bool(np.all(error <= bound)),
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
