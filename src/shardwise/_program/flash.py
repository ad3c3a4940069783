"""Causal attention a block of keys at a time, in plain JAX: the memory of flash attention
(FlashAttention, Dao et al. 2022; MaxText's ``attention: flash``) without its kernel, so that
it runs on any device and the planner reads it as it reads any program.

The keys and values are taken in blocks by a ``lax.scan``; each block's scores update a
running maximum, a running sum of exponentials and the weighted values (the *online
softmax*), and the whole ``seq × seq`` matrix of scores never exists. The block's body is
checkpointed, as flash attention's backward pass recomputes each block's scores rather than
keeping them: what the backward pass keeps is the carry, one ``(batch, seq, heads, head_dim)``
float32 accumulator per block. The block's body is costed as the fused kernel MaxText runs
(:data:`~shardwise._program.nodes.KERNEL`): its scores never pass through HBM.

>>> import jax, jax.numpy as jnp, numpy as np
>>> q = jax.random.normal(jax.random.key(0), (2, 8, 1, 2, 4))  # batch, seq, kv, group, dim
>>> k, v = (jax.random.normal(jax.random.key(i), (2, 8, 1, 4)) for i in (1, 2))
>>> plain = jax.nn.softmax(jnp.where(jnp.tril(jnp.ones((8, 8), bool)),
...     jnp.einsum("bskgd,btkd->bkgst", q, k) / 2, -jnp.inf), -1)
>>> want = jnp.einsum("bkgst,btkd->bskgd", plain, v)
>>> np.allclose(flash_attention(q, k, v, block=4), want, atol=1e-5)
True
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from shardwise._program.nodes import KERNEL

LOWEST = -1e30
"""A score no real one is below: masked scores, and the running maximum before any key."""


def flash_attention(q: jax.Array, k: jax.Array, v: jax.Array, block: int) -> jax.Array:
    """Causal grouped-query attention: ``q`` (batch, seq, kv_heads, group, head_dim) over
    ``k`` and ``v`` (batch, seq, kv_heads, head_dim), ``block`` keys at a time (``block``
    divides seq); the result is shaped as ``q``, in ``v``'s dtype."""
    b, s, kv, g, d = q.shape
    blocks = s // block
    keys = k.reshape(b, blocks, block, kv, d).swapaxes(0, 1)
    values = v.reshape(b, blocks, block, kv, d).swapaxes(0, 1)
    position = jnp.arange(s)
    scale = 1 / math.sqrt(d)

    def step(
        carry: tuple[jax.Array, jax.Array, jax.Array], xs: tuple[jax.Array, jax.Array, jax.Array]
    ) -> tuple[tuple[jax.Array, jax.Array, jax.Array], None]:
        out, top, total = carry
        kj, vj, j = xs
        with jax.named_scope(KERNEL):  # (costed as the kernel runs it: see KERNEL)
            scores = jnp.einsum("bskgd,btkd->bkgst", q, kj).astype(jnp.float32) * scale
            seen = position[:, None] >= j * block + jnp.arange(block)[None, :]
            scores = jnp.where(seen, scores, LOWEST)
            new_top = jnp.maximum(top, scores.max(axis=-1))
            weights = jnp.exp(scores - new_top[..., None])
            shrink = jnp.exp(top - new_top)
            total = total * shrink + weights.sum(axis=-1)
            part = jnp.einsum("bkgst,btkd->bkgsd", weights.astype(v.dtype), vj)
            out = out * shrink[..., None] + part.astype(jnp.float32)
        return (out, new_top, total), None

    init = (
        jnp.zeros((b, kv, g, s, d), jnp.float32),
        jnp.full((b, kv, g, s), LOWEST, jnp.float32),
        jnp.zeros((b, kv, g, s), jnp.float32),
    )
    body = jax.checkpoint(step, prevent_cse=False)
    (out, _, total), _ = jax.lax.scan(body, init, (keys, values, jnp.arange(blocks)))
    result = (out / total[..., None]).astype(v.dtype)
    return jnp.transpose(result, (0, 3, 1, 2, 4))
