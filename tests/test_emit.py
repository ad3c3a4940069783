"""A plan in the words of the stack that runs it: MaxText's config block (read back with
PyYAML, and its rules resolved by Flax), rules by path that give every input its layout when
applied as EasyDeL applies them (first ``re.search`` match wins), the ``NamedSharding`` of
every input by argument, and ``shardwise plan --emit``."""

from __future__ import annotations

import ast
import json
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import NamedSharding, PartitionSpec
from typer.testing import CliRunner

import shardwise
from shardwise._errors import ArgumentError
from shardwise._model.logical import Named, entry, rules_for
from shardwise._model.maxtext import ICI_KEYS, LOGICAL_NAMES, MESH_AXES
from shardwise._model.patterns import path_rules
from shardwise._model.spec import Spec
from shardwise._program.emit import leaf_paths
from shardwise.cli import app

nn = pytest.importorskip("flax.linen")
optax = pytest.importorskip("optax")

from test_annotations import LinenBlock, LinenMLP, _boxes, _linen  # noqa: E402

PROFILE = "cpu-2core"
MESH = "data=2,tensor=4"
RULES = (("batch", "data"), ("mlp", "tensor"), ("heads", "tensor"), ("embed", None))


def _planned(model: str, top: int = 3) -> tuple[Any, Any]:
    x = jnp.ones((16, 8, 64)) if model == "block" else jnp.ones((32, 64))
    fn, params = _linen(LinenBlock() if model == "block" else LinenMLP(), x)
    return shardwise.plan(fn, params, x, mesh=MESH, profile=PROFILE, rules=RULES, top=top), params


def _first(rules: Any, path: str) -> PartitionSpec:
    """The spec the first rule whose regex is found in ``path`` gives (as EasyDeL does)."""
    return next(spec for regex, spec in rules if re.search(regex, path))


@pytest.mark.parametrize("model", ["mlp", "block"])
def test_maxtext_block_parses_and_holds_the_flax_rules(model: str) -> None:
    p, params = _planned(model)
    for q in p.plans:
        made = p.logical_rules(q.name)
        doc = yaml.safe_load(made.to_maxtext(p.mesh))
        assert doc["override_logical_axis_rules"] is True
        got = [(name, tuple(axes)) for name, axes in doc["logical_axis_rules"]]
        assert got == [(name, entry(axes)) for name, axes in made.to_flax()]
        assert doc["mesh_axes"] == list(MESH_AXES)
        sizes = {axis: doc[ICI_KEYS[axis]] for axis in MESH_AXES}
        assert sizes == {a: {"data": 2, "tensor": 4}.get(a, 1) for a in MESH_AXES}
        if made.exact:  # MaxText's rules, as Flax resolves them, give the plan's layouts
            flax_rules = [(n, tuple(a) or None) for n, a in doc["logical_axis_rules"]]
            for box, k in zip(_boxes(params), sorted(p.annotations.by_input), strict=True):
                rank = len(box.value.shape)
                resolved = nn.logical_to_mesh_axes(box.names, flax_rules)
                assert Spec.parse(resolved).padded(rank) == q.in_specs[k].padded(rank)


def test_names_maxtext_does_not_define_are_said() -> None:
    assert {"activation_batch", "embed", "mlp", "heads", "vocab"} <= set(LOGICAL_NAMES)
    assert "data" in MESH_AXES and ICI_KEYS["stage"] == "ici_pipeline_parallelism"
    made = rules_for([Named("w", ("embed", "hidden"), ((), ("tensor",)))])
    assert made.not_in_maxtext == ("hidden",)
    text = made.to_maxtext("tensor=8")
    assert "# logical names MaxText's base.yml does not define: hidden" in text.splitlines()
    clash = rules_for([Named("a", ("embed",), (("tensor",),)), Named("b", ("embed",), ((),))])
    assert any(line.startswith("# conflict: 'embed'") for line in clash.to_maxtext("tensor=8")
               .splitlines())  # fmt: skip


def test_a_mesh_axis_maxtext_does_not_know_is_refused_or_renamed() -> None:
    made = rules_for([Named("w", ("embed", "mlp"), ((), ("model",)))])
    with pytest.raises(ArgumentError, match=r"model.*rename=\{'model': 'tensor'\}"):
        made.to_maxtext("data=2,model=4")
    doc = yaml.safe_load(made.to_maxtext("data=2,model=4", rename={"model": "tensor"}))
    assert doc["logical_axis_rules"] == [["embed", []], ["mlp", ["tensor"]]]
    assert doc["ici_tensor_parallelism"] == 4 and doc["ici_data_parallelism"] == 2
    with pytest.raises(ArgumentError, match="one name"):
        made.to_maxtext("data=2,model=4", rename={"model": "data"})


