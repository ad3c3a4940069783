"""Models written as a Python loop of layers (as most Flax and Equinox models are), beside the
same stack under ``lax.scan``, and a small GPT in Flax NNX: the workloads of
``unrolled_planning.py`` and ``plan_snapshot.py``.

Every builder returns ``(fn, args)`` for :func:`shardwise.plan`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from shardwise._program.models import block

S = jax.ShapeDtypeStruct
Model = tuple[Callable[..., Any], tuple[Any, ...]]


def mlp_stack(layers: int, scan: bool, batch: int = 64, hidden: int = 128) -> Model:
    """``layers`` times ``h = relu(h @ w)``: a Python loop over a list of weights, or
    ``lax.scan`` over one stacked weight."""
    x = S((batch, hidden), "float32")
    if scan:

        def scanned(x: jax.Array, ws: jax.Array) -> jax.Array:
            def layer(h: jax.Array, w: jax.Array) -> tuple[jax.Array, None]:
                return jax.nn.relu(h @ w), None

            return jax.lax.scan(layer, x, ws)[0]

        return scanned, (x, S((layers, hidden, hidden), "float32"))

    def unrolled(x: jax.Array, ws: list[jax.Array]) -> jax.Array:
        for w in ws:
            x = jax.nn.relu(x @ w)
        return x

    return unrolled, (x, [S((hidden, hidden), "float32") for _ in range(layers)])


def _block_params(hidden: int, heads: int, ffn: int, lead: tuple[int, ...]) -> dict[str, Any]:
    d = hidden // heads
    return {
        "wq": S((*lead, hidden, heads, d), "float32"),
        "wk": S((*lead, hidden, heads, d), "float32"),
        "wv": S((*lead, hidden, heads, d), "float32"),
        "wo": S((*lead, heads, d, hidden), "float32"),
        "w1": S((*lead, hidden, ffn), "float32"),
        "w2": S((*lead, ffn, hidden), "float32"),
    }


def transformer_stack(
    layers: int,
    scan: bool,
    batch: int = 8,
    seq: int = 32,
    hidden: int = 64,
    heads: int = 4,
    ffn: int = 256,
) -> Model:
    """``layers`` pre-LayerNorm blocks (the built-in transformer's): a Python loop over a list
    of each block's weights, or the built-in ``lax.scan`` over stacked ones."""
    x = S((batch, seq, hidden), "float32")
    if scan:

        def scanned(x: jax.Array, params: dict[str, jax.Array]) -> jax.Array:
            def layer(h: jax.Array, p: dict[str, jax.Array]) -> tuple[jax.Array, None]:
                return block(h, p), None

            return jax.lax.scan(layer, x, params)[0]

        return scanned, (x, _block_params(hidden, heads, ffn, (layers,)))

    def unrolled(x: jax.Array, params: list[dict[str, jax.Array]]) -> jax.Array:
        for p in params:
            x = block(x, p)
        return x

    return unrolled, (x, [_block_params(hidden, heads, ffn, ()) for _ in range(layers)])


def nnx_gpt(
    blocks: int = 2,
    batch: int = 8,
    seq: int = 32,
    d_model: int = 64,
    heads: int = 4,
    vocab: int = 256,
) -> Model:
    """A GPT forward pass in Flax NNX: token embedding, ``blocks`` pre-LayerNorm blocks (causal
    multi-head attention, an MLP), a final LayerNorm and the vocabulary head. Planned as
    ``fn(state, tokens)`` over the model's split state."""
    from flax import nnx

    class Block(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.ln1 = nnx.LayerNorm(d_model, rngs=rngs)
            self.attn = nnx.MultiHeadAttention(
                heads, d_model, decode=False, rngs=rngs, deterministic=True
            )
            self.ln2 = nnx.LayerNorm(d_model, rngs=rngs)
            self.up = nnx.Linear(d_model, 4 * d_model, rngs=rngs)
            self.down = nnx.Linear(4 * d_model, d_model, rngs=rngs)

        def __call__(self, h: jax.Array, mask: jax.Array) -> jax.Array:
            h = h + self.attn(self.ln1(h), mask=mask)
            return h + self.down(jax.nn.gelu(self.up(self.ln2(h))))

    class GPT(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.embed = nnx.Embed(vocab, d_model, rngs=rngs)
            self.blocks = nnx.List([Block(rngs) for _ in range(blocks)])
            self.ln = nnx.LayerNorm(d_model, rngs=rngs)
            self.head = nnx.Linear(d_model, vocab, rngs=rngs)

        def __call__(self, tokens: jax.Array) -> jax.Array:
            h = self.embed(tokens)
            mask = nnx.make_causal_mask(tokens)
            for b in self.blocks:
                h = b(h, mask)
            return self.head(self.ln(h))

    graphdef, state = nnx.split(nnx.eval_shape(lambda: GPT(nnx.Rngs(0))))

    def gpt(state: Any, tokens: jax.Array) -> jax.Array:
        return nnx.merge(graphdef, state)(tokens)

    shapes = jax.tree.map(lambda a: S(a.shape, a.dtype), state)
    return gpt, (shapes, S((batch, seq), "int32"))
