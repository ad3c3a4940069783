"""What a model already says about its layout (Flax's annotations, arrays' shardings) read,
planned as the plan named ``annotations`` or held fixed with ``respect="annotations"``, and a
plan handed back as logical axis rules that Flax's own resolution turns into exactly the
plan's layouts (Linen's ``nn.logical_to_mesh_axes``, NNX's ``nnx.get_partition_spec``)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import NamedSharding, PartitionSpec

import shardwise
from shardwise._errors import ArgumentError
from shardwise._model.logical import Named, resolve, rules_for
from shardwise._model.spec import Spec

nn = pytest.importorskip("flax.linen")
nnx = pytest.importorskip("flax.nnx")

PROFILE = "cpu-2core"
MESHES = {
    "data=2,model=4": (("batch", "data"), ("mlp", "model"), ("embed", None), ("heads", "model")),
    "data=2,fsdp=2,tensor=2": (
        ("batch", ("data", "fsdp")), ("mlp", "tensor"), ("heads", "tensor"), ("embed", "fsdp"),
    ),
}  # fmt: skip


def _param(module: nn.Module, name: str, names: tuple[str | None, ...], shape: tuple[int, ...],
           init: Any = None) -> jax.Array:  # fmt: skip
    init = init or nn.initializers.lecun_normal()
    return module.param(name, nn.with_logical_partitioning(init, names), shape)


class LinenMLP(nn.Module):
    """An MLP whose every parameter carries logical names, as Flax's guide writes it."""

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        init = nn.initializers.lecun_normal()
        zeros = nn.initializers.zeros
        up = nn.Dense(
            256,
            kernel_init=nn.with_logical_partitioning(init, ("embed", "mlp")),
            bias_init=nn.with_logical_partitioning(zeros, ("mlp",)),
        )
        down = nn.Dense(
            64,
            kernel_init=nn.with_logical_partitioning(init, ("mlp", "embed")),
            bias_init=nn.with_logical_partitioning(zeros, ("embed",)),
        )
        return down(nn.relu(up(x)))


class LinenBlock(nn.Module):
    """A pre-LayerNorm attention block and MLP, every parameter named, its projections
    written with ``self.param`` and einsums as MaxText writes them (heads × head_dim)."""

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        ones = nn.initializers.ones
        norm = nn.LayerNorm(scale_init=nn.with_logical_partitioning(ones, ("embed",)),
                            use_bias=False)  # fmt: skip
        h = norm(x)
        q, k, v = (
            jnp.einsum("bsd,dhk->bshk", h, _param(self, n, ("embed", "heads", "kv"), (64, 4, 16)))
            for n in ("wq", "wk", "wv")
        )
        scores = jnp.einsum("bqhk,bshk->bhqs", q, k) / 4.0
        mixed = jnp.einsum("bhqs,bshk->bqhk", jax.nn.softmax(scores, axis=-1), v)
        wo = _param(self, "wo", ("heads", "kv", "embed"), (4, 16, 64))
        x = x + jnp.einsum("bqhk,hkd->bqd", mixed, wo)
        norm2 = nn.LayerNorm(scale_init=nn.with_logical_partitioning(ones, ("embed",)),
                             use_bias=False)  # fmt: skip
        return x + LinenMLP()(norm2(x))


def _linen(model: nn.Module, x: jax.Array) -> tuple[Any, Any]:
    params = model.init(jax.random.key(0), x)
    return (lambda params, x: model.apply(params, x)), params


def _boxes(tree: Any) -> list[Any]:
    boxed = jax.tree.leaves(tree, is_leaf=lambda b: isinstance(b, nn.LogicallyPartitioned))
    return [b for b in boxed if isinstance(b, nn.LogicallyPartitioned)]


