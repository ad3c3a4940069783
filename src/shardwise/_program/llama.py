"""A Llama-style decoder to plan: the shape of Llama 2 and 3 and of MaxText's default model.

Token embedding lookup; ``layers`` blocks stacked with ``lax.scan`` over parameters that carry
a leading layer dimension, each a pre-RMSNorm grouped-query attention with rotary embeddings
(RoPE, in the *rotate-half* form of Hugging Face's ``LlamaForCausalLM`` and MaxText: the first
half of each head's features paired with the second half) under a causal mask, then a
pre-RMSNorm SwiGLU MLP (``w_down(silu(x @ w_gate) * (x @ w_up))``), each with a residual; a
final RMSNorm and an untied vocabulary head. The loss is the mean cross-entropy of the logits
against next-token labels (integers, as the data pipeline hands them over: the tokens shifted
by one), written with a one-hot target as MaxText writes it.

Sizes by name (:data:`SIZES`, each with its source), MaxText's ``global_parameter_scale``
family as ``maxtext-<scale>`` (:func:`maxtext_size`), or by dimensions.

>>> SIZES["llama3-8b"].parameters
8030261248
>>> maxtext_size(8).describe()
'maxtext-8: d_model 4096, 32 layers, 32 heads (32 kv, head_dim 128), ffn 14336, vocab 32000'
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import jax
import jax.numpy as jnp

from shardwise._errors import ArgumentError
from shardwise._program.flash import flash_attention

S = jax.ShapeDtypeStruct
Params = dict[str, Any]

_HF = "Hugging Face config.json of"


@dataclass(frozen=True, slots=True)
class LlamaSize:
    """A Llama-style decoder's dimensions.

    Attributes:
        name: what it is called (``llama3-8b``; ``custom`` for one given by dimensions).
        hidden: the model width, ``d_model``.
        layers: decoder blocks.
        heads: query heads.
        kv_heads: key/value heads (grouped-query attention; ``heads`` for plain multi-head).
        head_dim: features per head (``hidden // heads`` in Llama; 128 in MaxText whatever
            the width).
        ffn: the SwiGLU MLP's inner width.
        vocab: vocabulary size.
        rope_theta: RoPE's base wavelength.
        source: where the figures come from.
    """

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    rope_theta: float = 10_000.0
    source: str = "given by dimensions"

    @property
    def parameters(self) -> int:
        """The parameter count: embedding and head, and per layer the attention's four
        projections, the MLP's three and the two norms' scales; the final norm's."""
        d, hd = self.hidden, self.head_dim
        attention = d * hd * (2 * self.heads + 2 * self.kv_heads)
        per_layer = attention + 3 * d * self.ffn + 2 * d
        return self.layers * per_layer + 2 * self.vocab * d + d

    def describe(self) -> str:
        """One line: the name and the dimensions."""
        return (
            f"{self.name}: d_model {self.hidden}, {self.layers} layers, {self.heads} heads "
            f"({self.kv_heads} kv, head_dim {self.head_dim}), ffn {self.ffn}, vocab {self.vocab}"
        )


SIZES: dict[str, LlamaSize] = {
    s.name: s
    for s in (
        LlamaSize(
            "llama2-7b", 4096, 32, 32, 32, 128, 11008, 32000, 10_000.0,
            f"{_HF} meta-llama/Llama-2-7b-hf; Touvron et al. 2023 (arXiv:2307.09288), "
            "Table 1; 6,738,415,616 parameters",
        ),
        LlamaSize(
            "llama2-13b", 5120, 40, 40, 40, 128, 13824, 32000, 10_000.0,
            f"{_HF} meta-llama/Llama-2-13b-hf; Touvron et al. 2023 (arXiv:2307.09288), "
            "Table 1; 13,015,864,320 parameters",
        ),
        LlamaSize(
            "llama3-8b", 4096, 32, 32, 8, 128, 14336, 128256, 500_000.0,
            f"{_HF} meta-llama/Meta-Llama-3-8B; Llama Team 2024 (arXiv:2407.21783), Table 3; "
            "8,030,261,248 parameters",
        ),
        LlamaSize(
            "llama3-70b", 8192, 80, 64, 8, 128, 28672, 128256, 500_000.0,
            f"{_HF} meta-llama/Meta-Llama-3-70B; Llama Team 2024 (arXiv:2407.21783), "
            "Table 3; 70,553,706,496 parameters",
        ),
    )
}  # fmt: skip
"""The published Llama sizes."""

