"""Meshes and arrays as users hold them: the Explicit meshes ``jax.make_mesh`` makes, mixed
meshes, the mesh set with ``jax.set_mesh``, and arrays already laid out some other way — each
through einsum, shard, explain, stream and the program planner, every result against NumPy."""

from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import shardwise

RNG = np.random.default_rng(0)
A = RNG.standard_normal((16, 32)).astype(np.float32)
B = RNG.standard_normal((32, 8)).astype(np.float32)


def _explicit() -> jax.sharding.Mesh:
    return jax.make_mesh((2, 4), ("x", "y"))


def _mixed() -> jax.sharding.Mesh:
    return jax.make_mesh((2, 4), ("x", "y"), axis_types=(AxisType.Explicit, AxisType.Auto))


MESHES = {"explicit": _explicit, "mixed": _mixed}


def test_make_mesh_is_explicit_by_default():
    """The premise of this file: what JAX hands a user by default has Explicit axes."""
    assert all(t == AxisType.Explicit for t in _explicit().axis_types)


@pytest.mark.parametrize("kind", MESHES)
def test_einsum_and_shard_on_explicit_and_mixed_meshes(kind):
    m = MESHES[kind]()
    out = shardwise.einsum("ij,jk->ik", A, B, mesh=m, in_specs=("x,y", "y,-"))
    np.testing.assert_allclose(np.asarray(out), A @ B, rtol=1e-5, atol=1e-5)
    f = shardwise.shard(lambda a, b: jnp.tanh(a @ b), m, in_specs=("x,-", "-,y"))
    np.testing.assert_allclose(np.asarray(f(A, B)), np.tanh(A @ B), rtol=1e-5, atol=1e-5)


def test_the_tutorials_scenarios_run_through_shard_on_jax_make_mesh():
    """On JAX's default mesh (Explicit axes) the tutorial's S1 had failed with JAX's vmap error
    ("Mapped away dimension … devices vs None") and S4 with the Explicit-mode contraction
    error, though the user gave out_specs: shard runs such code with the axes Auto, as pjit
    did, and types the results by the mesh's axes."""
    from jax.sharding import PartitionSpec as P

    v = RNG.standard_normal((80, 3)).astype(np.float32)
    line = jax.make_mesh((8,), ("devices",))
    s1 = shardwise.shard(jax.vmap(jnp.dot), line, in_specs=(P("devices"), None),
                         out_specs=P("devices"))  # fmt: skip
    for _ in range(2):  # (the second call runs as the first did)
        out = s1(v, v)
        np.testing.assert_allclose(np.asarray(out), (v * v).sum(1), rtol=1e-5)
        assert out.sharding.mesh == line and out.sharding.spec == P("devices")
    grid = _explicit()
    w = RNG.standard_normal((16, 40)).astype(np.float32)
    s4 = shardwise.shard(jax.vmap(jnp.dot), grid, in_specs=(P("x", "y"), P("x", "y")),
                         out_specs=P("x"))  # fmt: skip
    out = s4(w, w)
    np.testing.assert_allclose(np.asarray(out), (w * w).sum(1), rtol=1e-5)
    assert out.sharding.mesh == grid and out.sharding.spec == P("x")


def test_set_mesh_is_the_default_mesh(tmp_path):
    m = _explicit()
    with jax.set_mesh(m):
        out = shardwise.einsum("ij,jk->ik", A, B)
        e = shardwise.explain("ij,jk->ik", A, B, in_specs=("x,y", "y,-"))
        p = shardwise.plan(lambda a, b: a @ b, A, B, profile="cpu-2core", top=1)
        big = RNG.standard_normal((256, 32)).astype(np.float32)
        shardwise.stream("ij,jk->ik", big, B, out=tmp_path / "o.npy", chunk=128)
    np.testing.assert_allclose(np.asarray(out), A @ B, rtol=1e-5, atol=1e-5)
    assert out.sharding.mesh.shape == m.shape
    assert [c.mesh_axes for c in e.collectives] == [("y",)]  # the split j summed over y
    assert p.devices is m and p.mesh.names == ("x", "y")
    np.testing.assert_allclose(np.load(tmp_path / "o.npy"), big @ B, rtol=1e-5, atol=1e-5)