@pytest.mark.parametrize("mesh", list(MESHES))
@pytest.mark.parametrize("model", ["mlp", "block"])
def test_linen_rules_give_every_plan_its_layouts(mesh: str, model: str) -> None:
    x = jnp.ones((16, 8, 64)) if model == "block" else jnp.ones((32, 64))
    fn, params = _linen(LinenBlock() if model == "block" else LinenMLP(), x)
    rules = MESHES[mesh]
    p = shardwise.plan(fn, params, x, mesh=mesh, profile=PROFILE, rules=rules, top=3)
    boxes = _boxes(params)
    assert len(boxes) == len(p.annotations.by_input) > 0
    assert sum(p.logical_rules(q.name).exact for q in p.plans) > len(p.plans) // 2
    for q in p.plans:
        made = p.logical_rules(q.name)
        if not made.exact:  # then it says which names, with the arrays that disagree
            assert all((c.wants and len(c.wants) > 1) or c.name is None for c in made.conflicts)
            continue
        for box, k in zip(boxes, sorted(p.annotations.by_input), strict=True):
            flax_spec = nn.logical_to_mesh_axes(box.names, made.to_flax())
            rank = len(box.value.shape)
            want = q.in_specs[k].padded(rank)
            assert Spec.parse(flax_spec).padded(rank) == want, (q.name, box.names)
    # the annotations under the given rules, as a plan beside the search's
    annotated = p.get("annotations")
    for box, k in zip(boxes, sorted(p.annotations.by_input), strict=True):
        rank = len(box.value.shape)
        want = Spec.parse(nn.logical_to_mesh_axes(box.names, rules)).padded(rank)
        assert annotated.in_specs[k].padded(rank) == want


def test_respecting_annotations_lays_out_the_inputs_as_annotated() -> None:
    x = jnp.ones((32, 64))
    fn, params = _linen(LinenMLP(), x)
    rules = MESHES["data=2,model=4"]
    free = shardwise.plan(fn, params, x, mesh="data=2,model=4", profile=PROFILE, rules=rules)
    held = shardwise.plan(
        fn, params, x, mesh="data=2,model=4", profile=PROFILE, rules=rules, respect="annotations"
    )
    assert "annotations" not in [q.name for q in held.plans]
    want = free.get("annotations").in_specs
    for q in (q for q in held.plans if q.name.startswith("search")):  # baselines are theirs
        for k in held.annotations.by_input:
            assert q.in_specs[k] == want[k], q.name
    # a pinned input wins over its annotation
    name = held.graph.names[min(held.annotations.by_input)]
    pinned = shardwise.plan(fn, params, x, mesh="data=2,model=4", profile=PROFILE, rules=rules,
                            respect="annotations", fixed={name: "data"})  # fmt: skip
    assert pinned.chosen.in_specs[min(held.annotations.by_input)] == Spec.parse("data")


class NnxMLP(nnx.Module):
    """The NNX MLP of Flax's guide, every parameter annotated with ``nnx.with_partitioning``."""

    def __init__(self, rngs: nnx.Rngs) -> None:
        init, zeros = nnx.initializers.lecun_normal(), nnx.initializers.zeros_init()
        self.up = nnx.Linear(64, 256, rngs=rngs,
                             kernel_init=nnx.with_partitioning(init, ("embed", "mlp")),
                             bias_init=nnx.with_partitioning(zeros, ("mlp",)))  # fmt: skip
        self.down = nnx.Linear(256, 64, rngs=rngs,
                               kernel_init=nnx.with_partitioning(init, ("mlp", "embed")),
                               bias_init=nnx.with_partitioning(zeros, ("embed",)))  # fmt: skip

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down(nnx.relu(self.up(x)))


