"""Selects between an array and itself, read as XLA compiles them: the array.

``jax.vmap`` of a ``lax.cond`` whose predicate is batched runs every branch and selects
among their results; first it selects each operand against its own ``stop_gradient`` (JAX's
guard for reverse-mode differentiation), ``select_n(p, stop_gradient(x), x)``, which is ``x``
whatever ``p`` says. XLA folds those selects away, and with them the masks broadcast for them
(seen in the compiled HLO of a vmapped cond: no select of an operand, no mask but the
results'). Read as selects, the masks had been laid out and moved (all-to-alls the compiled
program does not have) and each select held a buffer beside its operand.
"""

from __future__ import annotations

from typing import Any

import jax.extend.core as jcore

from shardwise._program.rules import IDENTITIES


def unselected(closed: Any) -> Any:
    """``closed`` (a ``ClosedJaxpr``) with each select among one array (itself, or what an
    identity such as ``stop_gradient`` makes of it) replaced by that array, in the bodies of
    calls, conds and scans too; ``closed`` itself where it has none.

    >>> import jax, jax.numpy as jnp
    >>> f = lambda p, x: jax.lax.select(p, jax.lax.stop_gradient(x), x) * 2
    >>> closed = jax.make_jaxpr(f)(jnp.ones(3, bool), jnp.ones(3))
    >>> [e.primitive.name for e in unselected(closed).eqns]
    ['stop_gradient', 'mul']
    """
    jaxpr = _simplified(closed.jaxpr)
    return closed if jaxpr is closed.jaxpr else jcore.ClosedJaxpr(jaxpr, closed.consts)


def _simplified(jaxpr: Any) -> Any:
    """``jaxpr`` with its selects among one array replaced by that array (``jaxpr``, where
    it has none)."""
    swapped: dict[Any, Any] = {}  # a select's result -> the array it selects
    origin: dict[Any, Any] = {}  # an identity's result -> the array it is

    def now(v: Any) -> Any:
        return swapped.get(v, v) if isinstance(v, jcore.Var) else v

    def source(v: Any) -> Any:
        return origin.get(v, v)

    eqns, changed = [], False
    for eqn in jaxpr.eqns:
        invars = [now(v) for v in eqn.invars]
        name = eqn.primitive.name
        if name == "select_n" and all(isinstance(v, jcore.Var) for v in invars[1:]):
            cases = {source(v) for v in invars[1:]}
            if len(cases) == 1:
                swapped[eqn.outvars[0]] = cases.pop()
                changed = True
                continue
        if name in IDENTITIES and isinstance(invars[0], jcore.Var):
            origin[eqn.outvars[0]] = source(invars[0])
        params = {k: _inner(v) for k, v in eqn.params.items()}
        moved = invars != list(eqn.invars) or any(params[k] is not v for k, v in eqn.params.items())
        eqns.append(eqn.replace(invars=invars, params=params) if moved else eqn)
        changed |= moved
    if not changed:
        return jaxpr
    return jaxpr.replace(eqns=eqns, outvars=[now(v) for v in jaxpr.outvars])


def _inner(value: Any) -> Any:
    """An equation's parameter with the jaxprs in it (a call's body, a cond's branches)
    :func:`_simplified`; the parameter itself where none changes."""
    if isinstance(value, jcore.ClosedJaxpr):
        return unselected(value)
    if isinstance(value, jcore.Jaxpr):
        return _simplified(value)
    if isinstance(value, tuple) and any(isinstance(v, jcore.ClosedJaxpr) for v in value):
        inner = tuple(_inner(v) for v in value)
        return value if all(a is b for a, b in zip(inner, value, strict=True)) else inner
    return value
