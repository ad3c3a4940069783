"""The baselines are what their names say on the layers of real libraries (Flax NNX and Linen,
Haiku, Equinox, optax): Megatron splits each column-parallel weight and its bias along the
output features and each row-parallel weight along the input features, through layer norms,
residuals and attention (heads split), and optimizer state follows its parameter;
data-parallel and FSDP split the batch (inputs and integer labels) and never a PRNG key.

Each expectation below is written by hand. The small models are planned whole (their
baselines as the plan pins them); the GPT's baselines are read from its graph alone
(:func:`~shardwise._program.baselines.baseline`, what the plan pins), as searching a training
step of a transformer takes seconds."""

from __future__ import annotations

import equinox as eqx
import flax.linen as nn
import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import shardwise
from shardwise._model.mesh import MeshSpec
from shardwise._model.spec import Spec
from shardwise._program.baselines import NAMES, baseline
from shardwise._program.graph import build
from shardwise._program.roles import roles

S = jax.ShapeDtypeStruct
MESH = "data=2,model=4"
B, T, D, HEADS, F, V, C = 8, 8, 32, 8, 64, 64, 16  # batch, seq, width, heads, ffn, vocab, out
ALL = "(data,model)"
TP = {"megatron": ALL, "data×tensor": "model"}  # the model axes of each tensor-parallel one
BATCH = {"megatron": "replicated", "data×tensor": "data", "data-parallel": ALL, "fsdp": ALL}


def _layouts(names, specs) -> dict[str, str]:
    return {n.removesuffix(".value"): s.describe() for n, s in zip(names, specs, strict=True)}


def _planned(fn, *args, **kw) -> dict[str, dict[str, str]]:
    """Each baseline's input layouts, as a plan of ``fn`` pins them (none skipped)."""
    p = shardwise.plan(fn, *args, mesh=MESH, profile="cpu-2core", top=1, **kw)
    assert p.skipped == ()
    return {b: _layouts(p.graph.names, p.get(b).in_specs) for b in NAMES}


def _pins(fn, *args) -> dict[str, dict[str, str]]:
    """Each baseline's input layouts, read from the graph of ``fn`` (none skipped)."""
    g = build(fn, args)
    mesh, role = MeshSpec.parse(MESH), roles(g)
    out = {}
    for b in NAMES:
        pins = baseline(b, g, mesh, {}, role)
        assert not isinstance(pins, str), (b, pins)
        out[b] = _layouts(g.names, [pins[k] for k in range(len(g.inputs))])
    return out


# --- Flax NNX: an MLP with biases ------------------------------------------------------


class MLP(nnx.Module):
    def __init__(self, d: int, f: int, out: int, rngs: nnx.Rngs):
        self.linear1 = nnx.Linear(d, f, rngs=rngs)
        self.linear2 = nnx.Linear(f, out, rngs=rngs)

    def __call__(self, x):
        return self.linear2(jax.nn.relu(self.linear1(x)))


def _nnx_mlp():
    graphdef, state = nnx.split(nnx.eval_shape(lambda: MLP(C, F, C, nnx.Rngs(0))))

    def forward(state, x):
        return nnx.merge(graphdef, state)(x)

    return forward, state


def _mlp_expected(names: dict[str, str], tp: str) -> dict[str, str]:
    """A column- then row-parallel pair: ``names`` maps first kernel/bias, second kernel/bias
    to their names; the first kernel is (in, out) unless it says (out, in)."""
    return {
        names["k1"]: f"-,{tp}" if names.get("layout") != "out,in" else tp,
        names["b1"]: tp,
        names["k2"]: tp if names.get("layout") != "out,in" else f"-,{tp}",
        names["b2"]: "replicated",
    }


NNX_MLP = {
    "k1": "state['linear1']['kernel']",
    "b1": "state['linear1']['bias']",
    "k2": "state['linear2']['kernel']",
    "b2": "state['linear2']['bias']",
}