MAXTEXT_BASE = LlamaSize(
    "maxtext-1", 2048, 16, 16, 16, 128, 7168, 32000, 10_000.0,
    "MaxText src/maxtext/configs/base.yml (base_emb_dim 2048, base_num_query_heads 16, "
    "base_num_kv_heads 16, base_mlp_dim 7168, base_num_decoder_layers 16, head_dim 128, "
    "vocab_size 32000), scaled by get_individual_scales in src/maxtext/configs/types.py "
    "(AI-Hypercomputer/maxtext e591f30c)",
)  # fmt: skip
"""MaxText's default decoder, ``global_parameter_scale: 1``."""


def maxtext_size(scale: int) -> LlamaSize:
    """MaxText's decoder at ``global_parameter_scale`` ``scale`` (a power of two): of
    ``log2(scale) = 3b + r``, the heads and the MLP width double ``b + (r > 0)`` times, the
    width ``b + (r > 1)`` times, the layers ``b`` times; ``head_dim`` stays 128 (so the heads'
    total width may differ from the model's).

    >>> [maxtext_size(s).parameters // 10**8 for s in (1, 8, 64)]
    [11, 80, 628]
    """
    if scale < 1 or scale & (scale - 1):
        raise ArgumentError(
            f"MaxText's global_parameter_scale is a power of two, not {scale}: give "
            "maxtext-1, maxtext-2, maxtext-4, … (e.g. maxtext-8 for its 8B)."
        )
    base, rem = divmod(scale.bit_length() - 1, 3)
    heads = 2 ** (base + (rem > 0))
    b = MAXTEXT_BASE
    return replace(
        b,
        name=f"maxtext-{scale}",
        hidden=b.hidden * 2 ** (base + (rem > 1)),
        layers=b.layers * 2**base,
        heads=b.heads * heads,
        kv_heads=b.kv_heads * heads,
        ffn=b.ffn * heads,
    )


def named_size(name: str) -> LlamaSize:
    """The size called ``name``: one of :data:`SIZES` or ``maxtext-<scale>``."""
    if isinstance(name, str) and name in SIZES:
        return SIZES[name]
    prefix, _, scale = name.partition("maxtext-") if isinstance(name, str) else (name, "", "")
    if not prefix and scale.isdigit():
        return maxtext_size(int(scale))
    raise ArgumentError(
        f"no Llama size {name!r}; the sizes are {', '.join(SIZES)} and maxtext-<scale> "
        "(MaxText's global_parameter_scale, a power of two: maxtext-1, maxtext-8, …)."
    )


def sized(size: str | None, **dims: int | None) -> LlamaSize:
    """The size called ``size`` with the ``dims`` given (not ``None``) in place of its own,
    or, with no name, the size ``dims`` describe (``hidden``, ``layers``, ``heads``, ``ffn``
    and ``vocab`` all needed; ``kv_heads`` defaults to ``heads``, ``head_dim`` to
    ``hidden // heads``)."""
    given = {k: v for k, v in dims.items() if v is not None}
    for label, n in given.items():
        if n < 1:
            raise ArgumentError(f"{label} is {n}; model sizes are whole numbers of at least 1.")
    if size is not None:
        base = named_size(size)
        return replace(base, name=base.name if not given else f"{base.name}*", **given)  # type: ignore[arg-type]
    missing = [k for k in ("hidden", "layers", "heads", "ffn", "vocab") if k not in given]
    if missing:
        raise ArgumentError(
            f"a Llama by dimensions needs {', '.join(missing)}; or name a size "
            f"({', '.join(SIZES)}, maxtext-<scale>)."
        )
    given.setdefault("kv_heads", given["heads"])
    given.setdefault("head_dim", given["hidden"] // given["heads"])
    return LlamaSize(name="custom", **given)  # type: ignore[arg-type]


def check(size: LlamaSize) -> None:
    """Refuse dimensions the blocks cannot use, saying which and the fix."""
    if size.heads % size.kv_heads:
        raise ArgumentError(
            f"{size.heads} query heads do not group evenly over {size.kv_heads} key/value "
            f"heads; give a kv_heads that divides heads (e.g. {math.gcd(size.heads, 8)})."
        )
    if size.head_dim % 2:
        raise ArgumentError(
            f"head_dim {size.head_dim} is odd; rotary embeddings rotate pairs of features: "
            "give an even head_dim."
        )


def parameter_shapes(size: LlamaSize, dtype: str) -> Params:
    """The parameters' shapes: ``embed``, ``layers`` (stacked along a leading layer
    dimension), ``final_norm`` and ``head``."""
    d, n, hd, f, v = size.hidden, size.layers, size.head_dim, size.ffn, size.vocab
    return {
        "embed": S((v, d), dtype),
        "layers": {
            "attn_norm": S((n, d), dtype),
            "wq": S((n, d, size.heads, hd), dtype),
            "wk": S((n, d, size.kv_heads, hd), dtype),
            "wv": S((n, d, size.kv_heads, hd), dtype),
            "wo": S((n, size.heads, hd, d), dtype),
            "mlp_norm": S((n, d), dtype),
            "w_gate": S((n, d, f), dtype),
            "w_up": S((n, d, f), dtype),
            "w_down": S((n, f, d), dtype),
        },
        "final_norm": S((d,), dtype),
        "head": S((d, v), dtype),
    }


def rms_norm(h: jax.Array, scale: jax.Array, eps: float = 1e-5) -> jax.Array:
    """``h / rms(h) * scale`` over the last dimension, computed in float32."""
    x = h.astype(jnp.float32)
    x = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)
    return (x * scale.astype(jnp.float32)).astype(h.dtype)


