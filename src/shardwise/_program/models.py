"""Built-in models to plan: plain JAX functions and the shapes of their arguments.

- ``mlp``: ``relu(x @ w1) @ w2``;
- ``transformer``: L pre-LayerNorm blocks (multi-head attention, then an MLP, each with a
  residual), stacked with ``lax.scan`` over parameters that carry a leading layer dimension,
  as large models are written so that they compile once per block, not once per layer;
- ``llama``: a Llama-style decoder (:mod:`.llama`), sized by name or by dimensions.

Forward functions take ``(x, params)``; losses take ``(params, x, y)`` (the mean squared error
against ``y``), as :func:`shardwise.plan` with ``train=True`` expects.

>>> fn, args = model("mlp", batch=8, hidden=16, ffn=32)
>>> fn(*[jnp.ones(a.shape, a.dtype) for a in jax.tree.leaves(args)[:1]],
...    {k: jnp.ones(v.shape) for k, v in args[1].items()}).shape
(8, 16)
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from shardwise._errors import ArgumentError
from shardwise._program.llama import llama, sized
from shardwise._program.optimizers import OPTIMIZERS, adamw, adamw_state
from shardwise._xla.dtypes import supported

MODELS = ("mlp", "transformer", "llama")
SEQ = 128
"""The transformer's sequence length where none is given."""
HEADS = 8
"""The transformer's attention heads where none are given."""
S = jax.ShapeDtypeStruct


def mlp(x: jax.Array, params: dict[str, jax.Array]) -> jax.Array:
    """A two-layer perceptron: ``relu(x @ w1) @ w2``."""
    h = jax.nn.relu(x @ params["w1"])
    return h @ params["w2"]


def _norm(h: jax.Array) -> jax.Array:
    mean = jnp.mean(h, axis=-1, keepdims=True)
    var = jnp.mean((h - mean) ** 2, axis=-1, keepdims=True)
    return (h - mean) * jax.lax.rsqrt(var + 1e-5)


def block(h: jax.Array, p: dict[str, jax.Array]) -> jax.Array:
    """One pre-LayerNorm transformer block on ``h`` of shape (batch, seq, hidden)."""
    a = _norm(h)
    q = jnp.einsum("bsh,hnd->bsnd", a, p["wq"])
    k = jnp.einsum("bsh,hnd->bsnd", a, p["wk"])
    v = jnp.einsum("bsh,hnd->bsnd", a, p["wv"])
    scores = jnp.einsum("bsnd,btnd->bnst", q, k) / math.sqrt(q.shape[-1])
    weights = jax.nn.softmax(scores, axis=-1)
    o = jnp.einsum("bnst,btnd->bsnd", weights, v)
    h = h + jnp.einsum("bsnd,ndh->bsh", o, p["wo"])
    m = _norm(h)
    return h + jax.nn.gelu(m @ p["w1"]) @ p["w2"]


def transformer(x: jax.Array, params: dict[str, jax.Array]) -> jax.Array:
    """L transformer blocks over ``params`` stacked along a leading layer dimension."""

    def layer(h: jax.Array, p: dict[str, jax.Array]) -> tuple[jax.Array, None]:
        return block(h, p), None

    out, _ = jax.lax.scan(layer, x, params)
    return out


def loss_of(forward: Callable[..., jax.Array]) -> Callable[..., jax.Array]:
    """``loss(params, x, y)``: the mean squared error of ``forward(x, params)`` against ``y``."""

    def loss(params: Any, x: jax.Array, y: jax.Array) -> jax.Array:
        return jnp.mean((forward(x, params) - y) ** 2)

    loss.__name__ = f"{forward.__name__}_loss"
    return loss


