"""The user's own code fails as the user's: what their module or function raises while
shardwise imports or traces it is said to be theirs, with where (exit 2), never a bug in
shardwise; their prints do not break ``--json``; ``--args`` refuses what it cannot read
exactly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest
from typer.testing import CliRunner

import shardwise
from shardwise._xla.dtypes import NAMES
from shardwise.cli import app
from shardwise.cli.program import parse_args, parse_array

S = jax.ShapeDtypeStruct
runner = CliRunner()
PLAN = ["--mesh", "x=2", "--profile", "cpu-2core", "--top", "1"]
ARGS = ["--args", "x=f32[8,4]", "--args", "w=f32[4,2]"]
GOOD = "def f(x, w):\n    return (x @ w).sum()\n"


@pytest.fixture(autouse=True)
def _own_sys_path(monkeypatch):
    """``--function`` puts folders on ``sys.path``, as ``python`` does: undo it after each
    test."""
    monkeypatch.setattr(sys, "path", list(sys.path))


def _plan(tmp_path, source: str, *extra: str, name: str = "prog"):
    src = tmp_path / f"{name}.py"
    src.write_text(textwrap.dedent(source))
    return runner.invoke(app, ["plan", "--function", f"{src}:f", *ARGS, *PLAN, *extra])


def _error(result) -> str:
    text = " ".join(result.stderr.split())
    assert result.exit_code == 2, result.output
    assert "bug in shardwise" not in text and "Traceback" not in text
    return text


def test_a_syntax_error_in_the_users_module_is_theirs(tmp_path):
    text = _error(_plan(tmp_path, "def f(x, w):\n    return x @@ w\n"))
    assert "your module" in text and "has a syntax error at" in text and "prog.py:2" in text


def test_an_exception_when_the_module_is_imported_is_theirs(tmp_path):
    text = _error(_plan(tmp_path, "import os\n\nsettings = {}['lr']\n" + GOOD))
    assert "raised KeyError at" in text and "prog.py:3 (in <module>)" in text
    assert "while shardwise imported it: 'lr'" in text


def test_a_module_that_imports_what_is_missing_is_theirs(tmp_path):
    text = _error(_plan(tmp_path, "import no_such_package_here\n" + GOOD))
    assert "raised ModuleNotFoundError at" in text and "prog.py:1" in text
    assert "no_such_package_here" in text


def test_a_module_that_is_not_there_is_an_argument_error(tmp_path):
    result = runner.invoke(app, ["plan", "--function", "no_such_module_here:f", *ARGS, *PLAN])
    text = _error(result)
    assert "cannot import 'no_such_module_here'" in text and "folder that holds it" in text


@pytest.mark.parametrize("target", ["a.npy", "data/a.npy", "weights.json", "my-model"])
def test_a_path_that_is_not_a_python_file_is_said_to_be_one(tmp_path, monkeypatch, target):
    """``--function a.npy:f`` had been imported as the module ``a.npy``: "No module named
    'a'", with advice to run from the folder that holds it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "weights.json").write_text("{}")
    result = runner.invoke(app, ["plan", "--function", f"{target}:f", *ARGS, *PLAN])
    text = _error(result)
    assert f"--function {target}:f names {target!r}" in text
    assert "not a Python file (.py) or module" in text and "train.py:loss" in text
    assert "No module named" not in text