def test_nnx_mlp_with_biases():
    forward, state = _nnx_mlp()
    got = _planned(forward, state, S((B, C), "float32"))
    for b, tp in TP.items():
        assert got[b] == {**_mlp_expected(NNX_MLP, tp), "x": BATCH[b]}, b
    assert got["data-parallel"] == {**dict.fromkeys(got["replicated"], "replicated"), "x": ALL}
    # FSDP: each parameter along its largest dimension that 8 devices divide
    assert got["fsdp"] == {
        "state['linear1']['kernel']": f"-,{ALL}",  # (16, 64)
        "state['linear1']['bias']": ALL,  # (64,)
        "state['linear2']['kernel']": ALL,  # (64, 16)
        "state['linear2']['bias']": ALL,  # (16,)
        "x": ALL,
    }


# --- Haiku, Equinox, Linen MLPs ---------------------------------------------------------


def _haiku_mlp():
    f = hk.without_apply_rng(hk.transform(lambda x: hk.nets.MLP([F, C])(x)))
    return f.apply, jax.eval_shape(f.init, jax.random.PRNGKey(0), S((B, C), "float32"))


def _equinox_mlp():
    mlp = eqx.filter_eval_shape(eqx.nn.MLP, C, C, F, 1, key=jax.random.PRNGKey(0))
    params, static = eqx.partition(mlp, lambda leaf: isinstance(leaf, S))

    def forward(params, x):
        return jax.vmap(eqx.combine(params, static))(x)

    return forward, params


class _LinenMLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        h = nn.relu(nn.Dense(F, name="up")(x))
        return nn.Dense(C, name="down")(h)


def _linen_mlp():
    m = _LinenMLP()

    def forward(variables, x):
        return m.apply(variables, x)

    return forward, jax.eval_shape(m.init, jax.random.PRNGKey(0), S((B, C), "float32"))


@pytest.mark.parametrize(
    ("make", "names"),
    [
        (
            _haiku_mlp,
            {
                "k1": "params['mlp/~/linear_0']['w']",
                "b1": "params['mlp/~/linear_0']['b']",
                "k2": "params['mlp/~/linear_1']['w']",
                "b2": "params['mlp/~/linear_1']['b']",
            },
        ),
        (
            _equinox_mlp,  # weights are (out, in)
            {
                "k1": "params.layers[0].weight",
                "b1": "params.layers[0].bias",
                "k2": "params.layers[1].weight",
                "b2": "params.layers[1].bias",
                "layout": "out,in",
            },
        ),
        (
            _linen_mlp,
            {
                "k1": "variables['params']['up']['kernel']",
                "b1": "variables['params']['up']['bias']",
                "k2": "variables['params']['down']['kernel']",
                "b2": "variables['params']['down']['bias']",
            },
        ),
    ],
    ids=["haiku", "equinox", "linen"],
)
def test_library_mlps(make, names):
    forward, params = make()
    got = _planned(forward, params, S((B, C), "float32"))
    for b, tp in TP.items():
        assert got[b] == {**_mlp_expected(names, tp), "x": BATCH[b]}, b
    assert set(got["data-parallel"].values()) == {"replicated", ALL}
    assert got["data-parallel"]["x"] == ALL


def test_the_megatron_plan_of_an_mlp_with_biases_computes_the_function():
    forward, shapes = _nnx_mlp()
    rng = np.random.default_rng(0)
    state, x = jax.tree.map(
        lambda s: jnp.asarray(rng.standard_normal(s.shape), s.dtype), (shapes, S((B, C), "float32"))
    )
    p = shardwise.plan(forward, state, x, mesh=MESH, profile="cpu-2core", top=1)
    got = p.sharded("megatron")(state, x)
    assert jnp.allclose(got, forward(state, x), atol=1e-5)


# --- Flax NNX: a 2-block GPT, forward and an optax.adamw training step --------------------


class Block(nnx.Module):
    def __init__(self, rngs: nnx.Rngs, heads: int = HEADS):
        self.ln1 = nnx.LayerNorm(D, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(heads, D, decode=False, keep_rngs=False, rngs=rngs)
        self.ln2 = nnx.LayerNorm(D, rngs=rngs)
        self.mlp = MLP(D, F, D, rngs)

    def __call__(self, x, mask):
        x = x + self.attn(self.ln1(x), mask=mask)
        return x + self.mlp(self.ln2(x))


class GPT(nnx.Module):
    def __init__(self, rngs: nnx.Rngs, heads: int = HEADS):
        self.embed = nnx.Embed(V, D, rngs=rngs)
        self.pos = nnx.Embed(T, D, rngs=rngs)
        self.blocks = nnx.List([Block(rngs, heads) for _ in range(2)])
        self.ln = nnx.LayerNorm(D, rngs=rngs)
        self.head = nnx.Linear(D, V, rngs=rngs)

    def __call__(self, tokens):
        x = self.embed(tokens) + self.pos(jnp.arange(tokens.shape[1]))
        mask = nnx.make_causal_mask(tokens)
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.ln(x))