def test_an_unannotated_plan_has_no_logical_rules_but_has_path_rules() -> None:
    x = jax.ShapeDtypeStruct((64, 32), "float32")
    w = {"w1": jax.ShapeDtypeStruct((32, 128), "float32"),
         "w2": jax.ShapeDtypeStruct((128, 32), "float32")}  # fmt: skip
    p = shardwise.plan(lambda x, w: jnp.tanh(x @ w["w1"]) @ w["w2"], x, w, mesh=MESH,
                       profile=PROFILE, top=3)  # fmt: skip
    with pytest.raises(ArgumentError, match="to_regex"):
        p.logical_rules().to_maxtext(p.mesh)
    assert leaf_paths(p.graph) == ["x", "w/w1", "w/w2"]
    _check_paths(p)


def _check_paths(p: Any) -> None:
    """Every plan's path rules give every input leaf exactly its spec."""
    paths = leaf_paths(p.graph)
    for q in p.plans:
        rules = p.to_regex(q.name)
        assert rules[-1][0] == ".*"
        for path, spec in zip(paths, q.in_specs, strict=True):
            assert Spec.parse(_first(rules, path)) == spec.canonical(), (q.name, path)


@pytest.mark.parametrize("model", ["mlp", "block"])
def test_path_rules_give_every_leaf_its_spec(model: str) -> None:
    p, _ = _planned(model)
    _check_paths(p)
    paths = leaf_paths(p.graph)
    assert "params/params/LinenMLP_0/Dense_0/kernel" in paths or model == "mlp"
    assert all(".value" not in path and not path.endswith("/value") for path in paths)
    assert any(len(p.to_regex(q.name)) < len(paths) for q in p.plans)  # patterns cover several


def test_path_rules_generalise_layer_numbers() -> None:
    layers = {f"layer_{k}": jax.ShapeDtypeStruct((64, 64), "float32") for k in range(4)}

    def stack(x: jax.Array, layers: Any) -> jax.Array:
        for w in layers.values():
            x = jnp.tanh(x @ w)
        return x

    x = jax.ShapeDtypeStruct((32, 64), "float32")
    fixed = {f"layers['layer_{k}']": "-,tensor" for k in range(4)}
    p = shardwise.plan(stack, x, layers, mesh="tensor=4", profile=PROFILE, top=1, fixed=fixed)
    _check_paths(p)
    assert len(p.to_regex()) <= 2


PART = st.sampled_from(["params", "layer_0", "layer_1", "layer_12", "kernel", "w1", "0", "a.b"])


@settings(max_examples=100, deadline=None)
@given(
    st.dictionaries(
        st.lists(PART, min_size=1, max_size=4).map("/".join),
        st.sampled_from(["-", "data", "-,tensor", "data,tensor", "(data,tensor)"]),
        min_size=1,
        max_size=12,
    )
)
def test_path_rules_hold_for_any_paths(layout: dict[str, str]) -> None:
    """Paths that end inside others (``kernel`` and ``params/kernel``), share digits or
    regex characters: the first rule found gives each path its spec."""
    paths, specs = list(layout), [Spec.parse(s) for s in layout.values()]
    rules = path_rules(paths, specs)
    for path, spec in zip(paths, specs, strict=True):
        assert next(s for regex, s in rules if re.search(regex, path)) == spec.canonical()