def test_a_module_whose_name_is_not_an_identifier_is_imported_as_python_imports_it(
    tmp_path, monkeypatch
):
    """``my-module.py`` is imported as ``my-module``: the path check had refused it first."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("my-module", "2d_models"):
        (tmp_path / f"{name}.py").write_text(GOOD)
        result = runner.invoke(app, ["plan", "--function", f"{name}:f", *ARGS, *PLAN])
        assert result.exit_code == 0, result.output


def test_an_exception_in_the_users_function_is_theirs(tmp_path):
    source = """\
    def f(x, w):
        y = x @ w
        raise ValueError("no learning rate")
    """
    text = _error(_plan(tmp_path, source))
    assert "your function 'f' raised ValueError at" in text and "prog.py:3 (in f)" in text
    assert "no learning rate" in text and "SHARDWISE_DEBUG=1" in text


def test_an_exception_a_callback_raises_while_the_program_runs_is_theirs(tmp_path):
    """In a process of its own: JAX keeps a failed callback's error and raises it again at
    every later barrier of the process."""
    source = """\
    import jax

    def _check(h):
        raise FloatingPointError("NaN in activations")

    def f(x, w):
        h = x @ w
        jax.debug.callback(_check, h)
        return h
    """
    (tmp_path / "prog.py").write_text(textwrap.dedent(source))
    src = str(Path(shardwise.__file__).parent.parent)
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    argv = ["plan", "--function", "prog.py:f", *ARGS, *PLAN, "--verify", "--repeat", "1"]
    done = subprocess.run(
        [sys.executable, "-m", "shardwise", *argv], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    text = " ".join(done.stderr.split())
    assert "a callback in your function raised FloatingPointError: NaN in activations" in text
    assert "bug in shardwise" not in text


@pytest.mark.parametrize("where", ["module", "function"])
def test_sys_exit_in_user_code_is_an_error_not_a_silent_success(tmp_path, where):
    source = "import sys\nsys.exit(0)\n" + GOOD if where == "module" else (
        "import sys\n\ndef f(x, w):\n    sys.exit(0)\n"
    )  # fmt: skip
    text = _error(_plan(tmp_path, source, "--json"))
    doing = "imported" if where == "module" else "traced"
    assert "called sys.exit(0) at" in text and f"while shardwise {doing} it" in text
    assert ("prog.py:2" if where == "module" else "prog.py:4 (in f)") in text


def test_an_exception_of_the_users_own_base_class_is_theirs(tmp_path):
    """A class of the user's own deriving from ``BaseException`` (not ``Exception``) had
    escaped as a raw traceback, exit 1."""
    source = "class Stop(BaseException):\n    pass\n\ndef f(x, w):\n    raise Stop('halt')\n"
    text = _error(_plan(tmp_path, source, "--json"))
    assert "your function 'f' raised Stop at" in text and "halt" in text
    assert "Traceback" not in text


def test_prints_in_user_code_go_to_stderr_and_leave_the_json_whole(tmp_path):
    source = """\
    print("importing the model")

    def f(x, w):
        print("tracing f")
        return (x @ w).sum()
    """
    result = _plan(tmp_path, source, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["program"].endswith("prog.py:f")
    assert "importing the model" in result.stderr and "tracing f" in result.stderr


def test_devices_are_set_up_before_the_users_code_starts_jax(tmp_path):
    """A module that makes an array at import, and an --args function that makes a random
    key, start JAX: the command's simulated devices are set up before either runs (in a
    process of its own, where JAX has not started)."""
    (tmp_path / "started.py").write_text(
        "import jax\nimport jax.numpy as jnp\n\nW = jnp.ones((16, 4))\n\n"
        "def f(key, x):\n    return (x + jax.random.normal(key, x.shape)) @ W\n\n"
        "def example():\n    return jax.random.key(0), jnp.ones((8, 16))\n"
    )
    src = str(Path(shardwise.__file__).parent.parent)
    env = {k: v for k, v in os.environ.items() if k != "SHARDWISE_CPU_DEVICES"}
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    argv = ["plan", "--function", "started.py:f", "--args", "started.py:example",
            "--mesh", "data=2,model=4", "--top", "1", "--json"]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "shardwise", *argv], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["program"] == "started.py:f"


def test_a_file_named_by_function_and_args_is_imported_once(tmp_path):
    """``--function model.py:f --args model.py:example``: one module, so the classes of the
    arguments are the function's (Equinox's ``combine`` checks that they are the same)."""
    source = """\
    from typing import NamedTuple

    import jax

    print("importing the model")

    class Params(NamedTuple):
        w: jax.ShapeDtypeStruct

    def example():
        return Params(jax.ShapeDtypeStruct((4, 2), "float32")), jax.ShapeDtypeStruct((8, 4), "f4")

    def f(params, x):
        assert type(params) is Params, "a class of another import"
        return (x @ params.w).sum()
    """
    src = tmp_path / "once.py"
    src.write_text(textwrap.dedent(source))
    argv = ["plan", "--function", f"{src}:f", "--args", f"{src}:example", *PLAN, "--json"]
    result = runner.invoke(app, argv)
    assert result.exit_code == 0, result.output
    assert result.stderr.count("importing the model") == 1


def test_a_module_is_found_from_the_working_directory_as_python_m_finds_it(tmp_path, monkeypatch):
    package = tmp_path / "user_models_in_cwd"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "model.py").write_text(GOOD)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    result = runner.invoke(
        app, ["plan", "--function", "user_models_in_cwd.model:f", *ARGS, *PLAN, "--json"]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["program"] == "user_models_in_cwd.model:f"


@pytest.mark.parametrize(
    ("items", "said"),
    [
        (["p=f32[4]", "p.q=f32[4]"], "--args p.q, a part of p, but p was already given"),
        (["p.q=f32[4]", "p=f32[4]"], "--args p, but p was already given (a tree of arrays)"),
        (["p.q=f32[4]", "p.q=f32[8]"], "--args p.q, but p.q was already given (an array)"),
    ],
)
def test_args_that_overlap_are_an_error_not_a_replacement(items, said):
    with pytest.raises(shardwise.ArgumentError) as info:
        parse_args(items)
    assert said in str(info.value) and "not both" in str(info.value)


def test_a_shapes_file_that_repeats_an_args_name_is_an_error(tmp_path):
    shapes = tmp_path / "shapes.json"
    shapes.write_text(json.dumps({"x": "f32[8,4]"}))
    with pytest.raises(shardwise.ArgumentError, match="x was already given"):
        parse_args(["x=f32[8,4]", str(shapes)])


@pytest.mark.parametrize("text", ["bf99[4]", "f8[4]", "i1[4]", "x32[4]", "u128[2]"])
def test_only_known_dtype_names_are_read(text):
    with pytest.raises(shardwise.ArgumentError, match="is not a dtype") as info:
        parse_array(text, "--args x")
    assert "f32, f64" in str(info.value)  # the valid names are listed


def test_every_known_dtype_name_reads_as_its_dtype():
    for name, dtype in NAMES.items():
        assert parse_array(f"{name}[2,3]", "--args x") == S((2, 3), dtype)
        assert parse_array(f"{dtype}[2,3]", "--args x") == S((2, 3), dtype)


def test_plan_says_an_exception_in_the_function_is_the_users():
    def loss(x, w):
        raise ValueError("no learning rate")

    args = S((8, 4), "float32"), S((4, 2), "float32")
    with pytest.raises(shardwise.UserCodeError, match="your function 'loss' raised ValueError"):
        shardwise.plan(loss, *args, mesh="x=2", profile="cpu-2core")
    try:
        shardwise.plan(loss, *args, mesh="x=2", profile="cpu-2core", train=True)
    except shardwise.UserCodeError as e:
        assert isinstance(e.__cause__, ValueError)
        assert f"{__file__.rsplit('/', 1)[-1]}:" in str(e) and "(in loss)" in str(e)


def test_a_function_that_returns_what_is_not_an_array_is_told_to_return_arrays(tmp_path):
    """A function that returned a str had been refused with JAX's own "returned a value of
    type <class 'str'>, which is not a valid JAX type", which says no fix."""
    text = _error(_plan(tmp_path, "def f(x, w):\n    return 'done'\n"))
    assert "f returned str 'done', not an array" in text and "must return arrays" in text
    assert "not a valid JAX type" not in text

    def g(x, w):
        return {"loss": (x @ w).sum(), "label": "step"}

    args = S((8, 4), "float32"), S((4, 2), "float32")
    with pytest.raises(shardwise.ArgumentError, match=r"g returned a result whose \['label'\] is "
                       r"str 'step', not an array.*pytree of arrays"):  # fmt: skip
        shardwise.plan(g, *args, mesh="x=2", profile="cpu-2core")
    assert shardwise.plan(lambda x, w: ((x @ w).sum(), 1.0), *args, mesh="x=2",
                          profile="cpu-2core").chosen is not None  # fmt: skip


