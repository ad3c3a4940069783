"""Models written with the libraries' own modules, the way each library's documentation writes
them: Flax NNX and Linen, Optax, Equinox, Haiku. Each factory returns ``(fn, args)``: a
function and example arrays to plan it for and run it on, small enough that planning takes
well under a second. The libraries are imported inside the factories, so that importing this
module needs none of them (the tests skip a case whose library is missing)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from shardwise._versions import halves_cpu_computes_in_float32

Model = tuple[Callable[..., Any], tuple[Any, ...]]


def _normal(seed: int, shape: tuple[int, ...]) -> jax.Array:
    return jax.random.normal(jax.random.key(seed), shape, jnp.float32)


def _labels(seed: int, shape: tuple[int, ...], classes: int) -> jax.Array:
    return jax.random.randint(jax.random.key(seed), shape, 0, classes, jnp.int32)


def _nnx_mlp_module(din: int, hidden: int, dout: int, dropout: float = 0.0) -> Any:
    from flax import nnx

    class MLP(nnx.Module):
        def __init__(self, din: int, hidden: int, dout: int, *, rngs: nnx.Rngs) -> None:
            self.linear1 = nnx.Linear(din, hidden, rngs=rngs)
            self.dropout = nnx.Dropout(dropout)
            self.linear2 = nnx.Linear(hidden, dout, rngs=rngs)

        def __call__(self, x: jax.Array, rngs: Any = None) -> jax.Array:
            return self.linear2(self.dropout(nnx.relu(self.linear1(x)), rngs=rngs))

    return MLP(din, hidden, dout, rngs=nnx.Rngs(0))


def nnx_mlp() -> Model:
    """(1) An NNX MLP, run over the state ``nnx.split`` gives, as a ``jit``-ed function would."""
    from flax import nnx

    graphdef, state = nnx.split(_nnx_mlp_module(32, 64, 16))

    def forward(state: Any, x: jax.Array) -> jax.Array:
        return nnx.merge(graphdef, state)(x)

    return forward, (state, _normal(1, (64, 32)))


def nnx_gpt() -> Model:
    """(2) A two-block NNX GPT (embedding, causal self-attention, LayerNorm, MLP, untied
    head) and its cross-entropy loss on the next tokens."""
    from flax import nnx

    vocab, seq, d, heads, batch = 64, 16, 32, 4, 8

    class Block(nnx.Module):
        def __init__(self, *, rngs: nnx.Rngs) -> None:
            self.ln1 = nnx.LayerNorm(d, rngs=rngs)
            self.attn = nnx.MultiHeadAttention(heads, d, decode=False, rngs=rngs)
            self.ln2 = nnx.LayerNorm(d, rngs=rngs)
            self.up = nnx.Linear(d, 4 * d, rngs=rngs)
            self.down = nnx.Linear(4 * d, d, rngs=rngs)

        def __call__(self, x: jax.Array, mask: jax.Array) -> jax.Array:
            x = x + self.attn(self.ln1(x), mask=mask)
            return x + self.down(nnx.gelu(self.up(self.ln2(x))))

    class GPT(nnx.Module):
        def __init__(self, *, rngs: nnx.Rngs) -> None:
            self.embed = nnx.Embed(vocab, d, rngs=rngs)
            self.blocks = nnx.List([Block(rngs=rngs) for _ in range(2)])
            self.ln = nnx.LayerNorm(d, rngs=rngs)
            self.head = nnx.Linear(d, vocab, rngs=rngs)

        def __call__(self, tokens: jax.Array) -> jax.Array:
            x = self.embed(tokens)
            mask = nnx.make_causal_mask(tokens)
            for block in self.blocks:
                x = block(x, mask)
            return self.head(self.ln(x))

    graphdef, state = nnx.split(GPT(rngs=nnx.Rngs(0)))

    def loss(state: Any, tokens: jax.Array, labels: jax.Array) -> jax.Array:
        import optax

        logits = nnx.merge(graphdef, state)(tokens)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    return loss, (state, _labels(1, (batch, seq), vocab), _labels(2, (batch, seq), vocab))


def nnx_adamw_step() -> Model:
    """(3) A training step written by hand with Optax's AdamW over an NNX model's state."""
    import optax
    from flax import nnx

    graphdef, state = nnx.split(_nnx_mlp_module(32, 64, 16))
    tx = optax.adamw(1e-3)
    opt_state = tx.init(state)

    def train_step(state: Any, opt_state: Any, x: jax.Array, y: jax.Array) -> Any:
        def loss_fn(state: Any) -> jax.Array:
            return jnp.mean((nnx.merge(graphdef, state)(x) - y) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(state)
        updates, opt_state = tx.update(grads, opt_state, state)
        return optax.apply_updates(state, updates), opt_state, loss

    return train_step, (state, opt_state, _normal(1, (64, 32)), _normal(2, (64, 16)))


def linen_cnn_step() -> Model:
    """(4) The CNN of Flax Linen's MNIST tutorial (convolution, average pooling, dense
    layers), shrunk to one convolution, and its SGD training step."""
    import flax.linen as nn
    import optax

    class CNN(nn.Module):
        @nn.compact
        def __call__(self, x: jax.Array) -> jax.Array:
            x = nn.relu(nn.Conv(features=8, kernel_size=(3, 3))(x))
            x = nn.avg_pool(x, window_shape=(2, 2), strides=(2, 2))
            x = x.reshape((x.shape[0], -1))
            x = nn.relu(nn.Dense(features=32)(x))
            return nn.Dense(features=10)(x)

    images = _normal(1, (16, 16, 16, 1))
    params = jax.jit(CNN().init)(jax.random.key(0), images)["params"]
    tx = optax.sgd(0.1)

    def train_step(params: Any, images: jax.Array, labels: jax.Array) -> Any:
        def loss_fn(params: Any) -> jax.Array:
            logits = CNN().apply({"params": params}, images)
            return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, _ = tx.update(grads, tx.init(params))
        return optax.apply_updates(params, updates), loss

    return train_step, (params, images, _labels(2, (16,), 10))


def _eqx_block(d: int, heads: int, key: jax.Array) -> Any:
    import equinox as eqx

    class Block(eqx.Module):
        norm1: eqx.nn.LayerNorm
        attn: eqx.nn.MultiheadAttention
        norm2: eqx.nn.LayerNorm
        mlp: eqx.nn.MLP

        def __init__(self, key: jax.Array) -> None:
            k1, k2 = jax.random.split(key)
            self.norm1 = eqx.nn.LayerNorm(d)
            self.attn = eqx.nn.MultiheadAttention(heads, d, key=k1)
            self.norm2 = eqx.nn.LayerNorm(d)
            self.mlp = eqx.nn.MLP(d, d, 4 * d, depth=1, key=k2)

        def __call__(self, x: jax.Array) -> jax.Array:  # one sequence: (seq, d)
            y = jax.vmap(self.norm1)(x)
            x = x + self.attn(y, y, y)
            return x + jax.vmap(self.mlp)(jax.vmap(self.norm2)(x))

    return Block(key)


def eqx_attention() -> Model:
    """(5) An Equinox transformer block (``eqx.nn.MultiheadAttention``), mapped over the batch
    with ``jax.vmap``, its arrays split from the rest with ``eqx.partition``."""
    import equinox as eqx

    params, static = eqx.partition(_eqx_block(32, 4, jax.random.key(0)), eqx.is_array)

    def forward(params: Any, x: jax.Array) -> jax.Array:
        return jax.vmap(eqx.combine(params, static))(x)

    return forward, (params, _normal(1, (8, 16, 32)))


def eqx_checkpointed() -> Model:
    """(6) An Equinox MLP whose layers are rematerialised with ``eqx.filter_checkpoint``, and
    its loss and gradients from ``eqx.filter_value_and_grad``."""
    import equinox as eqx

    class Model(eqx.Module):
        layers: list[eqx.nn.Linear]

        def __init__(self, key: jax.Array) -> None:
            keys = jax.random.split(key, 4)
            sizes = [32, 64, 64, 64, 16]
            self.layers = [
                eqx.nn.Linear(a, b, key=k) for a, b, k in zip(sizes, sizes[1:], keys, strict=False)
            ]

        def __call__(self, x: jax.Array) -> jax.Array:
            for layer in self.layers[:-1]:
                x = eqx.filter_checkpoint(lambda layer, x: jax.nn.tanh(layer(x)))(layer, x)
            return self.layers[-1](x)

    params, static = eqx.partition(Model(jax.random.key(0)), eqx.is_array)

    def loss(model: Any, x: jax.Array, y: jax.Array) -> jax.Array:
        return jnp.mean((jax.vmap(model)(x) - y) ** 2)

    def loss_and_grads(params: Any, x: jax.Array, y: jax.Array) -> Any:
        return eqx.filter_value_and_grad(loss)(eqx.combine(params, static), x, y)

    return loss_and_grads, (params, _normal(1, (64, 32)), _normal(2, (64, 16)))


def haiku_mlp() -> Model:
    """(7) Haiku's ``hk.nets.MLP`` through ``hk.transform``, applied without a random key."""
    import haiku as hk

    def net(x: jax.Array) -> jax.Array:
        return hk.nets.MLP([64, 64, 16])(x)

    model = hk.transform(net)
    x = _normal(1, (64, 32))
    params = model.init(jax.random.key(0), x)

    def forward(params: Any, x: jax.Array) -> jax.Array:
        return model.apply(params, None, x)

    return forward, (params, x)