def model(
    name: str,
    *,
    batch: int,
    hidden: int | None = None,
    ffn: int | None = None,
    seq: int = SEQ,
    heads: int | None = None,
    layers: int | None = None,
    train: bool = False,
    dtype: str | None = None,
    size: str | None = None,
    kv_heads: int | None = None,
    head_dim: int | None = None,
    vocab: int | None = None,
    master: bool = False,
    optimizer: str | None = None,
    remat: str = "none",
    attention: str = "dot_product",
    microbatches: int = 1,
) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """A built-in model's function and argument shapes: ``(forward, (x, params))``, or with
    ``train=True`` ``(loss, (params, x, y))``: plain JAX functions to plan, run or read.
    With ``train=True`` and ``optimizer="adamw"``, the whole training step instead,
    ``(step, (params, opt_state, x, y))`` (:func:`~shardwise._program.optimizers.adamw`, its
    gradient accumulated over ``microbatches`` parts of the batch): plan it as it is.

    ``mlp`` is ``relu(x @ w1) @ w2``; ``transformer`` is ``layers`` pre-LayerNorm blocks
    (attention, then an MLP; 8 heads, 1 layer unless given) under ``lax.scan``; both need
    ``hidden`` and ``ffn`` (float32 by default).

    ``llama`` is a Llama-style decoder (:mod:`shardwise._program.llama`) on int32 tokens
    (batch, seq), returning float32 logits; its loss is the cross-entropy against int32
    next-token labels. ``size`` names one (``llama2-7b``, ``llama2-13b``,
    ``llama3-8b``, ``llama3-70b``, or ``maxtext-<global_parameter_scale>``); the dimensions
    given (``hidden``, ``layers``, ``heads``, ``kv_heads``, ``head_dim``, ``ffn``,
    ``vocab``) replace the named size's, or without a size describe the model. Weights are
    bfloat16 unless ``dtype`` says otherwise; ``master=True`` keeps float32 master copies
    (a step's gradients and update in float32). ``remat``: the layers' remat policy
    (:data:`~shardwise._program.llama.REMAT`); ``attention``: ``dot_product`` or ``flash``.

    >>> import shardwise
    >>> fn, (x, params) = shardwise.model("mlp", batch=64, hidden=32, ffn=128)
    >>> x.shape, sorted(params)
    ((64, 32), ['w1', 'w2'])
    >>> shardwise.plan(fn, x, params, mesh="data=2,model=4", profile="cpu-2core").chosen.name
    'search'
    >>> loss, (params, tokens, labels) = shardwise.model(
    ...     "llama", size="llama3-8b", batch=8, seq=2048, train=True)
    >>> params["layers"]["wk"].shape, params["head"].dtype, tokens.dtype
    ((32, 4096, 8, 128), dtype(bfloat16), dtype('int32'))
    """
    if optimizer is not None or microbatches != 1:
        return _stepped(name, optimizer, train, microbatches, batch=batch, hidden=hidden,
                        ffn=ffn, seq=seq, heads=heads, layers=layers, dtype=dtype, size=size,
                        kv_heads=kv_heads, head_dim=head_dim, vocab=vocab, master=master,
                        remat=remat, attention=attention)  # fmt: skip
    _whole(batch=batch, seq=seq, hidden=hidden, ffn=ffn, heads=heads, layers=layers,
           kv_heads=kv_heads, head_dim=head_dim, vocab=vocab)  # fmt: skip
    if name == "llama":
        dims = dict(hidden=hidden, ffn=ffn, heads=heads, layers=layers, kv_heads=kv_heads,
                    head_dim=head_dim, vocab=vocab)  # fmt: skip
        computed = _floating(name, dtype or "bfloat16")
        return llama(sized(size, **dims), batch=batch, seq=seq, train=train, dtype=computed,
                     master=master, remat=remat, attention=attention)  # fmt: skip
    if name not in MODELS:
        raise ArgumentError(f"no built-in model {name!r}; the models are {', '.join(MODELS)}.")
    _only_llama(name, size=size, kv_heads=kv_heads, head_dim=head_dim, vocab=vocab,
                master=master or None, remat=None if remat == "none" else remat,
                attention=None if attention == "dot_product" else attention)  # fmt: skip
    _none_for_mlp(name, heads=heads, layers=layers, seq=None if seq == SEQ else seq)
    if hidden is None or ffn is None:
        raise ArgumentError(f"model {name!r} is sized by hidden and ffn: give both.")
    forward, (x, params) = _simple(
        name, batch, hidden, ffn, seq, heads or HEADS, layers or 1, dtype
    )
    if train:
        return loss_of(forward), (params, x, x)
    return forward, (x, params)


def _whole(**sizes: Any) -> None:
    """Refuse a size given that is not a whole number of at least 1 (``None``: not given):
    ``seq=1.5`` had built a shape ``(8, 1.5)`` and ``batch=True`` a batch of 1."""
    for label, n in sizes.items():
        if n is not None and (isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1):
            raise ArgumentError(f"{label} is {n!r}; model sizes are whole numbers of at least 1.")