def test_plan_says_it_takes_no_keyword_arguments_for_the_function_and_how_to_bind_them():
    """plan(fn, *args) passes no keywords to fn, and its docstring had not said so."""
    doc = " ".join((shardwise.plan.__doc__ or "").split())
    assert "takes no keyword arguments for ``fn``" in doc
    assert "plan(functools.partial(fn, scale=2.0), x, w)" in doc


def test_args_bind_by_parameter_name_not_by_order():
    def f(params, x, scale=1.0):
        return x @ params["w"] * scale

    got = parse_args(["x=f32[16,8]", "params.w=f32[8,4]"], f)
    assert got[0]["w"].shape == (8, 4) and got[1].shape == (16, 8)
    with pytest.raises(shardwise.ArgumentError, match="f has no parameter of that name"):
        parse_args(["params.w=f32[8,4]", "y=f32[16,8]"], f)
    with pytest.raises(shardwise.ArgumentError, match="--args gives no x; f takes params, x"):
        parse_args(["params.w=f32[8,4]"], f)
    with pytest.raises(shardwise.ArgumentError, match="gives z after a parameter"):
        parse_args(["params.w=f32[8,4]", "x=f32[1]", "z=f32[1]"], lambda params, x, y=0, z=0: x)
    assert [a.shape for a in parse_args(["b=f32[2]", "a=f32[3]"], lambda *xs: xs)] == [(2,), (3,)]
    with pytest.raises(shardwise.ArgumentError, match="it takes no array arguments"):
        parse_args(["x=f32[8]"], lambda: 0)  # (it had said "it takes : give --args…")