def _gpt(heads: int = HEADS):
    graphdef, state = nnx.split(nnx.eval_shape(lambda: GPT(nnx.Rngs(0), heads)))

    def loss(state, tokens, labels):
        logits = nnx.merge(graphdef, state)(tokens)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    return loss, state


def _gpt_tensor_parallel(tp: str) -> dict[str, str]:
    """Megatron's GPT: Q, K, V kernels (D, heads, head_dim) and biases (heads, head_dim) split
    over the heads, the output projection (heads, head_dim, D) over the heads (row-parallel)
    with its bias replicated, the MLP column- then row-parallel, the head column-parallel
    (over the vocabulary), layer norms and the embeddings (read by lookups) replicated."""
    out = {
        "state['embed']['embedding']": "replicated",
        "state['pos']['embedding']": "replicated",
        "state['ln']['scale']": "replicated",
        "state['ln']['bias']": "replicated",
        "state['head']['kernel']": f"-,{tp}",
        "state['head']['bias']": tp,
    }
    for n in range(2):
        block = f"state['blocks'][{n}]"
        for proj in ("query", "key", "value"):
            out[f"{block}['attn']['{proj}']['kernel']"] = f"-,{tp}"
            out[f"{block}['attn']['{proj}']['bias']"] = tp
        out[f"{block}['attn']['out']['kernel']"] = tp
        out[f"{block}['attn']['out']['bias']"] = "replicated"
        for ln in ("ln1", "ln2"):
            out[f"{block}['{ln}']['scale']"] = "replicated"
            out[f"{block}['{ln}']['bias']"] = "replicated"
        out.update(_mlp_expected({k: f"{block}['mlp']{v[5:]}" for k, v in NNX_MLP.items()}, tp))
    return out


def _gpt_fsdp() -> dict[str, str]:
    """FSDP's GPT: each parameter along its largest dimension that 8 devices divide."""
    out = {
        "state['embed']['embedding']": ALL,  # (64, 32)
        "state['pos']['embedding']": f"-,{ALL}",  # (8, 32)
        "state['ln']['scale']": ALL,  # (32,)
        "state['ln']['bias']": ALL,
        "state['head']['kernel']": f"-,{ALL}",  # (32, 64)
        "state['head']['bias']": ALL,  # (64,)
    }
    for n in range(2):
        block = f"state['blocks'][{n}]"
        for proj in ("query", "key", "value"):
            out[f"{block}['attn']['{proj}']['kernel']"] = ALL  # (32, 8, 4)
            out[f"{block}['attn']['{proj}']['bias']"] = ALL  # (8, 4)
        out[f"{block}['attn']['out']['kernel']"] = f"-,-,{ALL}"  # (8, 4, 32)
        out[f"{block}['attn']['out']['bias']"] = ALL  # (32,)
        for ln in ("ln1", "ln2"):
            out[f"{block}['{ln}']['scale']"] = ALL
            out[f"{block}['{ln}']['bias']"] = ALL
        out[f"{block}['mlp']['linear1']['kernel']"] = f"-,{ALL}"  # (32, 64)
        out[f"{block}['mlp']['linear1']['bias']"] = ALL  # (64,)
        out[f"{block}['mlp']['linear2']['kernel']"] = ALL  # (64, 32)
        out[f"{block}['mlp']['linear2']['bias']"] = ALL  # (32,)
    return out


def _with_adam(state: dict[str, str]) -> dict[str, str]:
    """``state`` and Adam's moments, each laid out as its parameter; the step count whole."""
    out = {"opt_state[0].count": "replicated"}
    for moment in ("mu", "nu"):
        out.update({f"opt_state[0].{moment}{n[5:]}": s for n, s in state.items()})
    return {**state, **out}


