"""How the graph builder reads control flow: a scan's results (:func:`scan_results`; its body
is read in :mod:`~shardwise._program.graph`).
"""

from __future__ import annotations

from typing import Any

from shardwise._program.walk import Path, is_var, named, rank
from shardwise._versions import scan_counts


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