@pytest.mark.parametrize("option", [["--batch", "64"], ["--hidden", "256"], ["--layers", "2"]])
def test_a_built_in_models_sizes_are_refused_with_a_function(tmp_path, option):
    """They size ``--model``'s model; with ``--function`` they had been dropped silently."""
    text = _error(_plan(tmp_path, GOOD, *option))
    assert f"{option[0]} sizes a built-in model" in text and "--args" in text


def test_a_dtype_is_refused_with_a_function(tmp_path):
    """A function's arrays take their dtypes from ``--args``: ``--dtype`` had been dropped
    silently (a bfloat16 plan of float32 arrays, said to be planned)."""
    text = _error(_plan(tmp_path, GOOD, "--dtype", "bf16"))
    assert "--dtype bfloat16 sets an einsum's or a built-in model's dtype" in text
    assert "--args x=bf16[8,4]" in text


def test_args_bind_by_name_before_a_star_args_and_refuse_a_keyword_only_parameter(tmp_path):
    source = "def f(w, x, *more):\n    return (x @ w).sum()\n"
    result = _plan(tmp_path, source, name="star")  # --args x=…, w=…: out of order, by name
    assert result.exit_code == 0, result.output
    source = "def f(x, w, *, scale=2.0):\n    return (x @ w).sum() * scale\n"
    src = tmp_path / "kw.py"
    src.write_text(source)
    refused = runner.invoke(app, ["plan", "--function", f"{src}:f", *ARGS, "--args",
                                  "scale=f32[]", *PLAN])  # fmt: skip
    assert "takes by keyword only" in " ".join(_error(refused).split())


def test_arguments_are_taken_by_name_as_the_function_takes_them_and_miscounts_said():
    """A plan's program and a ``shard`` are called as the function is: by position or by
    parameter name (they had refused keywords with a raw TypeError), and too few arguments,
    too many or another structure are said against the parameters (a raw ``zip()`` error)."""
    from jax.sharding import PartitionSpec as P

    def f(params, x):
        return jax.numpy.tanh(x @ params["w1"]) @ params["w2"]

    params = {"w1": np.ones((8, 16), np.float32), "w2": np.ones((16, 8), np.float32)}
    x = np.ones((4, 8), np.float32)
    want = np.asarray(jax.jit(f)(params, x))
    run = shardwise.plan(f, params, x, mesh="data=2,model=4", profile="cpu-2core",
                         top=1).sharded()  # fmt: skip
    for got in (run(params, x=x), run(params=params, x=x)):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    with pytest.raises(shardwise.ArgumentError, match=r"takes 2 arguments \(params, x\).*1 was"):
        run(x)
    with pytest.raises(shardwise.ArgumentError, match=r"'y': not a parameter"):
        run(params, x, y=1)
    with pytest.raises(shardwise.ArgumentError, match=r"params\['w1'\] is missing \(and 1 more"):
        run({"v": params["w1"]}, x)
    sharded = shardwise.shard(f, "data=2,model=4", in_specs=({"w1": P(None, "model"),
                              "w2": P("model")}, P("data")))  # fmt: skip
    np.testing.assert_allclose(sharded(params=params, x=x), want, rtol=1e-6)
    wrong = shardwise.shard(f, "data=2,model=4", in_specs=({"w1": None, "w3": None}, None))
    with pytest.raises(shardwise.SpecError, match=r"in_specs for argument 0 of f are structured"):
        wrong(params, x)


