"""Small functions of every kind a user writes, each planned and verified: whether every
plan's result equals ``jax.jit`` of the function, whether every plan's predicted collectives
(kind, mesh axes, bytes) are the compiled HLO's, and the compiled ÷ predicted memory per
device. Reductions, sorts, loops, conditionals, linear algebra, gathers and scatters,
attention, gradients, empty arrays, scalars, every dtype, and the pieces models are made of
(RMSNorm, rotary embeddings, SwiGLU, grouped-query attention, a Llama block and its gradient,
a tied-embedding loss, a mixture of experts, a clipped AdamW step, a KV cache, ...); on 8
simulated CPU devices. The AdamW step needs Optax (``pip install shardwise[models]``).

    .venv/bin/python benchmarks/hlo_cases.py [--mesh data=2,model=4] [--out FILE.json] [CASE ...]

The memory of these programs of a few KiB is mostly XLA's own small buffers: its ratios are
printed, not judged (``tests/test_library_models.py`` judges memory on real models).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import shardwise

shardwise.use_cpu_devices(8)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

_rng = np.random.default_rng(0)


def _r(*shape: int, dtype: Any = jnp.float32) -> jax.Array:
    return jnp.asarray(_rng.standard_normal(shape), dtype)


X, W, V = _r(16, 32), _r(32, 64), _r(64, 32)
LABELS = jnp.asarray(_rng.integers(0, 64, (16,)), jnp.int32)
SQUARE = _r(32, 32)
SPD = SQUARE @ SQUARE.T + 32 * jnp.eye(32)
Q = _r(2, 16, 4, 8)


def _grad_only(x: Any, w: Any) -> Any:
    return jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w)))(w)


def _cross_entropy(x: Any, w: Any, labels: Any) -> Any:
    logits = x @ w
    picked = jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], axis=1)
    return -picked.mean()


@jax.custom_vjp
def _relu(h: Any) -> Any:
    return jnp.maximum(h, 0)


_relu.defvjp(lambda h: (jnp.maximum(h, 0), h), lambda h, g: (g * (h > 0),))

Case = tuple[Callable[..., Any], tuple[Any, ...]]
CASES: dict[str, Case] = {
    "norm": (lambda x, w: jnp.linalg.norm(x @ w, axis=-1), (X, W)),
    "softmax with where": (lambda x, w: jax.nn.softmax(x @ w, where=(x @ w) > 0), (X, W)),
    "einsum of three": (lambda x, w, v: jnp.einsum("ab,bc,cd->ad", x, w, v), (X, W, V)),
    "fori_loop": (lambda x, w: lax.fori_loop(0, 3, lambda i, h: jnp.tanh(h @ w @ V), x), (X, W)),
    "cond": (lambda x, w: lax.cond(x.sum() > 0, lambda a: a @ w, lambda a: -(a @ w), x), (X, W)),
    "while_loop": (
        lambda x, w: lax.while_loop(
            lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] * 0.5), (0, x @ w)
        )[1],
        (X, W),
    ),
    "logsumexp": (lambda x, w: jax.nn.logsumexp(x @ w, axis=0), (X, W)),
    "argsort": (lambda x, w: jnp.argsort(x @ w, axis=1), (X, W)),
    "sort": (lambda x, w: jnp.sort(x @ w, axis=0), (X, W)),
    "top_k": (lambda x, w: lax.top_k(x @ w, 5)[0], (X, W)),
    "approx_max_k": (lambda x, w: lax.approx_max_k(x @ w, 5)[0], (X, W)),
    "concatenate": (lambda x, w: jnp.concatenate([x @ w, x @ w * 2], axis=1), (X, W)),
    "split": (lambda x, w: sum(jnp.split(x @ w, 4, axis=1)), (X, W)),
    "cumprod": (lambda x, w: jnp.cumprod(x @ w, axis=1), (X, W)),
    "reversed cumsum": (lambda x, w: jnp.cumsum((x @ w)[::-1], axis=0), (X, W)),
    "roll": (lambda x, w: jnp.roll(x @ w, 3, axis=0), (X, W)),
    "pad": (lambda x, w: jnp.pad(x @ w, ((1, 1), (0, 0))), (X, W)),
    "take": (lambda x, w: jnp.take(w, jnp.array([1, 5, 7]), axis=1), (X, W)),
    "outer, kron": (
        lambda x, w: jnp.outer(x[0], w[:, 0]) + jnp.kron(x[:2, :2], w[:2, :2]).sum(),
        (X, W),
    ),
    "var": (lambda x, w: jnp.var(x @ w, axis=0, ddof=1), (X, W)),
    "tril": (lambda x, w: jnp.tril(x @ x.T), (X, W)),
    "batched matmul": (lambda x, w: jnp.matmul(x.reshape(2, 8, 32), w), (X, W)),
    "vmap": (lambda x, w: jax.vmap(lambda r: r @ w)(x), (X, W)),
    "reduce_window": (
        lambda x, w: lax.reduce_window(x @ w, -jnp.inf, lax.max, (2, 2), (2, 2), "VALID"),
        (X, W),
    ),
    "scan": (
        lambda x, w: lax.scan(lambda c, r: (c + jnp.tanh(r @ w), None), jnp.zeros(64), x)[0],
        (X, W),
    ),
    "lax.map": (lambda x, w: lax.map(lambda r: jnp.tanh(r @ w), x), (X, W)),
    "integers": (lambda x, w: (x @ w).astype(jnp.int32) * 3, (X, W)),
    "int8 matmul to int32": (
        lambda a, b: lax.dot(a, b, preferred_element_type=jnp.int32),
        ((X * 10).astype(jnp.int8), (W * 10).astype(jnp.int8)),
    ),
    "complex": (lambda x, w: jnp.abs((x + 1j * x) @ w), (X, W)),
    "float16": (lambda x, w: jnp.tanh(x @ w), (X.astype(jnp.float16), W.astype(jnp.float16))),
    "bfloat16": (lambda x, w: jnp.tanh(x @ w), (X.astype(jnp.bfloat16), W.astype(jnp.bfloat16))),
    "cast to bfloat16": (lambda x, w: x.astype(jnp.bfloat16) @ w.astype(jnp.bfloat16), (X, W)),
    "bfloat16 gradient": (_grad_only, (X.astype(jnp.bfloat16), W.astype(jnp.bfloat16))),
    "mixed precision": (lambda x, w: x @ w.astype(jnp.bfloat16), (X, W)),
    "gradient without its value": (_grad_only, (X, W)),
    "custom_vjp gradient": (lambda x, w: jax.grad(lambda w: _relu(x @ w).sum())(w), (X, W)),
    "checkpoint with a policy": (
        lambda x, w: jax.grad(
            lambda w: jax.checkpoint(
                lambda w: jnp.tanh(x @ w) @ V, policy=jax.checkpoint_policies.dots_saveable
            )(w).sum()
        )(w),
        (X, W),
    ),
    "layer norm gradient": (
        lambda x, w: jax.grad(
            lambda w: (
                ((h := x @ w) - h.mean(-1, keepdims=True))
                / jnp.sqrt(h.var(-1, keepdims=True) + 1e-5)
            ).sum()
        )(w),
        (X, W),
    ),
    "cross-entropy": (_cross_entropy, (X, W, LABELS)),
    "cross-entropy gradient": (jax.grad(_cross_entropy, argnums=1), (X, W, LABELS)),
    "one-hot": (lambda x, w, lab: (jax.nn.one_hot(lab, 64) * (x @ w)).sum(), (X, W, LABELS)),
    "scatter-add rows": (lambda x, w, lab: jnp.zeros((64, 64)).at[lab].add(x @ w), (X, W, LABELS)),
    ".at[].set": (lambda x, w: (x @ w).at[:, 3].set(0.0), (X, W)),
    "dynamic_slice": (
        lambda x, w, lab: lax.dynamic_slice(x @ w, (lab[0] % 8, 0), (8, 64)),
        (X, W, LABELS),
    ),
    "segment_sum": (
        lambda x, ids: jax.ops.segment_sum(x, ids, num_segments=4),
        (X, jnp.arange(16) % 4),
    ),
    "cholesky": (lambda s, x: jnp.linalg.cholesky(s) @ x.T, (SPD, X)),
    "solve": (lambda s, x: jnp.linalg.solve(s, x.T), (SPD, X)),
    "qr": (lambda s, x: jnp.linalg.qr(s)[0] @ x.T, (SQUARE, X)),
    "associative_scan": (lambda x, w: lax.associative_scan(jnp.add, x @ w, axis=0), (X, W)),
    "fft": (lambda x, w: jnp.abs(jnp.fft.fft(x @ w, axis=1)), (X, W)),
    "searchsorted": (lambda a, v: jnp.searchsorted(a, v), (jnp.sort(_r(64)), _r(16))),
    "attention": (lambda q, k: jax.nn.dot_product_attention(q, k, k, is_causal=True), (Q, Q[::-1])),
    "attention gradient": (
        lambda q, k: jax.grad(lambda q: jax.nn.dot_product_attention(q, k, k).sum())(q),
        (Q, Q[::-1]),
    ),
    "conv1d": (
        lambda b, k: lax.conv_general_dilated(
            b, k, (1,), "SAME", dimension_numbers=("NCH", "OIH", "NCH")
        ),
        (_r(4, 16, 32), _r(8, 16, 3)),
    ),
    "dot of vectors": (jnp.dot, (X[0], W[:, 0])),
    "gradient of a dot of vectors": (
        lambda a, b: jax.grad(lambda a: jnp.vdot(a, b) ** 2)(a),
        (X[0], W[:, 0]),
    ),
    "odd shapes": (lambda x, w: jnp.tanh(x @ w), (_r(10, 12), _r(12, 7))),
    "rank 5": (
        lambda x, w: jnp.einsum("abcde,ef->abcdf", x, w).sum((1, 2)),
        (_r(2, 4, 3, 8, 6), _r(6, 16)),
    ),
    "booleans": (lambda m, x: jnp.where(m, x, 0.0) @ x.T, (X > 0, X)),
    "scalars": (lambda a, b: a * b + 1, (jnp.float32(2), jnp.float32(3))),
    "a dict of weights": (lambda p, x: jnp.tanh(x @ p["a"]) @ p["b"], ({"a": W, "b": V}, X)),
    "the same result twice": (lambda x, w: (x @ w, x @ w), (X, W)),
    "an argument returned": (lambda x, w: (x, x @ w), (X, W)),
    "jnp.copy, stop_gradient": (lambda x, w: (jnp.copy(x) @ w, lax.stop_gradient(x)), (X, W)),
    "a constant result": (lambda x, w: (jnp.ones(3), x @ w), (X, W)),
    "slice to nothing": (lambda x, w: x[:0] @ w, (X, W)),
    "empty batch, summed": (lambda x, w: jnp.tanh(x @ w).sum(0), (jnp.zeros((0, 32)), W)),
    "empty operands of a dot": (jnp.matmul, (jnp.zeros((16, 0)), jnp.zeros((0, 64)))),
    "gradient over an empty batch": (_grad_only, (jnp.zeros((0, 32)), W)),
}


# Model pieces, as model code writes them: normalisations, rotary embeddings, gated MLPs,
# causal and grouped-query attention, a Llama block and its gradient, a tied-embedding
# language-model loss, a top-2 mixture of experts, a clipped AdamW step, an RNN, per-example
# gradients, a KV cache, depthwise convolutions and pooling.
B, S, D, H, HD, F, VOCAB = 8, 16, 32, 4, 8, 64, 64
X3 = _r(B, S, D)
W_QKV, W_O = _r(D, 3 * H * HD) * 0.1, _r(H * HD, D) * 0.1
W1, W3, W2 = _r(D, F) * 0.1, _r(D, F) * 0.1, _r(F, D) * 0.1
EMB = _r(VOCAB, D) * 0.1
TOKENS = jnp.asarray(_rng.integers(0, VOCAB, (B, S)), jnp.int32)
NEXT = jnp.asarray(_rng.integers(0, VOCAB, (B, S)), jnp.int32)
LLAMA = {"n1": jnp.ones(D), "qkv": W_QKV, "o": W_O, "n2": jnp.ones(D), "w1": W1, "w3": W3,
         "w2": W2}  # fmt: skip


def _rmsnorm(x: Any, scale: Any) -> Any:
    return x * lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale


def _rope(x: Any) -> Any:  # (batch, seq, heads, head_dim)
    s, d = x.shape[1], x.shape[-1]
    angle = jnp.arange(s)[:, None] / (10000 ** (jnp.arange(0, d, 2) / d))[None, :]
    sin, cos = jnp.sin(angle)[None, :, None, :], jnp.cos(angle)[None, :, None, :]
    x1, x2 = x[..., ::2], x[..., 1::2]
    return jnp.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1).reshape(x.shape)


def _swiglu(x: Any, w1: Any, w3: Any, w2: Any) -> Any:
    return (jax.nn.silu(x @ w1) * (x @ w3)) @ w2


def _attention(x: Any, wqkv: Any, wo: Any) -> Any:
    b, s, _ = x.shape
    qkv = (x @ wqkv).reshape(b, s, 3, H, HD)
    q, k, v = _rope(qkv[:, :, 0]), _rope(qkv[:, :, 1]), qkv[:, :, 2]
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / HD**0.5
    scores = jnp.where(jnp.tril(jnp.ones((s, s), bool)), scores, -1e9)
    out = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, -1), v)
    return out.reshape(b, s, H * HD) @ wo


def _gqa(x: Any, wq: Any, wkv: Any) -> Any:  # 4 query heads share 2 key/value heads
    b, s, _ = x.shape
    q = (x @ wq).reshape(b, s, H, HD)
    kv = (x @ wkv).reshape(b, s, 2, 2, HD)
    k, v = jnp.repeat(kv[:, :, 0], 2, axis=2), jnp.repeat(kv[:, :, 1], 2, axis=2)
    weights = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k), -1)
    return jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(b, s, -1)


def _llama_block(p: Any, x: Any) -> Any:
    h = x + _attention(_rmsnorm(x, p["n1"]), p["qkv"], p["o"])
    return h + _swiglu(_rmsnorm(h, p["n2"]), p["w1"], p["w3"], p["w2"])


def _lm_loss(p: Any, emb: Any, tokens: Any, labels: Any) -> Any:  # the head tied to the table
    logits = _llama_block(p, emb[tokens]) @ emb.T
    picked = jnp.take_along_axis(jax.nn.log_softmax(logits), labels[..., None], axis=-1)
    return -picked.mean()


def _moe(x: Any, router: Any, experts: Any) -> Any:  # top-2 of 4 experts, one-hot dispatch
    gates, chosen = lax.top_k(jax.nn.softmax(x @ router), 2)
    dispatch = jax.nn.one_hot(chosen, router.shape[1]).sum(1)
    ye = jnp.einsum("etd,edf->etf", jnp.einsum("te,td->etd", dispatch, x), experts)
    return jnp.einsum("etf,te->tf", ye, dispatch * gates.sum(-1, keepdims=True))


def _clipped_adamw(p: Any, x: Any, y: Any) -> Any:
    import optax

    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3))
    g = jax.grad(lambda p: jnp.mean((jnp.tanh(x @ p["a"]) @ p["b"] - y) ** 2))(p)
    updates, _ = tx.update(g, tx.init(p), p)
    return optax.apply_updates(p, updates)


def _rnn(h0: Any, xs: Any, w: Any, u: Any) -> Any:
    def cell(h: Any, x: Any) -> Any:
        h = jnp.tanh(h @ w + x @ u)
        return h, h

    return lax.scan(cell, h0, xs)[1]


def _per_example_grads(w: Any, x: Any, y: Any) -> Any:
    loss = lambda w, x, y: jnp.sum((jnp.tanh(x @ w) - y) ** 2)  # noqa: E731
    return jax.vmap(jax.grad(loss), (None, 0, 0))(w, x, y)


def _conv(x: Any, k: Any, groups: int = 1) -> Any:
    return lax.conv_general_dilated(x, k, (1, 1), "SAME", feature_group_count=groups,
                                    dimension_numbers=("NHWC", "HWIO", "NHWC"))  # fmt: skip


PIECES: dict[str, Case] = {
    "rmsnorm": (_rmsnorm, (X3, jnp.ones(D))),
    "rope": (lambda x, w: _rope((x @ w).reshape(B, S, H, HD)), (X3, _r(D, H * HD))),
    "swiglu": (_swiglu, (X3, W1, W3, W2)),
    "causal attention with rope": (_attention, (X3, W_QKV, W_O)),
    "grouped-query attention": (_gqa, (X3, _r(D, H * HD), _r(D, 2 * 2 * HD))),
    "llama block": (_llama_block, (LLAMA, X3)),
    "llama block gradient": (jax.grad(lambda p, x: _llama_block(p, x).sum()), (LLAMA, X3)),
    "tied-embedding lm loss": (_lm_loss, (LLAMA, EMB, TOKENS, NEXT)),
    "tied-embedding lm gradient": (jax.grad(_lm_loss, argnums=(0, 1)), (LLAMA, EMB, TOKENS, NEXT)),
    "top-2 mixture of experts": (_moe, (_r(32, D), _r(D, 4), _r(4, D, D) * 0.1)),
    "clipped adamw step": (_clipped_adamw, ({"a": _r(D, F), "b": _r(F, D)}, _r(B, D), _r(B, D))),
    "rnn under scan": (_rnn, (_r(B, D), _r(S, B, D), _r(D, D) * 0.1, _r(D, D) * 0.1)),
    "per-example gradients": (_per_example_grads, (_r(D, F), _r(B, D), _r(B, F))),
    "kv cache write": (
        lambda cache, new, pos: lax.dynamic_update_slice(cache, new, (0, pos, 0, 0)),
        (jnp.zeros((B, S, H, HD)), _r(B, 1, H, HD), jnp.int32(3)),
    ),
    "depthwise conv": (lambda x, k: _conv(x, k, 16), (_r(B, 8, 8, 16), _r(3, 3, 1, 16))),
    "conv and max pool": (
        lambda x, k: lax.reduce_window(
            _conv(x, k), -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID"
        ),
        (_r(B, 8, 8, 4), _r(3, 3, 4, 16)),
    ),
    "exact gelu": (lambda x, w: jax.nn.gelu(x @ w, approximate=False), (X3, W1)),
    "accuracy": (lambda x, w, lab: (jnp.argmax(x @ w, -1) == lab).mean(), (X3, _r(D, VOCAB), NEXT)),
    "einsum with ellipsis": (
        lambda a, b: jnp.einsum("...ij,...jk->...ik", a, b),
        (_r(B, 4, 8, 16), _r(B, 4, 16, 8)),
    ),
    "bfloat16 dot to float32": (
        lambda x, w: lax.dot(x, w, preferred_element_type=jnp.float32),
        (X.astype(jnp.bfloat16), W.astype(jnp.bfloat16)),
    ),
    "one-hot embedding": (lambda tok, emb: jax.nn.one_hot(tok, VOCAB) @ emb, (TOKENS, EMB)),
    "variance": (lambda x, w: jnp.var(x @ w, axis=(0, 1)), (X3, W1)),
    "positions by cumsum": (
        lambda m, x: (jnp.cumsum(m, axis=1) - 1)[..., None] * x,
        (jnp.ones((B, S), jnp.int32), X3),
    ),
    "nan_to_num": (lambda x, w: jnp.nan_to_num(jnp.log(x @ w)), (X3, W1)),
    "attention with a mask": (
        lambda q, k, m: jax.nn.dot_product_attention(q, k, k, mask=m),
        (_r(B, S, H, HD), _r(B, S, H, HD), jnp.tril(jnp.ones((1, 1, S, S), bool))),
    ),
    "vmap over stacked weights": (
        lambda ws, x: jax.vmap(lambda w: jnp.tanh(x @ w))(ws),
        (_r(4, D, F), _r(B, D)),
    ),
    "ema of parameters": (
        lambda p, q: jax.tree.map(lambda a, b: 0.99 * a + 0.01 * b, p, q),
        ({"a": W1, "b": W2}, {"a": W1 * 2, "b": W2 * 2}),
    ),
}
CASES |= PIECES


def check(fn: Callable[..., Any], args: tuple[Any, ...], mesh: str) -> dict[str, Any]:
    """Plan ``fn(*args)`` on ``mesh``, run every plan against ``jax.jit``, verify them all."""
    plan = shardwise.plan(fn, *args, mesh=mesh, profile="cpu-2core", top=2)
    want = jax.jit(fn)(*args)

    def close(a: Any, b: Any) -> bool:
        a, b = (np.asarray(jnp.asarray(t).astype(jnp.complex64)) for t in (a, b))
        return bool(np.allclose(a, b, rtol=2e-2, atol=1e-3, equal_nan=True))

    equal = all(
        jax.tree.all(jax.tree.map(close, plan.sharded(p.name)(*args), want)) for p in plan.plans
    )
    done = plan.verify(repeat=1)
    ran = [p for p in done.plans if p.verified is not None]
    memory = [
        p.verified.memory_bytes / p.predicted.memory_bytes
        for p in ran
        if p.verified and p.verified.memory_bytes and p.predicted.memory_bytes
    ]
    return {
        "plans": len(ran),
        "equal": equal,
        "collectives_differ": [
            p.name for p in ran if p.verified and not p.verified.collectives_match
        ],
        "memory_ratio": [round(min(memory), 2), round(max(memory), 2)] if memory else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mesh", default="data=2,model=4")
    parser.add_argument("--out", type=Path)
    parser.add_argument("cases", nargs="*", help="the cases to run (default: all)")
    ns = parser.parse_args()
    rows = {}
    for name in ns.cases or CASES:
        fn, args = CASES[name]
        try:
            rows[name] = check(fn, args, ns.mesh)
        except Exception as e:  # (a case that fails is reported, and the run goes on)
            rows[name] = {"error": f"{type(e).__name__}: {e}"}
        row = rows[name]
        said = row.get("error") or (
            f"equal={row['equal']} collectives differ in {row['collectives_differ'] or 'none'}"
            f" memory compiled/predicted {row['memory_ratio']}"
        )
        print(f"{name:30} {said}", flush=True)
    good = [n for n, r in rows.items() if r.get("equal") and not r.get("collectives_differ")]
    print(
        f"{len(good)} of {len(rows)} cases: every plan equal to jax.jit and its collectives "
        "the compiled HLO's"
    )
    if ns.out:
        ns.out.write_text(json.dumps({"mesh": ns.mesh, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