def nnx_dropout() -> Model:
    """(8) An NNX MLP with ``nnx.Dropout`` in training mode, its mask drawn from a new-style
    key (``jax.random.key``) given as an argument."""
    from flax import nnx

    graphdef, state = nnx.split(_nnx_mlp_module(32, 64, 16, dropout=0.5))

    def forward(state: Any, x: jax.Array, key: jax.Array) -> jax.Array:
        return nnx.merge(graphdef, state)(x, rngs=key)

    return forward, (state, _normal(1, (64, 32)), jax.random.key(3))


def nnx_deep_stack() -> Model:
    """(9) Twelve NNX Linear layers applied in a Python loop: an unrolled stack."""
    from flax import nnx

    class Stack(nnx.Module):
        def __init__(self, width: int, depth: int, *, rngs: nnx.Rngs) -> None:
            self.layers = nnx.List([nnx.Linear(width, width, rngs=rngs) for _ in range(depth)])

        def __call__(self, x: jax.Array) -> jax.Array:
            for layer in self.layers:
                x = nnx.tanh(layer(x))
            return x

    graphdef, state = nnx.split(Stack(32, 12, rngs=nnx.Rngs(0)))

    def forward(state: Any, x: jax.Array) -> jax.Array:
        return nnx.merge(graphdef, state)(x)

    return forward, (state, _normal(1, (64, 32)))