def rope(x: jax.Array, theta: float) -> jax.Array:
    """Rotary embeddings on ``x`` (batch, seq, heads, head_dim), rotate-half form: feature
    ``i`` of the first half and ``i`` of the second are rotated by ``pos * theta**(-2i/hd)``."""
    seq, hd = x.shape[1], x.shape[-1]
    freq = theta ** (-jnp.arange(0, hd, 2, dtype=jnp.float32) / hd)
    angle = jnp.arange(seq, dtype=jnp.float32)[:, None] * freq[None, :]
    cos, sin = (f(angle)[None, :, None, :].astype(x.dtype) for f in (jnp.cos, jnp.sin))
    x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def attention(a: jax.Array, p: Params, theta: float, flash: bool = False) -> jax.Array:
    """Grouped-query causal self-attention of ``a`` (batch, seq, hidden): each of the
    ``kv_heads`` key/value heads serves ``heads // kv_heads`` consecutive query heads; with
    ``flash``, a block of keys at a time (:func:`~shardwise._program.flash.flash_attention`,
    blocks of :func:`flash_block` keys)."""
    b, s, _ = a.shape
    n, kv, hd = p["wq"].shape[-2], p["wk"].shape[-2], p["wq"].shape[-1]
    q = rope(jnp.einsum("bsh,hnd->bsnd", a, p["wq"]), theta)
    k = rope(jnp.einsum("bsh,hkd->bskd", a, p["wk"]), theta)
    v = jnp.einsum("bsh,hkd->bskd", a, p["wv"])
    q = q.reshape(b, s, kv, n // kv, hd)
    if flash:
        blocked = flash_attention(q, k, v, flash_block(s)).reshape(b, s, n, hd)
        return jnp.einsum("bsnd,ndh->bsh", blocked, p["wo"])
    scores = jnp.einsum("bskgd,btkd->bkgst", q, k).astype(jnp.float32) / math.sqrt(hd)
    causal = jnp.tril(jnp.ones((s, s), dtype=bool))
    scores = jnp.where(causal, scores, -3.4e38)  # float32's lowest: masked out
    weights = jax.nn.softmax(scores, axis=-1).astype(a.dtype)
    o = jnp.einsum("bkgst,btkd->bskgd", weights, v).reshape(b, s, n, hd)
    out: jax.Array = jnp.einsum("bsnd,ndh->bsh", o, p["wo"])
    return out


def flash_block(seq: int) -> int:
    """Keys per block of flash attention: ``gcd(seq, 512)``, halved where that is all of an
    even ``seq`` (at least two blocks).

    >>> flash_block(2048), flash_block(16), flash_block(96)
    (512, 8, 32)
    """
    found = math.gcd(seq, 512)
    return found // 2 if found == seq and seq % 2 == 0 else found


def block(h: jax.Array, p: Params, theta: float, flash: bool = False) -> jax.Array:
    """One Llama block on ``h`` (batch, seq, hidden): attention, then the SwiGLU MLP, each
    after an RMSNorm and with a residual."""
    h = h + attention(rms_norm(h, p["attn_norm"]), p, theta, flash)
    m = rms_norm(h, p["mlp_norm"])
    gated = jax.nn.silu(m @ p["w_gate"]) * (m @ p["w_up"])
    out: jax.Array = h + gated @ p["w_down"]
    return out


REMAT: dict[str, Callable[..., bool] | None] = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "minimal": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
    "save_dots": jax.checkpoint_policies.checkpoint_dots,
}
"""Remat policies of a layer, by MaxText's ``remat_policy`` names: ``none`` keeps every
activation for the backward pass; ``full`` keeps only each layer's input and recomputes the
layer (``nothing_saveable``); ``minimal`` keeps the results of the weight matrix products and
recomputes the rest (``checkpoint_dots_with_no_batch_dims``, MaxText's ``minimal``);
``save_dots`` keeps every matrix product's result, attention's too (``checkpoint_dots``)."""