def _expected_gpt(b: str, adam: bool) -> dict[str, str]:
    if b in TP:
        state = _gpt_tensor_parallel(TP[b])
    elif b == "fsdp":
        state = _gpt_fsdp()
    else:
        state = dict.fromkeys(_gpt_fsdp(), "replicated")
    data = dict.fromkeys(("tokens", "labels"), BATCH.get(b, "replicated"))
    return {**(_with_adam(state) if adam else state), **data}


def test_gpt_forward():
    loss, state = _gpt()
    tokens = S((B, T), "int32")
    got = _pins(loss, state, tokens, tokens)
    for b in NAMES:
        assert got[b] == _expected_gpt(b, adam=False), b


def test_megatron_keeps_an_attention_whole_where_its_heads_do_not_divide():
    """4 heads over Megatron's 8 devices: Megatron-LM needs the heads to divide over its
    tensor axes, and splitting each head's 8 features instead would make every attention score
    a partial sum, all-reduced. Megatron keeps the query, key and value projections whole
    and splits the rest as before, but the output projection: reading a whole activation, it
    is column-parallel (along its output features); data × tensor (4 devices) splits the
    heads."""
    loss, state = _gpt(heads=4)
    tokens = S((B, T), "int32")
    got = _pins(loss, state, tokens, tokens)
    want = _expected_gpt("megatron", adam=False)
    whole = {name: "replicated" for name in want if "['attn']" in name}
    assert len(whole) == 16  # (two blocks: four projections, each a kernel and a bias)
    for n in range(2):
        whole[f"state['blocks'][{n}]['attn']['out']['kernel']"] = f"-,-,{ALL}"  # (4, 8, 32)
    assert got["megatron"] == {**want, **whole}
    assert got["data×tensor"] == _expected_gpt("data×tensor", adam=False)


def test_gpt_adamw_training_step_written_by_the_user():
    loss, state = _gpt()
    tx = optax.adamw(1e-3)

    def train_step(state, opt_state, tokens, labels):
        value, grads = jax.value_and_grad(loss)(state, tokens, labels)
        updates, opt_state = tx.update(grads, opt_state, state)
        return value, optax.apply_updates(state, updates), opt_state

    tokens = S((B, T), "int32")
    got = _pins(train_step, state, jax.eval_shape(tx.init, state), tokens, tokens)
    for b in NAMES:
        assert got[b] == _expected_gpt(b, adam=True), b


def test_adam_moments_passed_as_their_own_arguments_follow_their_parameters():
    forward, params = _haiku_mlp()

    def train_step(params, mu, nu, x, labels):
        def loss(params):
            logits = forward(params, x)
            return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

        value, grads = jax.value_and_grad(loss)(params)
        mu = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, mu, grads)
        nu = jax.tree.map(lambda v, g: 0.999 * v + 0.001 * g * g, nu, grads)
        step = lambda p, m, v: p - 1e-3 * m / (jnp.sqrt(v) + 1e-8)  # noqa: E731
        return value, jax.tree.map(step, params, mu, nu), mu, nu

    got = _pins(train_step, params, params, params, S((B, C), "float32"), S((B,), "int32"))
    names = {
        "k1": "params['mlp/~/linear_0']['w']",
        "b1": "params['mlp/~/linear_0']['b']",
        "k2": "params['mlp/~/linear_1']['w']",
        "b2": "params['mlp/~/linear_1']['b']",
    }
    for b, tp in TP.items():
        want = _mlp_expected(names, tp)
        for arg in ("params", "mu", "nu"):
            assert {n: got[b][arg + n[6:]] for n in want} == want, (b, arg)
        assert got[b]["x"] == got[b]["labels"] == BATCH[b]


# --- PRNG keys and integer labels --------------------------------------------------------


def _dropout_loss(use: str = "jit"):
    forward, state = _nnx_mlp()

    def loss(state, x, labels, key):
        logits = forward(state, x)
        drop = lambda k: jax.random.bernoulli(k, 0.9, logits.shape)  # noqa: E731
        if use == "vmap":  # one key per example, as vmap-ed dropout takes them
            keep = jax.vmap(lambda k, row: jax.random.bernoulli(k, 0.9, row.shape))(key, logits)
        elif use == "cond":
            keep = jax.lax.cond(labels[0] > 0, drop, lambda k: logits > -jnp.inf, key)
        else:
            keep = jax.jit(drop)(key)
        logits = jnp.where(keep, logits / 0.9, 0.0)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    return loss, state