def test_plan_without_any_mesh_says_how_to_give_one():
    with pytest.raises(shardwise.ArgumentError, match=r"jax\.set_mesh"):
        shardwise.plan(lambda a: a * 2, A)


def _mlp(params, x):
    return jnp.tanh(x @ params["w1"]) @ params["w2"]


PARAMS = {
    "w1": RNG.standard_normal((32, 64)).astype(np.float32) * 0.1,
    "w2": RNG.standard_normal((64, 8)).astype(np.float32) * 0.1,
}


@pytest.mark.parametrize("kind", MESHES)
def test_program_plans_run_and_verify_on_explicit_meshes(kind):
    m = MESHES[kind]()
    p = shardwise.plan(_mlp, PARAMS, A, mesh=m, profile="cpu-2core", top=2)
    want = _mlp(PARAMS, A)
    for item in p.plans:
        out = p.sharded(item.name)(PARAMS, A)
        np.testing.assert_allclose(np.asarray(out), want, rtol=1e-4, atol=1e-5)
        assert out.sharding.mesh.axis_types == m.axis_types  # results stay on the user's mesh
    done = p.verify(repeat=1)
    assert all(item.verified.collectives_match for item in done.plans if item.verified)


@pytest.mark.parametrize("kind", MESHES)
def test_a_plans_empty_result_on_an_explicit_mesh_can_be_read(kind):
    # JAX lays out an empty result typed split as whole blocks on every device, which
    # np.asarray cannot read ("could not broadcast input array from shape (0,4) into (0,1)");
    # every plan's result of an empty batch had been so
    fn = lambda p, x: jnp.tanh(x @ p["w"] + p["b"])  # noqa: E731
    params, x = {"w": jnp.ones((6, 4)), "b": jnp.ones((4,))}, jnp.ones((0, 6))
    p = shardwise.plan(fn, params, x, mesh=MESHES[kind](), profile="cpu-2core", top=2)
    for item in p.plans:
        out = p.sharded(item.name)(params, x)
        assert np.asarray(out).shape == (0, 4), item.name


def test_a_function_that_uses_explicit_sharding_plans_and_runs():
    """``out_sharding=`` on a dot and ``reshard`` are the user's layouts; the plan's replace
    them, and the numbers stay the function's."""
    m = _explicit()

    def f(a, b):
        y = jnp.matmul(a, b, out_sharding=P("x", None))
        return jax.sharding.reshard(jnp.sin(y), P(None, "y")).sum(axis=0)

    with jax.set_mesh(m):
        want = np.asarray(jax.jit(f)(A, B))
        p = shardwise.plan(f, A, B, profile="cpu-2core", top=1)
    np.testing.assert_allclose(np.asarray(p.sharded()(A, B)), want, rtol=1e-5, atol=1e-5)


def test_a_function_that_asserts_its_arguments_shardings_plans_runs_and_verifies():
    """Code on Explicit axes may assert the layout its arguments arrive in; planning had traced
    it with unsharded abstract arguments only, so the user's assert failed (``P(None,
    None)``). It is traced with the arrays' own shardings where that alone fails."""
    m = _explicit()

    def f(a, b):
        assert jax.typeof(a).sharding.spec == P("x", None), jax.typeof(a).sharding.spec
        return jnp.tanh(a @ b).sum(axis=0)

    with jax.set_mesh(m):
        a, b = jax.device_put(A, P("x", None)), jax.device_put(B, P(None, "y"))
        want = np.asarray(jax.jit(f)(a, b))
        p = shardwise.plan(f, a, b, profile="cpu-2core", top=2)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", shardwise.ShardwiseWarning)  # (moved to the plan's)
            for item in p.plans:
                got = np.asarray(p.sharded(item.name)(a, b))
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=item.name)
        checked = p.verify(repeat=1)
    assert all(item.verified.collectives_match for item in checked.plans)
    with jax.set_mesh(m), pytest.raises(shardwise.UserCodeError, match="AssertionError"):
        shardwise.plan(f, A, B, profile="cpu-2core", top=1)  # (host arrays: no layout to keep)