class NnxBlock(nnx.Module):
    """:class:`LinenBlock` in NNX: ``nnx.Param`` s with ``out_sharding`` names."""

    def __init__(self, rngs: nnx.Rngs) -> None:
        init, ones = nnx.initializers.lecun_normal(), nnx.initializers.ones_init()

        def param(names: tuple[str, ...], shape: tuple[int, ...]) -> Any:
            return nnx.Param(init(rngs.params(), shape), out_sharding=names)

        self.wq, self.wk, self.wv = (param(("embed", "heads", "kv"), (64, 4, 16)) for _ in "qkv")
        self.wo = param(("heads", "kv", "embed"), (4, 16, 64))
        self.norms = nnx.List(
            nnx.LayerNorm(
                64, scale_init=nnx.with_partitioning(ones, ("embed",)), use_bias=False, rngs=rngs
            )
            for _ in range(2)
        )
        self.mlp = NnxMLP(rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        h = self.norms[0](x)
        q, k, v = (jnp.einsum("bsd,dhk->bshk", h, w[...]) for w in (self.wq, self.wk, self.wv))
        scores = jnp.einsum("bqhk,bshk->bhqs", q, k) / 4.0
        mixed = jnp.einsum("bhqs,bshk->bqhk", jax.nn.softmax(scores, axis=-1), v)
        x = x + jnp.einsum("bqhk,hkd->bqd", mixed, self.wo[...])
        return x + self.mlp(self.norms[1](x))


def nnx_split(cls: type) -> tuple[Any, Any]:
    """The forward pass over the state of a new ``cls`` (made without a mesh), and that state."""
    with nnx.use_eager_sharding(False):
        graphdef, state = nnx.split(cls(nnx.Rngs(0)))

    def forward(state: Any, x: jax.Array) -> jax.Array:
        return nnx.merge(graphdef, state)(x)

    return forward, state


@pytest.mark.parametrize("cls", [NnxMLP, NnxBlock])
def test_nnx_partitioning_round_trips_through_nnx_rules(cls: type) -> None:
    forward, state = nnx_split(cls)
    x = jnp.ones((16, 8, 64)) if cls is NnxBlock else jnp.ones((32, 64))
    p = shardwise.plan(forward, state, x, mesh="data=2,model=4", profile=PROFILE, top=3)
    assert {a.style for a in p.annotations.by_input.values()} == {"nnx"}
    # NNX has no fallbacks (the last rule of a name wins): FSDP splits embed in the up kernel
    # and leaves it whole in the down kernel, whose mlp took the axis: a conflict there
    assert sum(p.logical_rules(q.name).exact for q in p.plans) >= 2
    for q in p.plans:
        made = p.logical_rules(q.name)
        if not made.exact:
            continue
        with nnx.logical_axis_rules(made.to_flax()):
            specs = jax.tree.leaves(
                nnx.get_partition_spec(state), is_leaf=lambda s: isinstance(s, PartitionSpec)
            )
        for k, spec in enumerate(specs):  # the state's leaves are the first inputs
            rank = len(p.graph.values[p.graph.inputs[k]].shape)
            assert Spec.parse(spec).padded(rank) == q.in_specs[k].padded(rank), q.name


def test_arrays_already_sharded_are_read_as_annotations() -> None:
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    w = jax.device_put(jnp.ones((64, 256)), NamedSharding(mesh, PartitionSpec(None, "model")))
    x = jnp.ones((32, 64))
    p = shardwise.plan(lambda x, w: jnp.tanh(x @ w), x, w, mesh=mesh, profile=PROFILE)
    assert p.annotations.by_input[1].carried == Spec.parse("-,model")
    assert p.get("annotations").in_specs[1] == Spec.parse("-,model")


def test_conflicting_layouts_are_reported_not_resolved() -> None:
    x = jnp.ones((32, 64))
    fn, params = _linen(LinenMLP(), x)
    names = shardwise.plan(fn, params, x, mesh="model=4", profile=PROFILE, top=1).graph.names
    up, down = (n for n in names if "kernel" in n)
    # embed split on model in the first kernel, whole in the second: no rules give both
    p = shardwise.plan(fn, params, x, mesh="model=4", profile=PROFILE, top=1,
                       fixed={up: "model", down: "model"})  # fmt: skip
    made = p.logical_rules()
    assert not made.exact
    (conflict,) = [c for c in made.conflicts if c.name == "embed"]
    assert {up, down} <= {w for _, whats in conflict.wants for w in whats}
    assert "different logical names" in conflict.describe()


def test_bad_rules_and_respect_are_refused() -> None:
    x = jnp.ones((32, 64))
    fn, params = _linen(LinenMLP(), x)
    with pytest.raises(ArgumentError, match="pair"):
        shardwise.plan(fn, params, x, mesh="model=4", profile=PROFILE, rules=[("mlp",)])
    with pytest.raises(ArgumentError, match="respect"):
        shardwise.plan(fn, params, x, mesh="model=4", profile=PROFILE, respect="everything")
    with pytest.raises(ArgumentError, match="no annotations"):
        shardwise.plan(lambda x: x * 2, x, mesh="model=4", profile=PROFILE, respect="annotations")
    p = shardwise.plan(lambda x: x * 2, x, mesh="model=4", profile=PROFILE)
    assert "annotations" not in [q.name for q in p.plans] + [n for n, _ in p.skipped]
    boxed = nn.LogicallyPartitioned(x, ("batch", "embed"))  # logical names, no rules
    p = shardwise.plan(lambda b: b.value * 2, boxed, mesh="model=4", profile=PROFILE)
    assert "rules=" in dict(p.skipped)["annotations"]


NAMES = ["batch", "embed", "mlp", "heads", None]
AXES = st.sampled_from([None, "data", "model", ("data", "model"), ("model", "data")])


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.lists(st.sampled_from(NAMES), min_size=1, max_size=3), min_size=1, max_size=4),
    st.lists(st.tuples(st.sampled_from(NAMES[:-1]), AXES), max_size=6),
)
def test_resolution_is_flax_own(arrays: list[list[str | None]], rules: list[Any]) -> None:
    """Linen's resolution of any names under any rules, as Flax computes it; and the rules
    found for the layouts those rules give reproduce them (or say which names conflict)."""
    named = []
    for k, names in enumerate(arrays):
        if len({n for n in names if n}) < len([n for n in names if n]):
            continue  # Flax refuses a name on two dimensions
        ours = resolve(tuple(names), tuple(rules))
        theirs = nn.logical_to_mesh_axes(tuple(names), tuple(rules))
        assert ours == Spec.parse(theirs).padded(len(names))
        named.append(Named(f"a{k}", tuple(names), ours))
    made = rules_for(named)
    for a in named:
        got = Spec.parse(nn.logical_to_mesh_axes(a.names, made.to_flax())).padded(len(a.names))
        assert got == a.layout or any(c.name in a.names for c in made.conflicts)
    assert made.exact or made.conflicts


