"""How the graph builder reads control flow: a scan's results (:func:`scan_results`; its body
is read in :mod:`~shardwise._program.graph`), and a ``cond``'s branches (:func:`read_cond`).

A ``cond`` (``lax.cond``, ``lax.switch``) is read as XLA partitions it: its branches run on
the operands in their own layouts, each branch partitioned as the rest of the program is (a
conditional over arrays split 8 ways compiles with no all-gather), so the planner reads each
branch's body as it reads a call's, its steps steps of the graph.

Its results are one buffer whichever branch runs: each is an array of its own in one class
with what every branch returns for it (one layout, as XLA gives a conditional's results over
its branches). XLA allocates them at the conditional, apart from the branch's own buffers, and
holds its operands, buffers of their own, until it ends (an accumulating step whose update is
skipped where the loss is not finite compiled with 2,280 bytes of temporaries that had been
counted inside its results' buffers). What a branch makes and returns is written in that
buffer, not beside it (:attr:`~shardwise._program.graph.Graph.branched`,
:func:`~shardwise._program.buffers.in_conds`); a result that every branch returns as the same
operand is that operand (:func:`passed_through`: a gradient's residual), and a dot in a
branch sums its partial sums there (:attr:`~shardwise._program.nodes.Step.branch`).
"""

from __future__ import annotations

from typing import Any

from shardwise._program.walk import Path, is_var, named, rank
from shardwise._versions import scan_counts


def read_cond(builder: Any, eqn: Any, path: Path, here: Path, ins: list[int | None]) -> list[Any]:
    """The results of ``eqn``, a ``cond``, as the graph builder (``builder``) reads them: each
    branch ``k`` walked at path ``(*here, k)`` on the cond's operands (``ins[1:]``; the branch
    index, ``ins[0]``, is a scalar), each non-scalar result an array joined with what each
    branch returns for it. As XLA holds a conditional's buffers, each result is made as the
    cond starts (the arrays a branch makes before its result never sit in it, but what it
    makes of them in place, :func:`~shardwise._program.buffers.in_conds`), one every branch
    returns as an operand is that operand, and each operand is read until the cond ends."""
    builder.clock += 1
    source = builder.where(eqn)
    through = passed_through(eqn)
    outs = [
        ins[1 + through[k]] if k in through else
        builder.define((path, var), named("cond", source), source)
        if is_var(var) and rank(var) else None
        for k, var in enumerate(eqn.outvars)
    ]  # fmt: skip
    builder.fed.update(out for out in outs if out is not None)  # (a buffer, never fused away)
    outer = builder.branch
    for k, branch in enumerate(eqn.params["branches"]):
        builder.branch, start = (*here, k), builder.clock
        builder.entered[(*here, k)] = (start, source)
        returned = builder.run(
            branch.jaxpr, [None] * len(branch.jaxpr.constvars), (*here, k), ins[1:]
        )
        builder.branch = outer
        made = set()
        for out, got in zip(outs, returned, strict=True):
            if out is None or got is None or got == out:
                continue
            builder.classes.join(got, out)
            if builder.born[got] > start and got not in made:  # (twice: XLA copies it)
                made.add(got)
                builder.branched.append((got, out, start))
    builder.clock += 1
    for a in ins[1:]:
        if a is not None:
            builder.use(a, True)  # (a buffer the conditional takes, never fused away)
            builder.taken.add(a)
    return outs


def passed_through(eqn: Any) -> dict[int, int]:
    """The results of ``eqn``, a ``cond``, that every branch returns as the same operand: by
    result position, that operand's position among the branches' operands. XLA gives such a
    result the operand's own buffer (seen: a gradient's residual ``x`` that both branches of
    JAX 0.10's forward cond return, no buffer of its own in the compiled program; JAX 0.12
    hands ``x`` to the backward cond itself)."""
    out = {}
    branches = [b.jaxpr for b in eqn.params["branches"]]
    for k, var in enumerate(eqn.outvars):
        if not is_var(var) or not rank(var):
            continue
        found = {next((j for j, v in enumerate(b.invars) if v is b.outvars[k]), -1)
                 for b in branches}  # fmt: skip
        if len(found) == 1 and (j := found.pop()) >= 0:
            out[k] = j
    return out


def scan_results(b: Any, eqn: Any, path: Path, here: Path) -> list[int | None]:
    """A scan's results, as the graph builder ``b`` reads them: each carry joins its initial
    value and its value in the body (one layout across iterations); each stacked result is a
    map of its slices."""
    p = eqn.params
    body = p["jaxpr"].jaxpr
    n_consts, n_carry = scan_counts(p)
    for v in eqn.invars[n_consts : n_consts + n_carry]:  # even where the result is dropped
        init = b.array(path, v)
        if init is not None and b.values[init].shape:
            b.carries.append((init, here))
    source = b.where(eqn)
    outs: list[int | None] = []
    for k, (outer, inner) in enumerate(zip(eqn.outvars, body.outvars, strict=True)):
        if not is_var(outer) or not rank(outer):
            outs.append(None)
            continue
        y = b.define((path, outer), named("scan", source), source)
        outs.append(y)
        got = b.array(here, inner)
        if got is None:
            continue
        if k < n_carry:
            b.looped.add(got)
            b.classes.join(got, y)
            init = b.array(path, eqn.invars[n_consts + k])
            carried = b.array(here, body.invars[n_consts + k])
            for other in (init, carried):
                if other is not None:
                    b.classes.join(got, other)
        else:  # (stacked as it is made: its reads end where they did)
            r, read = len(b.values[got].shape), b.last[got]
            b.step("map", "scan stack", (got,), y, here, eqn, "scan stack",
                   dim_map=(None, *range(r)), length=p["length"])  # fmt: skip
            b.last[got] = read
    return outs