def _floating(name: str, dtype: str, ints: bool = False) -> str:
    """The built-in model's weights' dtype, a float type (or with ``ints``, an integer one:
    the MLP computes in any) JAX computes in here: ``int8`` had failed inside the Llama, said
    as the user's code, and ``float64`` without JAX's 64-bit mode had been planned as float32
    with no word but JAX's warning."""
    kind = supported(dtype, f"model {name!r}")
    if not jnp.issubdtype(kind, jnp.floating) and not (ints and jnp.issubdtype(kind, jnp.integer)):
        raise ArgumentError(f"model {name!r} computes in floats; dtype {kind.name} is not one.")
    if kind.itemsize == 8 and not jax.config.read("jax_enable_x64"):  # (int64 alike)
        raise ArgumentError(
            f"model {name!r} in float64 needs JAX's 64-bit mode: run "
            "jax.config.update('jax_enable_x64', True) first (JAX_ENABLE_X64=1 from the "
            "command line), or choose float32."
        )
    return kind.name


def remat_variants(
    name: str, policies: Sequence[str], **settings: Any
) -> dict[str, tuple[Callable[..., Any], tuple[Any, ...]]]:
    """The built-in model ``name`` (:func:`model`'s ``settings``) under each remat policy of
    ``policies``, by policy: the programs :func:`~shardwise.choose_mesh` takes as
    ``variants`` (a model other than the Llama takes no policy: give it ``("none",)``)."""
    out = {}
    for r in policies:
        extra: dict[str, Any] = {"remat": r} if name == "llama" else {}
        out[r] = model(name, **settings, **extra)
    return out


def _none_for_mlp(name: str, **given: Any) -> None:
    """Refuse the transformer's sizes ``given`` (``None``: not given) for the mlp (ignored,
    they had planned another model than asked)."""
    named = [k for k, v in given.items() if v is not None]
    if name == "mlp" and named:
        raise ArgumentError(
            f"{', '.join(named)}: model 'mlp' is one layer pair on (batch, hidden) rows, sized "
            "by batch, hidden and ffn; these size model 'transformer' (or 'llama')."
        )


def _only_llama(name: str, **only: Any) -> None:
    """Refuse the settings ``only`` the Llama takes (``None``: not given) for model ``name``."""
    given = [k for k, v in only.items() if v is not None]
    if given:
        raise ArgumentError(
            f"{', '.join(given)}: only model 'llama' takes these; model {name!r} is sized by "
            f"hidden and ffn{' (and heads, layers, seq)' if name == 'transformer' else ''}."
        )


def _stepped(
    name: str, optimizer: str | None, train: bool, microbatches: int, **sizes: Any
) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """:func:`model`'s training step with ``optimizer``'s state."""
    if microbatches < 1:
        raise ArgumentError(f"microbatches={microbatches}: give a whole number of at least 1.")
    if optimizer is None:
        raise ArgumentError(
            f"microbatches={microbatches} accumulates a training step's gradient: give "
            "optimizer='adamw' and train=True (--optimizer adamw --train)."
        )
    if optimizer not in OPTIMIZERS:
        raise ArgumentError(
            f"no optimizer {optimizer!r}; the optimizers are {', '.join(OPTIMIZERS)} (plain "
            "SGD: plan the loss with train=True)."
        )
    if not train:
        raise ArgumentError(f"optimizer={optimizer!r} makes a training step: give train=True.")
    batch = sizes["batch"]
    if batch % microbatches:
        raise ArgumentError(
            f"microbatches={microbatches} does not divide the batch of {batch}: give a "
            "number of equal parts of it."
        )
    loss, (params, *data) = model(name, train=True, **sizes)
    return adamw(loss, microbatches=microbatches), (params, adamw_state(params), *data)


def _simple(
    name: str, batch: int, hidden: int, ffn: int, seq: int, heads: int, layers: int,
    dtype: str | None,
) -> tuple[Callable[..., jax.Array], tuple[Any, Any]]:  # fmt: skip
    """The mlp's or the transformer's forward and ``(x, params)``."""
    dtype = _floating(name, dtype or "float32", ints=name == "mlp")
    if name == "mlp":
        x = S((batch, hidden), dtype)
        return mlp, (x, {"w1": S((hidden, ffn), dtype), "w2": S((ffn, hidden), dtype)})
    if hidden % heads:
        raise ArgumentError(
            f"hidden size {hidden} does not divide into {heads} heads; give a hidden size "
            f"that is a multiple of --heads (e.g. {heads * max(1, hidden // heads)})."
        )
    d = hidden // heads
    qkv = S((layers, hidden, heads, d), dtype)
    params = {
        "wq": qkv,
        "wk": qkv,
        "wv": qkv,
        "wo": S((layers, heads, d, hidden), dtype),
        "w1": S((layers, hidden, ffn), dtype),
        "w2": S((layers, ffn, hidden), dtype),
    }
    return transformer, (S((batch, seq, hidden), dtype), params)