def test_an_argument_given_as_none_is_named_by_its_parameter_and_taken_by_name():
    """A ``None`` argument has no leaves to name it: it had been ``args[1]``, so a call by the
    parameters' names was refused ("'mask', 'w': not a parameter"), and ``place`` said so."""

    def f(x, mask, w):
        y = x @ w
        return y if mask is None else y * mask

    x, w = np.ones((16, 32), np.float32), np.ones((32, 8), np.float32)
    p = shardwise.plan(f, x, None, w, mesh="data=2,model=4", profile="cpu-2core", top=1)
    run = p.sharded()
    for got in (run(x, None, w), run(x, mask=None, w=w), run(x=x, mask=None, w=w)):
        np.testing.assert_allclose(np.asarray(got), x @ w, rtol=1e-6)
    with pytest.raises(shardwise.ArgumentError, match=r"program takes \(x, mask, w\), by pos"):
        run(x, w=w)
    with pytest.raises(shardwise.ArgumentError, match=r"\(x, mask, w\) as a tuple"):
        p.place(x)
    assert list(p.shardings()) == ["x", "mask", "w"]


def test_a_setting_that_is_not_an_array_is_said_by_name_with_the_fix():
    def f(x, w, mode):
        return x @ w

    x, w = S((4, 8), "float32"), S((8, 8), "float32")
    with pytest.raises(shardwise.ArgumentTypeError, match=r"argument 2 \(mode\) of f is str "
                       r"'tanh'.*functools.partial"):  # fmt: skip
        shardwise.plan(f, x, w, "tanh", mesh="x=8")
    with pytest.raises(shardwise.ArgumentTypeError, match=r"argument 2 of f .*functools.partial"):
        shardwise.shard(f, "x=8", in_specs=(None, None, None))(
            jax.numpy.ones((4, 8)), jax.numpy.ones((8, 8)), "tanh"
        )


def test_a_number_inside_an_argument_is_a_scalar_as_jax_jit_takes_it():
    """A Python number in a pytree (Flax's ``TrainState.create(step=0)``, a dict's scale) is a
    weak-typed scalar, as ``jax.jit`` takes it: it had been refused. A string there is refused
    with every fix: close over it, or split a model with Equinox."""

    def f(p, x):
        return x * p["scale"]

    x = np.ones((8, 4), np.float32)
    p = shardwise.plan(f, {"scale": 2.0}, x, mesh="x=2", profile="cpu-2core", top=1)
    np.testing.assert_allclose(np.asarray(p.sharded()({"scale": 2.0}, x)), 2 * x)
    with jax.enable_x64(True):  # (typed as jax.jit types it: float64 there, not float32)
        p64 = shardwise.plan(f, {"scale": 2.0}, x, mesh="x=2", profile="cpu-2core", top=1)
        np.testing.assert_allclose(np.asarray(p64.sharded()({"scale": 2.0}, x)), 2 * x)
    with pytest.raises(shardwise.ArgumentTypeError, match=r"too large for JAX's int32"):
        shardwise.plan(f, {"scale": 2**40}, x, mesh="x=2", profile="cpu-2core", top=1)
    with pytest.raises(shardwise.ArgumentError, match=r"p\['scale'\] is an int, but the plan"):
        shardwise.plan(f, {"scale": 3}, x, mesh="x=2", profile="cpu-2core", top=1).sharded()(
            {"scale": 2**40}, x
        )
    with pytest.raises(shardwise.ArgumentTypeError) as caught:
        shardwise.plan(f, {"scale": "2"}, S((8, 4), "float32"), mesh="x=2", profile="cpu-2core")
    said = str(caught.value)
    assert said.startswith("p['scale'] in argument 0 (p) of f is str '2', not an array")
    assert "close over it" in said and "functools.partial(fn, scale='2')" in said
    assert "eqx.partition" in said
    with pytest.raises(shardwise.ArgumentTypeError) as caught:  # (by the leaf's own key)
        shardwise.plan(f, {"act": "relu"}, S((8, 4), "float32"), mesh="x=2", profile="cpu-2core")
    assert "functools.partial(fn, act='relu'), ...), fn reading act where" in str(caught.value)

    def g(x, width):
        return x

    with pytest.raises(
        shardwise.ArgumentTypeError, match=r"functools\.partial\(fn, width=\.\.\.\)"
    ):
        shardwise.plan(g, S((8, 4), "float32"), "wide", mesh="x=2", profile="cpu-2core")