LOGICAL_RULES = (("batch", "data"), ("hidden", "model"), ("embed", None))
"""The rules of Flax's guide to logical axes, for a mesh of axes ``data`` and ``model``."""


def linen_logical(rules: Any = LOGICAL_RULES) -> Model:
    """(10) The ``DotReluDot`` of Flax's guide to logical axes: Linen kernels annotated with
    ``nn.with_logical_partitioning``, an activation with ``nn.with_logical_constraint``,
    applied under ``nn.logical_axis_rules`` (which asserts on Explicit axes); ``rules`` map
    the logical axes ``batch``, ``hidden`` and ``embed`` to the mesh's."""
    import flax.linen as nn

    class DotReluDot(nn.Module):
        depth: int

        @nn.compact
        def __call__(self, x: jax.Array) -> jax.Array:
            init = nn.initializers.xavier_normal()
            up = nn.with_logical_partitioning(init, ("embed", "hidden"))
            down = nn.with_logical_partitioning(init, ("hidden", "embed"))
            y = nn.Dense(self.depth, use_bias=False, kernel_init=up)(x)
            y = nn.with_logical_constraint(nn.relu(y), ("batch", "hidden"))
            return nn.Dense(x.shape[-1], use_bias=False, kernel_init=down)(y)

    return _under_rules(DotReluDot(128), rules, _normal(1, (64, 32)))