@pytest.mark.parametrize("kind", ["explicit", "auto"])
def test_explain_takes_arrays_laid_out_otherwise_than_its_specs(kind):
    """``explain`` compiles for its specs, as a call runs: arrays already laid out otherwise
    had made JAX refuse them (``Sharding passed to jit does not match``)."""
    m = _explicit() if kind == "explicit" else shardwise.mesh("x=2,y=4")
    a = jax.device_put(A, NamedSharding(m, P("x", None)))
    with jax.set_mesh(m):
        e = shardwise.explain(lambda u, v: u @ v, a, B, in_specs=(P(None, "y"), P("y")))
    assert [o.spec.describe() for o in e.operands] == ["-,y", "y"]
    assert {c.kind for c in e.collectives} == {"all-reduce"}


def test_arguments_laid_out_otherwise_are_moved_once_and_said():
    m = shardwise.mesh("x=2,y=4")
    p = shardwise.plan(_mlp, PARAMS, A, mesh=m, profile="cpu-2core", top=1)
    odd = {k: jax.device_put(v, NamedSharding(m, P("y", "x"))) for k, v in PARAMS.items()}
    run = p.sharded()
    with pytest.warns(shardwise.ShardwiseWarning, match=r"moved 2 arguments.*params\['w1'\]"):
        out = run(odd, A)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once
        run(odd, A)
    np.testing.assert_allclose(np.asarray(out), _mlp(PARAMS, A), rtol=1e-4, atol=1e-5)