def test_a_flax_train_state_is_planned_run_placed_and_verified_as_it_is_made():
    """``TrainState.create`` holds ``step=0``, a Python int: refused before. ``verify`` timed a
    step that returns a ``TrainState`` without waiting for it (it waited only inside tuples,
    lists and dicts), so the runs overlapped and XLA's CPU collectives aborted the process."""
    nn = pytest.importorskip("flax.linen")
    optax = pytest.importorskip("optax")
    from flax.training import train_state

    model = nn.Dense(16)
    x = jax.numpy.ones((8, 32))
    state = train_state.TrainState.create(
        apply_fn=model.apply, params=model.init(jax.random.key(0), x)["params"], tx=optax.adam(0.1)
    )

    def step(state, x):
        g = jax.grad(lambda p: jax.numpy.mean(state.apply_fn({"params": p}, x) ** 2))(state.params)
        return state.apply_gradients(grads=g)

    want = jax.jit(step)(state, x)
    p = shardwise.plan(step, state, x, mesh="data=2,model=4", profile="cpu-2core", top=2)
    for got in (p.sharded()(state, x), p.sharded()(*p.place((state, x)))):
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    checked = p.verify(repeat=1)
    assert all(q.verified is not None and q.verified.collectives_match for q in checked.plans)


def test_a_loss_jax_cannot_differentiate_is_the_users_not_their_arguments():
    """train=True on a while loop: JAX's refusal to differentiate it had been said as "cannot
    trace … with these arguments", as if the arguments were wrong."""

    def loss(w, x):
        body = lambda c: (c[0] + 1, jax.numpy.tanh(c[1] @ w))  # noqa: E731
        return jax.lax.while_loop(lambda c: c[0] < 3, body, (0, x))[1].sum()

    said = r"'loss' raised ValueError while shardwise differentiated it: Reverse-mode.*make it"
    with pytest.raises(shardwise.UserCodeError, match=said):
        shardwise.plan(loss, S((8, 8), "float32"), S((4, 8), "float32"), mesh="x=8", train=True)


def test_explain_given_a_plan_says_how_a_plan_is_explained():
    plan = shardwise.plan(lambda x, w: x @ w, S((8, 8), "float32"), S((8, 8), "float32"),
                          mesh="x=8", top=1)  # fmt: skip
    with pytest.raises(shardwise.ArgumentTypeError, match=r"explain\(\) takes a function.*"
                       r"plan.report\(name\)"):  # fmt: skip
        shardwise.explain(plan, S((8, 8), "float32"))


def test_an_out_spec_that_does_not_divide_its_output_names_the_output():
    """JAX's own error had come through ("implies that array axis 0 is partitioned 8 times")."""

    def f(x):
        return {"y": x * 2, "s": x.sum(axis=1)}

    run = shardwise.shard(f, "data=2,model=4", in_specs=None,
                          out_specs={"y": None, "s": "(data,model)"})  # fmt: skip
    said = r"dimension 0 of the output\['s'\] of f \(shape \(12,\)\) has size 12.*over model \(4"
    with pytest.raises(shardwise.IndivisibleError, match=said):
        run(jax.numpy.ones((12, 4)))