def _under_rules(module: Any, rules: Any, x: jax.Array) -> Model:
    """A Linen module initialised and applied under the logical axis ``rules``."""
    import flax.linen as nn

    with nn.logical_axis_rules(rules):
        params = module.init(jax.random.key(0), x)

    def forward(params: Any, x: jax.Array) -> jax.Array:
        with nn.logical_axis_rules(rules):
            return module.apply(params, x)

    return forward, (params, x)


def linen_constrained_mlp(rules: Any = LOGICAL_RULES) -> Model:
    """A Linen MLP whose input batch and hidden activation are held with
    ``nn.with_logical_constraint``, its kernels and biases annotated with logical axes
    ``embed`` and ``hidden``."""
    import flax.linen as nn

    class MLP(nn.Module):
        hidden: int

        @nn.compact
        def __call__(self, x: jax.Array) -> jax.Array:
            init, zeros = nn.initializers.xavier_normal(), nn.initializers.zeros
            x = nn.with_logical_constraint(x, ("batch", "embed"))
            h = nn.Dense(
                self.hidden,
                kernel_init=nn.with_logical_partitioning(init, ("embed", "hidden")),
                bias_init=nn.with_logical_partitioning(zeros, ("hidden",)),
            )(x)
            h = nn.with_logical_constraint(nn.gelu(h), ("batch", "hidden"))
            return nn.Dense(
                x.shape[-1],
                kernel_init=nn.with_logical_partitioning(init, ("hidden", "embed")),
                bias_init=nn.with_logical_partitioning(zeros, ("embed",)),
            )(h)

    return _under_rules(MLP(128), rules, _normal(1, (64, 32)))


def linen_constrained_attention(rules: Any = LOGICAL_RULES) -> Model:
    """A Linen self-attention block of 4 heads with a residual, its activations held with
    ``nn.with_logical_constraint`` (logical axes ``batch``, ``length``, ``heads``, ``kv``,
    ``embed``) and its weights annotated."""
    import flax.linen as nn

    heads, kv, embed = 4, 8, 32

    class Attention(nn.Module):
        @nn.compact
        def __call__(self, x: jax.Array) -> jax.Array:
            init = nn.initializers.normal(0.05)
            x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
            w_qkv = self.param("qkv", nn.with_logical_partitioning(
                init, ("embed", None, "heads", "kv")), (embed, 3, heads, kv))  # fmt: skip
            w_out = self.param("out", nn.with_logical_partitioning(
                init, ("heads", "kv", "embed")), (heads, kv, embed))  # fmt: skip
            qkv = jnp.einsum("ble,ethd->blthd", x, w_qkv)
            q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
            q = nn.with_logical_constraint(q, ("batch", "length", "heads", "kv"))
            weights = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k) / kv**0.5, axis=-1)
            out = jnp.einsum("bhqk,bkhd->bqhd", weights, v)
            out = nn.with_logical_constraint(out, ("batch", "length", "heads", "kv"))
            y = jnp.einsum("bqhd,hde->bqe", out, w_out)
            return nn.with_logical_constraint(x + y, ("batch", "length", "embed"))

    return _under_rules(Attention(), rules, _normal(1, (8, 16, embed)))