def test_a_move_between_meshes_says_what_differs_where_the_specs_are_the_same():
    """Arrays laid out as the plan says on an Auto mesh, or on its devices in another order,
    are moved: the warning had shown the same spec on both sides."""
    p = shardwise.plan(_mlp, PARAMS, A, mesh=_explicit(), profile="cpu-2core", top=1)
    auto = jax.make_mesh((2, 4), ("x", "y"), axis_types=(AxisType.Auto,) * 2)
    turned = jax.sharding.Mesh(np.array(jax.devices()[::-1]).reshape(2, 4), ("x", "y"),
                               axis_types=(AxisType.Explicit,) * 2)  # fmt: skip
    for mesh, said in (
        (auto, "on axes x:Auto,y:Auto → P.* on axes x:Explicit,y:Explicit"),
        (turned, "another order"),
    ):
        on = functools.partial(lambda m, a, s: jax.device_put(a, NamedSharding(m, s)), mesh)
        args = jax.tree.map(on, (PARAMS, A), p.in_specs)
        with pytest.warns(shardwise.ShardwiseWarning, match=rf"moved 3 arguments.*{said}"):
            out = p.sharded()(*args)
        np.testing.assert_allclose(np.asarray(out), _mlp(PARAMS, A), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", MESHES)
def test_place_lays_out_every_argument_as_the_plan_says(kind):
    m = MESHES[kind]()
    p = shardwise.plan(_mlp, PARAMS, A, mesh=m, profile="cpu-2core", top=1)
    on_devices = {k: jax.device_put(v, NamedSharding(m, P())) for k, v in PARAMS.items()}
    params, x = p.place((on_devices, A))
    specs = p.in_specs
    for got, spec in zip(jax.tree.leaves((params, x)), jax.tree.leaves(specs), strict=True):
        assert got.sharding.is_equivalent_to(NamedSharding(m, spec), got.ndim)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing left to move
        out = p.sharded()(params, x)
    np.testing.assert_allclose(np.asarray(out), _mlp(PARAMS, A), rtol=1e-4, atol=1e-5)
    with pytest.raises(shardwise.ArgumentError, match="place takes the arguments"):
        p.place((PARAMS,))


def test_a_plan_runs_on_its_own_mesh_whatever_mesh_is_set_around_it():
    """Planned for a=4,b=2 (text, an Auto mesh, an Explicit one) under ``jax.set_mesh`` of an
    Explicit x=2,y=4 mesh: ``sharded()`` and ``verify()`` run on the plan's mesh (JAX had
    refused its layouts on the mesh set around them)."""
    fn = lambda x, w: jnp.tanh(x @ w)  # noqa: E731
    x, w = A[:, :16], B[:16, :]
    auto = jax.make_mesh((4, 2), ("a", "b"), axis_types=(AxisType.Auto,) * 2)
    for mesh in ("a=4,b=2", auto, jax.make_mesh((4, 2), ("a", "b"))):
        with jax.set_mesh(_explicit()):
            p = shardwise.plan(fn, x, w, mesh=mesh, profile="cpu-2core", top=1)
            np.testing.assert_allclose(np.asarray(p.sharded()(x, w)), np.tanh(x @ w), rtol=1e-5,
                                       atol=1e-5)  # fmt: skip
            checked = p.verify(repeat=1)
        assert all(q.verified.collectives_match for q in checked.plans if q.verified)


def test_einsum_explain_and_stream_run_on_the_mesh_given_not_the_one_set(tmp_path):
    with jax.set_mesh(_explicit()):
        out = shardwise.einsum("ij,jk->ik", A, B, mesh="a=8", in_specs=("a", None))
        e = shardwise.explain("ij,jk->ik", A, B, mesh="a=8", in_specs=("a", None))
        shardwise.plan_einsum("ij,jk->ik", [A.shape, B.shape], mesh="a=8", verify=True,
                              repeat=1, top=1)  # fmt: skip
        big = RNG.standard_normal((256, 32)).astype(np.float32)
        shardwise.stream("ij,jk->ik", big, B, mesh="a=8", out=tmp_path / "o.npy", chunk=128)
    np.testing.assert_allclose(np.asarray(out), A @ B, rtol=1e-5, atol=1e-5)
    assert out.sharding.spec == P("a") and e.collectives == ()
    np.testing.assert_allclose(np.load(tmp_path / "o.npy"), big @ B, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["explicit", "auto"])
def test_einsum_inside_jit_runs_on_the_mesh_set_around_it(kind):
    auto = jax.make_mesh((2, 4), ("x", "y"), axis_types=(AxisType.Auto,) * 2)
    m = _explicit() if kind == "explicit" else auto
    with jax.set_mesh(m):
        f = jax.jit(lambda a, b: shardwise.einsum("ij,jk->ik", a, b, in_specs=("x,y", "y")))
        out = f(A, B)
    np.testing.assert_allclose(np.asarray(out), A @ B, rtol=1e-5, atol=1e-5)
    assert out.sharding.mesh.shape == m.shape


def test_shard_moves_arrays_laid_out_otherwise_and_says_when_out_specs_do_not_fit():
    m = shardwise.mesh("x=2,y=4")
    placed = jax.device_put(A, NamedSharding(m, P("y", "x")))
    matmul = shardwise.shard(lambda u, v: u @ v, m, in_specs=(P("x", "y"), P("y")),
                             out_specs=P("x"))  # fmt: skip
    np.testing.assert_allclose(np.asarray(matmul(placed, B)), A @ B, rtol=1e-5, atol=1e-5)
    twice = shardwise.shard(lambda u: (u, u), m, in_specs=(P("x"),), out_specs=(P("x"),))
    with pytest.raises(shardwise.SpecError, match="one spec per output"):
        twice(A)


@pytest.mark.parametrize(
    "types",
    [
        (AxisType.Explicit, AxisType.Explicit),
        (AxisType.Auto, AxisType.Explicit),
        (AxisType.Explicit, AxisType.Auto),
    ],
)
@pytest.mark.parametrize(
    ("equation", "arrays", "specs", "out"),
    [
        ("ij,jk->ik", (A, B), ("x,y", "y"), "infer"),
        ("ij,jk->ik", (A, B), ("-,x", "y"), "infer"),
        ("suq->qu", (RNG.standard_normal((2, 4, 8)).astype(np.float32),), ("-,-,(x,y)",), "(x,y)"),
        ("fd->", (np.array([[True, False, True, True]] * 2),), (None,), "infer"),
    ],
)  # fmt: skip
def test_einsum_on_explicit_and_mixed_meshes_gives_numpys_result(types, equation, arrays, specs,
                                                                 out):  # fmt: skip
    """Layouts that move an operand, a result split where the operand was not, a boolean sum:
    on Explicit and mixed meshes (they had raised JAX's errors on its reshard, on an array of
    another shape, and an empty NotImplementedError)."""
    m = jax.make_mesh((2, 4), ("x", "y"), axis_types=types)
    got = shardwise.einsum(equation, *arrays, mesh=m, in_specs=specs, out_specs=out)
    np.testing.assert_allclose(np.asarray(got), np.einsum(equation, *arrays), rtol=1e-5,
                               atol=1e-5)  # fmt: skip


def test_a_mesh_of_manual_axes_is_refused_saying_which():
    m = jax.make_mesh((2, 4), ("x", "y"), axis_types=(AxisType.Manual,) * 2)
    with pytest.raises(shardwise.ArgumentError, match="x, y are Manual"):
        shardwise.einsum("ij,jk->ik", A, B, mesh=m, in_specs=("x,y", "y"))


def test_arguments_of_other_shapes_than_the_plans_are_refused_saying_which():
    """Placed or run, an array of another shape than the plan was made for had run (half
    the batch) or failed in JAX's sharding code (a batch of 6 on 4 devices)."""
    p = shardwise.plan(_mlp, {"w1": B[:, :4], "w2": B[:4, :]}, A, mesh="x=2,y=4",
                       profile="cpu-2core", top=1)  # fmt: skip
    for rows in (8, 6):
        args = ({"w1": B[:, :4], "w2": B[:4, :]}, A[:rows])
        with pytest.raises(shardwise.ArgumentError, match=rf"x has shape \({rows}, 32\)"):
            p.place(args)
        with pytest.raises(shardwise.ArgumentError, match="the plan was made for"):
            p.sharded()(*args)


def test_shard_traces_the_function_under_its_own_mesh():
    """Code that names mesh axes bare (``out_sharding=P(...)``) runs under the mesh given to
    ``shard``, as ``pjit`` ran under its mesh; it had found no mesh ("not under a mesh
    context"), or the one set around the call."""
    mesh = jax.make_mesh((2, 4), ("data", "model"))

    def f(x, w):
        return jnp.dot(x, w, out_sharding=P("data", "model"))

    run = shardwise.shard(f, mesh, in_specs=(P("data"), P(None, "model")),
                          out_specs=P("data", "model"))  # fmt: skip
    want = A @ B
    np.testing.assert_allclose(run(A, B), want, rtol=1e-5, atol=1e-5)
    with jax.set_mesh(jax.make_mesh((4, 2), ("a", "b"))):
        out = run(A, B)
    assert out.sharding.spec == P("data", "model")
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    assert run.explain(A, B).problems == ()


def test_a_plan_refuses_a_mesh_of_other_axes_or_sizes_than_its_own():
    """A plan run or verified on another mesh: other axis names had raised JAX's "Resource
    axis: data ... is not found", and the same names at other sizes had been compiled and
    compared with the prediction for the plan's own sizes."""
    plan = shardwise.plan(lambda x, w: x @ w, A, B, mesh="data=2,model=4", profile="cpu-2core",
                          top=1)  # fmt: skip
    for other in ("x=8", jax.make_mesh((4, 2), ("data", "model"))):
        with pytest.raises(shardwise.ArgumentError, match=r"made for mesh data=2,model=4, but"):
            plan.sharded(mesh=other)
        with pytest.raises(shardwise.ArgumentError, match=r"made for mesh data=2,model=4, but"):
            plan.verify(repeat=1, mesh=other)
    same = jax.make_mesh((2, 4), ("data", "model"))
    np.testing.assert_allclose(plan.sharded(mesh=same)(A, B), A @ B, rtol=1e-5, atol=1e-5)


def test_code_written_for_explicit_sharding_plans_for_a_mesh_given_as_text():
    """A function that asks for its result's layout with ``out_sharding=``, planned for
    ``"data=2,model=4"`` with no mesh set, and under a mesh of other axes: both had failed
    (no mesh context; the set mesh has no ``data``), blaming the function."""

    def f(x, w):
        return jnp.dot(x, w, out_sharding=P("data", "model"))

    S = jax.ShapeDtypeStruct
    args = (S(A.shape, "float32"), S(B.shape, "float32"))
    plans = [shardwise.plan(f, *args, mesh="data=2,model=4", profile="cpu-2core", top=1)]
    with jax.set_mesh(jax.make_mesh((4, 2), ("a", "b"))):
        plans.append(shardwise.plan(f, *args, mesh="data=2,model=4", profile="cpu-2core", top=1))
    for plan in plans:
        np.testing.assert_allclose(plan.sharded()(A, B), A @ B, rtol=1e-5, atol=1e-5)