def test_a_step_that_changes_its_arguments_in_place_is_refused_not_run_untrained():
    """The train step of Flax's ``nnx.jit`` examples updates the model and optimizer in
    place; under a plan, as under ``jax.jit``, that update is dropped: it had planned and run
    five steps with the loss never moving. A dict written into as scratch space is not."""
    nnx = pytest.importorskip("flax.nnx")
    optax = pytest.importorskip("optax")
    model = nnx.Linear(8, 4, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)

    def train_step(model, optimizer, x):
        loss, grads = nnx.value_and_grad(lambda m: (m(x) ** 2).mean())(model)
        optimizer.update(model, grads)
        return loss

    x = jax.numpy.ones((16, 8))
    with pytest.raises(shardwise.ArgumentError, match=r"train_step changes its arguments in "
                       r"place \(model\.bias.*nnx\.split"):  # fmt: skip
        shardwise.plan(train_step, model, optimizer, x, mesh="x=8")

    graphdef, state = nnx.split((model, optimizer))

    def forgot(state, x):  # (the new state is not returned: dropped, as under jax.jit)
        model, optimizer = nnx.merge(graphdef, state)
        return train_step(model, optimizer, x)

    with pytest.raises(shardwise.ArgumentError, match=r"forgot changes its arguments in place"):
        shardwise.plan(forgot, state, x, mesh="x=8")

    def scaled(params, batch):  # a dict written into as scratch space loses nothing
        batch["x"] = batch["x"] / 255.0
        return ((batch["x"] @ params["w"]) ** 2).sum()

    w, b = np.ones((8, 4), np.float32), {"x": np.ones((16, 8), np.float32)}
    got = shardwise.plan(scaled, {"w": w}, b, mesh="x=8", top=1).sharded()({"w": w}, dict(b))
    np.testing.assert_allclose(float(got), float(jax.jit(scaled)({"w": w}, dict(b))), rtol=1e-6)

    def functional(state, x):  # (nnx.merge's variables are the state's: changed, and returned)
        model, optimizer = nnx.merge(graphdef, state)
        loss = train_step(model, optimizer, x)
        return nnx.state((model, optimizer)), loss

    p = shardwise.plan(functional, state, x, mesh="x=8", top=1)
    new, loss = p.sharded()(state, x)
    want, want_loss = jax.jit(functional)(state, x)
    np.testing.assert_allclose(float(loss), float(want_loss), rtol=1e-6)
    for a, b in zip(jax.tree.leaves(new), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_an_argument_of_another_type_or_already_donated_is_said_before_it_runs():
    """A batch of another dtype had failed inside the program with JAX's raw ``lax.sub``
    TypeError; a parameter donated to the previous step crashed the process (JAX's CPU
    runtime). A float64 NumPy array, which JAX takes as float32, is accepted."""

    def step(w, x):
        return w - 0.1 * x.T @ (x @ w)

    w, x = np.ones((8, 8), np.float32), np.ones((16, 8), np.float32)
    want = step(step(w, x), x)
    p = shardwise.plan(step, w, x, mesh="x=8", top=1, donate_argnums=(0,))
    run = p.sharded()
    placed, _ = p.place((w, x))
    new = run(placed, x.astype(np.float64))
    with pytest.raises(shardwise.ArgumentError, match=r"^w was deleted: an earlier call"):
        run(placed, x)
    with pytest.raises(shardwise.ArgumentError, match=r"^x is bfloat16, but the plan was made "
                       r"for float32: cast it"):  # fmt: skip
        run(new, x.astype(jax.numpy.bfloat16))
    np.testing.assert_allclose(np.asarray(run(new, x)), want, rtol=1e-5)


def test_a_model_with_leaves_that_are_not_arrays_is_named_by_path_with_the_fix():
    """A whole Equinox model (as ``eqx.filter_jit`` code passes it) had been refused as
    "argument 0 (model) is custom_jvp <jax._src.custom_derivatives.custom_jvp object at
    0x7f40ae09" (cut in the address), with the fix for a string setting."""
    eqx = pytest.importorskip("equinox")
    model = eqx.nn.MLP(8, 4, 16, 1, key=jax.random.key(0))

    def f(model, x):
        return model(x)

    with pytest.raises(shardwise.ArgumentTypeError, match=r"^model\.activation in argument 0 "
                       r"\(model\) of f is custom_jvp, not an array.*eqx\.partition"):  # fmt: skip
        shardwise.plan(f, model, S((8,), "float32"), mesh="x=8")


def test_verify_and_tune_take_a_whole_number_of_turns_and_place_takes_arrays():
    """``verify(repeat=0)`` had compiled every plan, then failed with ``statistics``'s "no
    median for empty data"; ``place`` of the shapes ``shardwise.model`` returns had failed
    inside JAX's sharding code with an IndexError."""
    fn, args = shardwise.model("mlp", batch=16, hidden=8, ffn=16)
    p = shardwise.plan(fn, *args, mesh="x=8", top=1)
    for bad in (0, -1, None, True, 2.5):
        with pytest.raises(shardwise.ArgumentError, match=r"repeat=.*whole number of at least"):
            p.verify(repeat=bad)
        with pytest.raises(shardwise.ArgumentError, match=r"repeat=.*whole number of at least"):
            p.tune(repeat=bad)
    with pytest.raises(shardwise.ArgumentError, match=r"^x is a jax.ShapeDtypeStruct, a shape "
                       r"without data: place moves arrays"):  # fmt: skip
        p.place(args)


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ({"seq": 1.5}, r"seq is 1\.5; model sizes are whole numbers"),
        ({"batch": True}, r"batch is True; model sizes are whole numbers"),
        ({"size": 8}, r"no Llama size 8; the sizes are"),
        ({"dtype": "int8"}, r"model 'llama' computes in floats; dtype int8 is not one"),
        ({"dtype": "float64"}, r"float64 needs JAX's 64-bit mode"),
    ],
)
def test_the_built_in_models_refuse_sizes_and_types_they_cannot_be(given, said):
    """``seq=1.5`` had built a shape (8, 1.5), ``batch=True`` a batch of 1, ``size=8`` a raw
    AttributeError; ``int8`` had failed inside the model as "your function", and ``float64``
    had been planned as float32 with no word but JAX's warning."""
    with pytest.raises(shardwise.ArgumentError, match=said):
        shardwise.model("llama", **{"size": "llama3-8b", "batch": 8, "seq": 128, **given})