def nnx_mixed_precision_step() -> Model:
    """(11) An SGD step of an NNX MLP in mixed precision, as Flax writes it: float32
    parameters, each ``nnx.Linear`` computing in bfloat16 (``dtype=jnp.bfloat16``)."""
    from flax import nnx

    class MLP(nnx.Module):
        def __init__(self, *, rngs: nnx.Rngs) -> None:
            half = {"dtype": jnp.bfloat16, "param_dtype": jnp.float32, "rngs": rngs}
            self.linear1 = nnx.Linear(32, 128, **half)
            self.linear2 = nnx.Linear(128, 32, **half)

        def __call__(self, x: jax.Array) -> jax.Array:
            return self.linear2(nnx.relu(self.linear1(x)))

    graphdef, state = nnx.split(MLP(rngs=nnx.Rngs(0)))

    def train_step(state: Any, x: jax.Array, y: jax.Array) -> Any:
        def loss_fn(state: Any) -> jax.Array:
            out = nnx.merge(graphdef, state)(x).astype(jnp.float32)
            return jnp.mean((out - y) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(state)
        return loss, jax.tree.map(lambda p, g: p - 0.1 * g, state, grads)

    return train_step, (state, _normal(1, (64, 32)), _normal(2, (64, 32)))


def eqx_batchnorm_step(width: int = 64) -> Model:
    """An SGD step of an Equinox MLP with ``eqx.nn.BatchNorm``, its state made with
    ``eqx.nn.make_with_state`` and the model mapped over the batch with ``jax.vmap`` under
    the BatchNorm's ``axis_name``, as Equinox's docs write it: the batch statistics are a
    ``psum`` over that axis, which ``vmap`` makes a sum over the batch."""
    import equinox as eqx

    class Model(eqx.Module):
        first: eqx.nn.Linear
        norm: eqx.nn.BatchNorm
        last: eqx.nn.Linear

        def __init__(self, key: jax.Array) -> None:
            k1, k2 = jax.random.split(key)
            self.first = eqx.nn.Linear(width, width, key=k1)
            self.norm = eqx.nn.BatchNorm(width, axis_name="batch", mode="batch")
            self.last = eqx.nn.Linear(width, 10, key=k2)

        def __call__(self, x: jax.Array, state: Any) -> Any:
            h, state = self.norm(self.first(x), state)
            return self.last(jax.nn.relu(h)), state

    model, state = eqx.nn.make_with_state(Model)(jax.random.key(0))
    params, static = eqx.partition(model, eqx.is_array)

    def loss(params: Any, state: Any, x: jax.Array, y: jax.Array) -> Any:
        batched = jax.vmap(eqx.combine(params, static), axis_name="batch",
                           in_axes=(0, None), out_axes=(0, None))  # fmt: skip
        out, state = batched(x, state)
        return jnp.mean((out - y) ** 2), state

    def train_step(params: Any, state: Any, x: jax.Array, y: jax.Array) -> Any:
        (value, state), grads = jax.value_and_grad(loss, has_aux=True)(params, state, x, y)
        return value, jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), state

    return train_step, (params, state, _normal(1, (32, width)), _normal(2, (32, 10)))


MODELS: dict[str, Callable[[], Model]] = {
    "nnx-mlp": nnx_mlp,
    "nnx-gpt-loss": nnx_gpt,
    "nnx-adamw-step": nnx_adamw_step,
    "linen-cnn-step": linen_cnn_step,
    "eqx-attention": eqx_attention,
    "eqx-checkpoint": eqx_checkpointed,
    "haiku-mlp": haiku_mlp,
    "nnx-dropout": nnx_dropout,
    "nnx-12-layers": nnx_deep_stack,
    "linen-logical": linen_logical,
    "nnx-mixed-precision": nnx_mixed_precision_step,
    "eqx-batchnorm-step": eqx_batchnorm_step,
}
"""Each case's factory, by the name the tests give it."""

TOLERANCES = (
    {} if "bfloat16" in halves_cpu_computes_in_float32() else {"nnx-mixed-precision": (2**-8, 1e-4)}
)
"""``(rtol, atol)`` against ``jax.jit`` of the cases that compute in bfloat16 where the CPU
backend computes it as it is (jaxlib 0.12), where the others (float32, and all before) ask
``rtol=1e-4, atol=1e-5``. A plan that splits a contraction has each device
round its partial sum to bfloat16 (8 significant bits: off by up to 2^-9 of it) before they are
summed, where ``jax.jit`` rounds the whole sum once: XLA's CPU backend computes bfloat16 dots
in bfloat16 from jaxlib 0.12 (in float32 before, and the results were the same to the bit).
Measured on jaxlib 0.12.1, the mixed-precision step's chosen plan, whose second layer's
contraction is split 8 ways: the loss 1.4e-4 off, relative (within bfloat16's epsilon, 2^-8);
the gradients up to 1.7 bfloat16 epsilons of their largest element (below 0.08) apart, so the
parameters updated with a learning rate of 0.1 up to 4.9e-5 apart (within 1e-4). The step
emulated in float64, each op rounded once to its type and that layer's 8 partial sums to
bfloat16, is the plan's results to 3e-7: the difference is those roundings alone."""