@pytest.mark.parametrize(
    ("key", "use"),
    [
        (jax.random.PRNGKey(0), "jit"),  # uint32[2]
        (jax.random.key(0), "jit"),  # key<fry>[]
        (jax.random.PRNGKey(0), "cond"),
        (jax.random.split(jax.random.PRNGKey(0), B), "vmap"),  # uint32[8, 2]: its first dim is B
        (jax.random.split(jax.random.key(0), B), "vmap"),  # key<fry>[8]
    ],
    ids=["legacy", "typed", "legacy-in-cond", "legacy-per-example", "typed-per-example"],
)
def test_keys_are_never_data_and_integer_labels_are(key, use):
    loss, state = _dropout_loss(use)
    got = _planned(loss, state, S((B, C), "float32"), S((B,), "int32"), key)
    for b in NAMES:
        assert got[b]["key"] == "replicated", b
        assert got[b]["x"] == got[b]["labels"] == BATCH.get(b, "replicated"), b
    for b, tp in TP.items():
        assert {n: s for n, s in got[b].items() if n.startswith("state")} == _mlp_expected(
            NNX_MLP, tp
        ), b


def test_a_key_is_told_from_labels_of_its_shape_by_its_use():
    """Labels and a legacy key, both ``uint32[2]``, with a batch of 2 split over ``data``:
    the labels are split, the key is not."""
    loss, state = _dropout_loss()
    x, labels = S((2, C), "float32"), S((2,), "uint32")
    p = shardwise.plan(
        loss, state, x, labels, jax.random.PRNGKey(0), mesh=MESH, profile="cpu-2core",
        fixed={"x": "data"}, top=1,
    )  # fmt: skip
    for b in ("data-parallel", "fsdp", "data×tensor"):
        got = _layouts(p.graph.names, p.get(b).in_specs)
        assert (got["x"], got["labels"], got["key"]) == ("data", "data", "replicated"), b