def test_shardings_come_apart_by_argument() -> None:
    params = {"w1": jnp.ones((64, 256)), "b1": jnp.zeros(256), "w2": jnp.ones((256, 64))}
    tx = optax.adamw(1e-3)
    opt_state = tx.init(params)

    def step(params: Any, opt_state: Any, x: jax.Array, y: jax.Array) -> Any:
        def loss(params: Any) -> jax.Array:
            h = jax.nn.relu(x @ params["w1"] + params["b1"])
            return jnp.mean((h @ params["w2"] - y) ** 2)

        grads = jax.grad(loss)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    x, y = jnp.ones((32, 64)), jnp.ones((32, 64))
    p = shardwise.plan(step, params, opt_state, x, y, mesh=MESH, profile=PROFILE, top=1)
    got = p.shardings()
    assert list(got) == ["params", "opt_state", "x", "y"]
    for name, arg in zip(got, (params, opt_state, x, y), strict=True):
        assert jax.tree.structure(got[name]) == jax.tree.structure(arg), name
    leaves = jax.tree.leaves(tuple(got.values()))
    assert all(isinstance(s, NamedSharding) for s in leaves)
    assert [s.spec for s in leaves] == jax.tree.leaves(
        p.in_specs, is_leaf=lambda s: isinstance(s, PartitionSpec)
    )
    assert dict(leaves[0].mesh.shape) == {"data": 2, "tensor": 4}
    placed = jax.device_put(opt_state, got["opt_state"])  # as jax takes them
    assert jax.tree.leaves(placed)[1].sharding == jax.tree.leaves(got["opt_state"])[1]


def test_shardings_on_an_explicit_mesh_run_under_plain_jax_jit() -> None:
    """On ``jax.make_mesh``'s Explicit axes the shardings had typed each array Explicit, and
    ``jax.jit`` of a step whose contracted dimension the plan splits failed: JAX asks such
    code to name the dot's output sharding. They are on the mesh's Auto twin, as the plan
    runs, and the step compiles to the plan's collectives."""
    from jax.sharding import AxisType

    from shardwise._xla.hlo import collectives
    from shardwise._xla.verified import collectives_match

    def mlp(params: Any, x: jax.Array) -> jax.Array:
        return jnp.tanh(x @ params["w1"]) @ params["w2"]

    params, x = {"w1": jnp.ones((64, 256)), "w2": jnp.ones((256, 64))}, jnp.ones((32, 64))
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
    p = shardwise.plan(mlp, params, x, mesh=mesh, profile=PROFILE, fixed={"params.w1": "-,model"})
    sh = p.shardings()
    assert all(not s.mesh.are_all_axes_explicit for s in jax.tree.leaves(sh))
    placed = jax.device_put((params, x), (sh["params"], sh["x"]))
    jitted = jax.jit(mlp, in_shardings=(sh["params"], sh["x"]))
    got = jitted(*placed)
    np.testing.assert_allclose(np.asarray(got), np.asarray(mlp(params, x)), rtol=1e-5)
    found = collectives(jitted.lower(*placed).compile().as_text() or "", p.mesh.shape)
    assert collectives_match(p.chosen.predicted.collectives, tuple(found), by_bytes=True)


MODEL = """
import jax
import jax.numpy as jnp
import flax.linen as nn


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        init = nn.initializers.lecun_normal()
        up = nn.with_logical_partitioning(init, ("embed", "mlp"))
        down = nn.with_logical_partitioning(init, ("mlp", "embed"))
        h = nn.relu(nn.Dense(256, kernel_init=up)(x))
        return nn.Dense(64, kernel_init=down)(h)


def forward(params, x):
    return MLP().apply(params, x)


def example():
    x = jax.ShapeDtypeStruct((32, 64), jnp.float32)
    return jax.eval_shape(lambda: MLP().init(jax.random.key(0), jnp.ones((32, 64)))), x
"""


def _cli(tmp_path: Any, *extra: str) -> Any:
    src = tmp_path / "model.py"
    src.write_text(MODEL)
    args = ["plan", "--function", f"{src}:forward", "--args", f"{src}:example",
            "--profile", PROFILE, "--top", "1", "-q", *extra]  # fmt: skip
    return CliRunner().invoke(app, args, env={"COLUMNS": "200"})


def _literal(text: str) -> Any:
    """The Python tuple printed last (from its line ``(`` to its line ``)``)."""
    lines = text.splitlines()
    start = max(k for k, line in enumerate(lines) if line == "(")
    end = next(k for k in range(start, len(lines)) if lines[k] == ")")
    return ast.literal_eval("\n".join(lines[start : end + 1]))


def test_cli_emits_flax_rules_maxtext_and_paths(tmp_path: Any) -> None:
    result = _cli(tmp_path, "--mesh", MESH, "--emit", "flax")
    assert result.exit_code == 0, result.output
    assert "Flax's logical axis rules" in result.stdout
    rules = _literal(result.stdout)
    assert {name for name, _ in rules} == {"embed", "mlp"}
    made = _cli(tmp_path, "--mesh", MESH, "--emit", "maxtext", "--json")
    assert made.exit_code == 0, made.output
    doc = json.loads(made.stdout)["emit"]
    block = yaml.safe_load(doc["text"])
    assert [(n, tuple(a)) for n, a in block["logical_axis_rules"]] == [
        (n, entry(a)) for n, a in rules
    ]
    paths = _cli(tmp_path, "--mesh", MESH, "--emit", "regex")
    assert paths.exit_code == 0, paths.output
    assert _literal(paths.stdout.replace("P(", "("))[-1][0] == ".*"