def test_place_says_how_to_give_arguments_that_are_not_a_tuple_and_sizes_may_be_numpy_ints():
    """``place(3)`` had escaped as a raw TypeError; ``hidden=np.int64(64)`` is a size."""
    fn, args = shardwise.model("mlp", batch=np.int64(16), hidden=np.int64(8), ffn=16)
    p = shardwise.plan(fn, *args, mesh="x=8", top=1)
    with pytest.raises(shardwise.ArgumentError, match=r"place takes the arguments \(x, params\) "
                       r"as a tuple, e\.g\. place\(\(x, params\)\); got int"):  # fmt: skip
        p.place(3)


def test_shard_takes_a_pytree_of_specs_for_its_one_argument_and_says_list_for_tuple():
    """``in_specs={"u": …, "v": …}`` for a function of one dict had failed inside JAX's pjit
    ("in_shardings is not a tuple"); a list of out_specs for a tuple of results is said to
    be the wrong container, where it had looked like one spec per output."""
    from jax.sharding import PartitionSpec as P

    a = np.ones((40, 16), np.float32)
    specs = {"u": P("x", "y"), "v": P("x", "y")}
    g = shardwise.shard(lambda d: jax.vmap(jax.numpy.dot)(d["u"], d["v"]), "x=2,y=4",
                        in_specs=specs, out_specs=P("x"))  # fmt: skip
    out = g({"u": a, "v": a})
    np.testing.assert_allclose(np.asarray(out), (a * a).sum(1), rtol=1e-5)
    assert out.sharding.spec == P("x")
    two = shardwise.shard(lambda a, b: (a + b, a * b), "x=2,y=4", in_specs=("x,y", "x,y"),
                          out_specs=[P("x"), P(None, "y")])  # fmt: skip
    with pytest.raises(shardwise.SpecError, match=r"give a tuple of specs, not a list"):
        two(a, a)