def test_a_batch_given_as_a_dict_is_data():
    """``train_step(state, batch)`` as Flax's tutorials write it: the batch is a dict of
    images and labels, each leaf with the batch first; the data-parallel baselines split
    every leaf of it, the tensor-parallel ones lay out the weights as for single arrays."""
    forward, state = _nnx_mlp()

    def loss(state, batch):
        logits = forward(state, batch["x"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()

    batch = {"x": S((B, C), "float32"), "label": S((B,), "int32")}
    got = _planned(loss, state, batch)
    for b in NAMES:
        assert got[b]["batch['x']"] == got[b]["batch['label']"] == BATCH.get(b, "replicated"), b
    for b, tp in TP.items():
        weights = {n: s for n, s in got[b].items() if n.startswith("state")}
        assert weights == _mlp_expected(NNX_MLP, tp), b


def test_a_container_is_data_only_where_every_leaf_has_the_batch_first():
    """The parameters (first argument) are never the batch, even where every weight's first
    dimension equals it; a second container whose leaves disagree is parameters too."""

    def fn(params, x, extra):
        return jnp.tanh(x @ params["w"] + params["b"]) @ extra["v"] + extra["c"].sum()

    params = {"w": S((B, B), "float32"), "b": S((B,), "float32")}
    extra = {"v": S((B, 4), "float32"), "c": S((3,), "float32")}
    role = roles(build(fn, (params, S((B, B), "float32"), extra)))
    assert role.data == (2,) and role.batch == B  # x alone: inputs are b, w, x, c, v
    batch = {"v": S((B, 4), "float32"), "c": S((B,), "float32")}
    role = roles(build(fn, (params, S((B, B), "float32"), batch)))
    assert role.data == (2, 3, 4)


# --- a baseline that cannot apply says why, truly ----------------------------------------


def test_megatron_without_matrix_products_says_so():
    p = shardwise.plan(
        lambda params, x: x * params["scale"] + params["shift"],
        {"scale": S((C,), "float32"), "shift": S((C,), "float32")},
        S((B, C), "float32"),
        mesh=MESH, profile="cpu-2core", top=1,
    )  # fmt: skip
    assert dict(p.skipped)["megatron"] == (
        "no parameter is multiplied by an activation in a matrix product"
    )


def test_indivisible_shapes_are_named():
    graphdef, state = nnx.split(nnx.eval_shape(lambda: MLP(6, 6, 6, nnx.Rngs(0))))
    p = shardwise.plan(
        lambda state, x: nnx.merge(graphdef, state)(x), state, S((6, 6), "float32"),
        mesh=MESH, profile="cpu-2core", top=1,
    )  # fmt: skip
    why = dict(p.skipped)
    assert why["megatron"] == (
        "none of the 2 weights of matrix products has an output (column-parallel) or input "
        "(row-parallel) dimension that divides over data×model (8 devices)"
    )
    assert why["data-parallel"] == "the batch of x (6) does not divide over data×model (8 devices)"
    assert why["data×tensor"] == why["megatron"].replace("data×model (8", "model (4")


@pytest.mark.parametrize("make_key", [jax.random.key, jax.random.PRNGKey])
def test_every_plan_keeps_a_key_whole_and_draws_the_bits_jit_draws(make_key):
    def dropout(key, x, w):
        keep = jax.random.bernoulli(key, 0.5, x.shape)
        return jnp.where(keep, x, 0.0) @ w

    key, x = make_key(0), jnp.arange(16 * 32, dtype=jnp.float32).reshape(16, 32) / 100
    w = jnp.ones((32, 8)) / 32
    p = shardwise.plan(dropout, key, x, w, mesh="data=2,model=4", profile="cpu-2core", top=3)
    assert all(item.in_specs[0].canonical() == Spec().canonical() for item in p.plans)
    assert {"data-parallel", "fsdp"} <= {item.name for item in p.plans}
    want = jax.jit(dropout)(key, x, w)
    for item in p.plans:
        got = p.sharded(item.name)(key, x, w)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)
    done = p.verify(repeat=1)
    assert all(item.verified.collectives_match for item in done.plans if item.verified)


def test_a_mask_read_in_two_layouts_is_drawn_once_and_moved():
    """A dropout mask read by the loss split on the batch and by a second product split on
    the features (FSDP): XLA draws the bits once, in one layout, and moves them to the other
    (an all-to-all of the mask, where the model had taken them as free in every layout and
    predicted none); the plan lays the bits out and its prediction is what XLA compiles."""

    def step(state, x):
        key, sub = jax.random.split(state["key"])
        mask = jax.random.bernoulli(sub, 0.7, (x.shape[0], 64))
        masked = lambda w: jnp.where(mask, jax.nn.relu(x @ w), 0.0)  # noqa: E731
        loss, g = jax.value_and_grad(lambda w: jnp.mean(masked(w) ** 2))(state["w"])
        return {"key": key, "w": state["w"] - 0.1 * g}, loss + masked(state["w"]).mean()

    state = {"key": jax.random.key(0), "w": jnp.ones((32, 64)) / 32}
    x = jnp.arange(16 * 32, dtype=jnp.float32).reshape(16, 32) / 100
    p = shardwise.plan(step, state, x, mesh="data=2,model=4", profile="cpu-2core", top=1)
    assert "fsdp" in {item.name for item in p.plans}
    want = jax.jit(step)(state, x)
    got = p.sharded("fsdp")(state, x)
    np.testing.assert_allclose(np.asarray(got[1]), np.asarray(want[1]), rtol=1e-5)
    done = p.verify(repeat=1)
    assert all(item.verified.collectives_match for item in done.plans), [
        item.name for item in done.plans if not item.verified.collectives_match
    ]


def test_only_elementwise_ops_on_random_bits_are_drawn_with_them():
    """What is made from random bits alone element by element (the mask, the bits as floats)
    is drawn with them; a product, a transpose or a sort of random arrays is a step as any
    other's (a product of random matrices had been read as free: no dot, no collective), and
    a draw from an array of keys holds bits of the keys' dimensions too."""

    def gram(k):
        a = jax.random.normal(k, (64, 64))
        return a @ a.T, jnp.sort(a, axis=0)

    graph = build(gram, [jax.random.key(0)])
    assert {s.prim for s in graph.steps} >= {"dot_general", "transpose", "sort"}
    keys = jax.random.split(jax.random.key(0), 16)
    drawn = build(jax.vmap(lambda k: jax.random.bernoulli(k, 0.5, (64,))), [keys]).drawn
    assert [shape for _, shape, _ in drawn] == [(16, 64)]
