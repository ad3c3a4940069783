"""Training steps with an optimizer's state, built from a loss: what a plan of real training
holds per device (AdamW's two moments per parameter, in float32) and moves.

A step is a plain JAX function ``step(params, opt_state, *batch) → (loss, params,
opt_state)``: planned as any program (its state is an input like the parameters; the update
reads each weight and its moments in one elementwise op, so the planner lays the moments out
as their weights: ZeRO-3, FSDP of both, is a plan like any other, ZeRO-1 is none), run
with :meth:`~shardwise.ProgramPlan.sharded` on the state :func:`adamw_state` describes
(zeros to start).

>>> loss = lambda p, x: jnp.sum((x @ p["w"]) ** 2)
>>> step = adamw(loss)
>>> params = {"w": jnp.ones((4, 2))}
>>> state = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), adamw_state(params))
>>> value, params, state = step(params, state, jnp.ones((3, 4)))
>>> float(value), int(state["count"])
(96.0, 1)
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

OPTIMIZERS = ("adamw",)
"""The optimizers a built-in training step can take (plain SGD is ``plan(train=True)``)."""


def adamw(
    loss: Callable[..., Any],
    learning_rate: float = 3e-4,
    b1: float = 0.9,
    b2: float = 0.95,
    eps: float = 1e-8,
    weight_decay: float = 0.1,
    microbatches: int = 1,
) -> Callable[..., Any]:
    """One AdamW step of ``loss(params, *batch)``, as ``optax.adamw`` computes it (bias-corrected
    moments, decoupled weight decay; MaxText's defaults): ``step(params, opt_state, *batch)``
    returns the loss, the updated parameters (in their own dtype) and the new state. The
    moments are float32 whatever the parameters' dtype.

    ``microbatches`` > 1 accumulates the gradient over that many equal parts of the batch
    (every batch array's first dimension), one after another under ``lax.scan``, in float32,
    and steps on their mean (as MaxText's ``gradient_accumulation_steps``): for a loss that is
    a mean over the batch, the same step, holding one part's activations at a time."""

    def step(params: Any, opt_state: Any, *batch: Any) -> Any:
        value, grads = _value_and_grad(loss, microbatches, params, batch)
        count = opt_state["count"] + 1
        mu = jax.tree.map(
            lambda m, g: b1 * m + (1 - b1) * g.astype(jnp.float32), opt_state["mu"], grads
        )
        nu = jax.tree.map(
            lambda v, g: b2 * v + (1 - b2) * jnp.square(g.astype(jnp.float32)),
            opt_state["nu"],
            grads,
        )
        c1 = 1 - b1 ** count.astype(jnp.float32)
        c2 = 1 - b2 ** count.astype(jnp.float32)

        def update(p: jax.Array, m: jax.Array, v: jax.Array) -> jax.Array:
            direction = (m / c1) / (jnp.sqrt(v / c2) + eps) + weight_decay * p
            out: jax.Array = (p - learning_rate * direction).astype(p.dtype)
            return out

        new = jax.tree.map(update, params, mu, nu)
        return value, new, {"mu": mu, "nu": nu, "count": count}

    step.__name__ = f"adamw_step({getattr(loss, '__name__', 'loss')})"
    step.__signature__ = _named_like(loss)  # type: ignore[attr-defined]
    return step


def _named_like(loss: Callable[..., Any]) -> inspect.Signature:
    """``step(params, opt_state, *batch)``'s signature, the batch named as ``loss`` names it
    (``tokens``, ``labels``; they had been ``args[2]`` and ``args[3]`` in reports)."""
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    try:
        given = list(inspect.signature(loss).parameters.values())[1:]
    except (TypeError, ValueError):  # (a callable without one)
        given = []
    positional = (inspect.Parameter.POSITIONAL_ONLY, kind)
    batch = [inspect.Parameter(p.name, kind) for p in given if p.kind in positional]
    head = [inspect.Parameter(n, kind) for n in ("params", "opt_state")]
    if any(p.kind == inspect.Parameter.VAR_POSITIONAL for p in given):
        batch.append(inspect.Parameter("batch", inspect.Parameter.VAR_POSITIONAL))
    return inspect.Signature([*head, *batch])


def _value_and_grad(
    loss: Callable[..., Any], microbatches: int, params: Any, batch: tuple[Any, ...]
) -> tuple[Any, Any]:
    """``loss``'s value and gradient on ``batch``, or their means over ``microbatches``
    parts of it, accumulated in float32."""
    if microbatches == 1:
        return jax.value_and_grad(loss)(params, *batch)

    def split(b: jax.Array) -> jax.Array:
        return b.reshape(microbatches, b.shape[0] // microbatches, *b.shape[1:])

    def accumulate(acc: Any, part: tuple[Any, ...]) -> tuple[Any, None]:
        value, grads = jax.value_and_grad(loss)(params, *part)
        summed = jax.tree.map(lambda a, g: a + g.astype(jnp.float32), acc[1], grads)
        return (acc[0] + value.astype(jnp.float32), summed), None

    zero = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
    start = (jnp.zeros((), jnp.float32), zero)
    (total, summed), _ = jax.lax.scan(accumulate, start, jax.tree.map(split, batch))
    return total / microbatches, jax.tree.map(lambda g: g / microbatches, summed)


def adamw_state(params: Any) -> dict[str, Any]:
    """The shapes of :func:`adamw`'s state for ``params`` (arrays or shapes): two float32
    moments like each parameter, and an int32 step count."""

    def moment(p: Any) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(p.shape, jnp.float32)

    return {
        "mu": jax.tree.map(moment, params),
        "nu": jax.tree.map(moment, params),
        "count": jax.ShapeDtypeStruct((), jnp.int32),
    }