def test_cli_says_conflicts_and_what_has_no_logical_names(tmp_path: Any) -> None:
    kernels = [f"params['params']['Dense_{k}']['kernel'].value=tensor" for k in (0, 1)]
    result = _cli(tmp_path, "--mesh", "tensor=4", "--emit", "flax",
                  *(a for k in kernels for a in ("--fixed", k)))  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "# conflict: 'embed' is laid out 2 ways" in result.stdout
    plain = tmp_path / "plain.py"
    plain.write_text("def f(x, w):\n    return x @ w\n")
    args = ["plan", "--function", f"{plain}:f", "--args", "x=f32[64,32]", "--args",
            "w=f32[32,16]", "--mesh", MESH, "--profile", PROFILE, "--emit", "maxtext"]  # fmt: skip
    refused = CliRunner().invoke(app, args)
    assert refused.exit_code == 2
    text = " ".join(refused.output.split())
    assert "no logical names" in text and "--emit regex" in text
    bad = CliRunner().invoke(app, [*args[:-1], "yaml"])
    assert bad.exit_code == 2 and "flax, maxtext, regex, specs" in bad.output
    einsum = ["plan", "nd,nd->n", "--shapes", "8x4,8x4", "--mesh", "x=2", "--emit", "regex"]
    refused = CliRunner().invoke(app, einsum)
    assert refused.exit_code == 2 and "--model or --function" in refused.output


def test_cli_reads_rules_inline_and_from_maxtext_yaml(tmp_path: Any) -> None:
    """``--rules`` inline or as the YAML ``--emit maxtext`` writes: the plan of the annotations
    is in the table, and ``--respect annotations`` makes it the search's."""
    inline = _cli(tmp_path, "--mesh", MESH, "--rules", "embed=-,mlp=tensor", "--json")
    assert inline.exit_code == 0, inline.output
    plans = {p["name"]: p for p in json.loads(inline.stdout)["plans"]}
    assert "annotations" in plans
    made = _cli(tmp_path, "--mesh", MESH, "--emit", "maxtext", "--json")
    rules_file = tmp_path / "rules.yml"
    rules_file.write_text(json.loads(made.stdout)["emit"]["text"])
    held = _cli(tmp_path, "--mesh", MESH, "--rules", str(rules_file), "--respect", "annotations",
                "--json")  # fmt: skip
    assert held.exit_code == 0, held.output
    doc = json.loads(held.stdout)
    assert doc["respect"] == "annotations"
    assert "annotations" not in {p["name"] for p in doc["plans"]}
    for bad, said in (("embed", "NAME=AXES"), (str(tmp_path / "none.yml"), "cannot read")):
        refused = _cli(tmp_path, "--mesh", MESH, "--rules", bad)
        assert refused.exit_code == 2 and said in " ".join(refused.output.split())
    refused = _cli(tmp_path, "--mesh", MESH, "--respect", "all")
    assert refused.exit_code == 2 and "'annotations'" in " ".join(refused.output.split())


def test_json_layouts_keep_the_names_of_an_optimizer_states_fields():
    """An optax state (named tuples) and an Equinox module are keyed by their fields' names in
    the plan's JSON, as the user reads them: the layouts had come as bare lists."""
    eqx = pytest.importorskip("equinox")
    params = {"w": jnp.ones((8, 16))}
    state = optax.adamw(1e-3).init(params)
    layer = eqx.nn.Linear(16, 4, key=jax.random.key(0))

    def step(params, state, layer, x):
        return (layer(x @ params["w"]) + state[0].mu["w"].sum()).sum()

    plan = shardwise.plan(step, params, state, layer, jnp.ones(8), mesh=MESH, profile=PROFILE,
                          top=1)  # fmt: skip
    given = plan.to_json()["plans"][0]["in_specs"]
    adam = given[1][0]
    assert set(adam) == {"count", "mu", "nu"} and set(adam["mu"]) == {"w"}
    assert set(given[2]) == {"weight", "bias"}
    assert len(given[2]["weight"]) == 2 and len(given[0]["w"]) == 2