def test_reports_compare_the_annotations_and_explain_the_rules() -> None:
    x = jnp.ones((32, 64))
    fn, params = _linen(LinenMLP(), x)
    p = shardwise.plan(fn, params, x, mesh="data=2,model=4", profile=PROFILE, top=2,
                       rules=MESHES["data=2,model=4"])  # fmt: skip
    text = str(p)
    annotated, search = p.get("annotations").predicted, p.get("search").predicted
    assert f"{annotated.seconds / search.seconds:.2f}× the search's predicted time" in text
    assert "logical axis rules that give the chosen plan" in text
    for name, _ in p.logical_rules().rules:
        assert f"  {name} → " in text
    page = p.to_html()
    assert "Logical axis rules for the chosen plan" in page
    assert p.to_json()["logical_rules"]["rules"][0][0] == p.logical_rules().rules[0][0]


def test_constraints_on_other_axes_are_left_out_unless_respected() -> None:
    """A model whose logical constraints resolve to axes the planned mesh lacks (planned for
    another mesh than its rules') plans as if they were not there; holding them is an error
    that says where."""
    from library_models import linen_logical

    fn, args = linen_logical()  # rules: batch → data, hidden → model
    p = shardwise.plan(fn, *args, mesh="rows=8", profile=PROFILE, top=1)
    assert p.graph.placed == ()
    with pytest.raises(shardwise.UserCodeError, match="model"):
        shardwise.plan(fn, *args, mesh="rows=8", profile=PROFILE, respect="constraints")
    held = shardwise.plan(fn, *args, mesh="data=2,model=4", profile=PROFILE, top=1)
    assert len(held.graph.placed) == 3  # two kernels as Flax unboxes them, one activation