ATTENTION = ("dot_product", "flash")
"""How attention is computed, by MaxText's ``attention`` names: ``dot_product`` makes every
query's scores against every key at once (a ``seq × seq`` matrix per head); ``flash`` a block
of keys at a time, keeping a running softmax, recomputing each block in the backward pass
(:mod:`~shardwise._program.flash`): the same numbers, without the matrix."""


def decoder(
    theta: float, dtype: str, remat: str = "none", attention: str = "dot_product"
) -> Callable[..., jax.Array]:
    """The forward pass ``llama(tokens, params)`` → logits (batch, seq, vocab) in float32,
    computing in ``dtype`` (weights stored in another dtype are cast to it where used), each
    layer under the :data:`REMAT` policy ``remat``, its attention as :data:`ATTENTION` says."""

    def cast(tree: Any) -> Any:
        return jax.tree.map(lambda w: w.astype(dtype), tree)

    def layer(h: jax.Array, p: Params) -> tuple[jax.Array, None]:
        return block(h, cast(p), theta, attention == "flash"), None

    if remat != "none":
        layer = jax.checkpoint(layer, policy=REMAT[remat], prevent_cse=False)

    def llama(tokens: jax.Array, params: Params) -> jax.Array:
        h = jnp.take(cast(params["embed"]), tokens, axis=0)
        h, _ = jax.lax.scan(layer, h, params["layers"])
        h = rms_norm(h, cast(params["final_norm"]))
        logits: jax.Array = (h @ cast(params["head"])).astype(jnp.float32)
        return logits

    return llama


def cross_entropy(forward: Callable[..., jax.Array]) -> Callable[..., jax.Array]:
    """``loss(params, tokens, labels)``: the mean cross-entropy of ``forward(tokens, params)``
    against the next-token ``labels`` (integers, one per position)."""

    def loss(params: Params, tokens: jax.Array, labels: jax.Array) -> jax.Array:
        logits = forward(tokens, params)
        target = jax.nn.one_hot(labels, logits.shape[-1], dtype=logits.dtype)
        return -jnp.mean(jnp.sum(target * jax.nn.log_softmax(logits, axis=-1), axis=-1))

    loss.__name__ = f"{forward.__name__}_loss"
    return loss


def llama(
    size: LlamaSize, *, batch: int, seq: int, train: bool, dtype: str, master: bool,
    remat: str = "none", attention: str = "dot_product",
) -> tuple[Callable[..., Any], tuple[Any, ...]]:  # fmt: skip
    """The decoder of ``size`` and its arguments' shapes: ``(forward, (tokens, params))``, or
    with ``train`` ``(loss, (params, tokens, labels))``; tokens and labels are int32
    (batch, seq). Weights are ``dtype``; with ``master`` they are float32 master copies,
    cast to ``dtype`` where each is used, so a training step's gradients and update are in
    float32 (4 bytes a parameter held, and a ``dtype`` copy of each layer's weights while
    it computes). ``remat`` names the layers' :data:`REMAT` policy, ``attention`` one of
    :data:`ATTENTION`."""
    check(size)
    if remat not in REMAT:
        raise ArgumentError(
            f"no remat policy {remat!r}; the policies are {', '.join(REMAT)} (MaxText's "
            "remat_policy names)."
        )
    if attention not in ATTENTION:
        raise ArgumentError(
            f"no attention {attention!r}; give one of {', '.join(ATTENTION)} (MaxText's names)."
        )
    stored = "float32" if master else dtype
    params = parameter_shapes(size, stored)
    tokens = S((batch, seq), "int32")
    forward = decoder(size.rope_theta, dtype, remat, attention)
    if train:
        return cross_entropy(forward), (params, tokens, tokens)
    return forward, (tokens, params)