def test_the_report_names_the_collectives_the_annotations_cause() -> None:
    x = jnp.ones((64, 64))
    fn, params = _linen(LinenMLP(), x)
    rules = (("embed", "model"), ("mlp", None))  # every weight split on its embed dimension
    p = shardwise.plan(fn, params, x, mesh="model=8", profile=PROFILE, top=1, rules=rules)
    mine, search = p.get("annotations").predicted, p.get("search").predicted
    assert len(mine.collectives) > len(search.collectives)
    assert "which the search's plan avoids" in str(p)
    compared = p.to_json()["annotations"]
    assert compared["time_ratio"] == pytest.approx(mine.seconds / search.seconds)
    assert sum(c["count"] for c in compared["avoided"]) >= 1
    assert "Your annotations against the plan" in p.to_html()


def test_an_optimizers_state_is_read_with_its_own_sharding() -> None:
    """An NNX optimizer's state variables carry the parameter's names, or the names given
    for the optimizer (``optimizer_sharding``) where the parameter's state is laid out apart."""
    from flax.nnx.training.optimizer import OptVariable

    w = jnp.ones((64, 256))
    names = {"out_sharding": ("embed", "mlp"), "optimizer_sharding": (None, "mlp")}
    with nnx.use_eager_sharding(False):
        state = {"param": nnx.Param(w, **names), "mu": OptVariable(w, **names)}
    read = shardwise.plan(
        lambda s, x: x @ (s["param"][...] + s["mu"][...]), state, jnp.ones((8, 64)),
        mesh="model=4", profile=PROFILE, top=1,
    ).annotations.by_input  # fmt: skip
    assert read[0].names == (None, "mlp") and read[1].names == ("embed", "mlp")  # mu, param


@pytest.mark.parametrize("cls", [NnxMLP, NnxBlock])
def test_respecting_names_keeps_plans_rules_can_write(cls: type) -> None:
    """``respect="names"``: every plan of the search has exact rules (unnamed dimensions whole,
    one layout per name), and on these models the best such plan costs at most 1% more than
    the free best."""
    forward, state = nnx_split(cls)
    x = jnp.ones((16, 8, 64)) if cls is NnxBlock else jnp.ones((32, 64))
    free = shardwise.plan(forward, state, x, mesh="data=2,model=4", profile=PROFILE, top=3)
    held = shardwise.plan(forward, state, x, mesh="data=2,model=4", profile=PROFILE, top=3,
                          respect="names")  # fmt: skip
    for q in held.plans:
        if q.name.startswith("search"):
            assert held.logical_rules(q.name).exact, q.name
    assert held.get("search").predicted.seconds <= 1.01 * free.get("search").predicted.seconds
    assert held.respect == "names"


def test_respecting_names_without_any_is_refused() -> None:
    """A program with no logical names has no rules to keep to: respect='names' had planned
    it as respect='none', silently."""
    with pytest.raises(shardwise.ArgumentError, match="no argument has logical names"):
        shardwise.plan(lambda x, w: x @ w, jnp.ones((8, 8)), jnp.ones((8, 8)), mesh="model=4",
                       profile=PROFILE, respect="names")  # fmt: skip


def test_rules_that_name_an_axis_the_mesh_lacks_are_said_not_dropped() -> None:
    """Rules that map 'mlp' to 'model' on a mesh of data and tensor: the annotated kernels
    had been left to the search (respect='annotations' laid them out as it chose, silently),
    and the plan named 'annotations' had not been the annotations."""
    x = jnp.ones((32, 64))
    fn, params = _linen(LinenMLP(), x)
    rules = [("embed", None), ("mlp", "model")]
    with pytest.raises(shardwise.ArgumentError, match=r"name mesh axes \['model'\] not in"):
        shardwise.plan(fn, params, x, mesh="data=2,tensor=4", profile=PROFILE, rules=rules,
                       respect="annotations")  # fmt: skip
    p = shardwise.plan(fn, params, x, mesh="data=2,tensor=4", profile=PROFILE, rules=rules)
    assert "annotations" not in [q.name for q in p.plans]
    assert any(name == "annotations" and "not in the mesh" in why for name, why in p.skipped)
