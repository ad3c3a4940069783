"""The shape of the code: rooms whose imports run one way, no cycles, short pieces, the public
surface listed once, caches in one registry, and an ``import shardwise`` that changes nothing."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import grimp
import jax
import numpy as np
import pytest

import shardwise
from shardwise import _caches

SRC = Path(shardwise.__file__).parent
ENV = {k: v for k, v in os.environ.items() if not k.startswith(("SHARDWISE_", "XLA_"))}


def _modules() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def _cycles(graph: grimp.ImportGraph) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.find_modules_directly_imported_by(node):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.add(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(component)

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_no_module_imports_in_a_circle_not_even_inside_a_function():
    graph = grimp.build_graph("shardwise", exclude_type_checking_imports=True)
    # the graph holds imports made inside functions (this one is only inside a function)
    assert "shardwise._planner.layout" in graph.find_modules_directly_imported_by(
        "shardwise._data.dask"
    )
    assert _cycles(graph) == []


def test_the_rooms_contracts_hold():
    linter = Path(sys.executable).parent / "lint-imports"
    result = subprocess.run(
        [str(linter), "--no-cache"], capture_output=True, text=True, cwd=SRC.parent.parent
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 kept, 0 broken" in result.stdout


def test_modules_and_functions_are_short():
    long_modules = {}
    long_functions = {}
    for path in _modules():
        text = path.read_text()
        name = str(path.relative_to(SRC))
        if len(text.splitlines()) > 400:
            long_modules[name] = len(text.splitlines())
        if path.parts[-2] == "cli":
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                first = node.decorator_list[0].lineno if node.decorator_list else node.lineno
                assert node.end_lineno is not None
                if node.end_lineno - first + 1 > 80:
                    long_functions[f"{name}:{node.name}"] = node.end_lineno - first + 1
    assert long_modules == {}
    assert long_functions == {}


def test_the_public_surface_is_listed_once():
    stub = ast.parse((SRC / "__init__.pyi").read_text())
    listed = [
        alias.asname or alias.name
        for node in stub.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    ]
    assert len(listed) == len(set(listed))
    assert sorted(shardwise.__all__) == sorted(listed)
    for name in listed:
        assert getattr(shardwise, name) is not None, name
    assert set(listed) <= set(dir(shardwise))
    with pytest.raises(AttributeError):
        _ = shardwise.no_such_name


def test_every_cache_is_in_the_registry_and_bounded():
    for path in _modules():
        if path.name == "_caches.py":
            continue
        text = path.read_text()
        for marker in ("lru_cache", "functools.cache", "@cache\n"):
            assert marker not in text, f"{path.relative_to(SRC)} keeps a cache of its own"


def test_clear_caches_empties_every_cache():
    x = np.ones((8, 4), np.float32)
    shardwise.einsum("nd,nd->n", x, x, mesh="devices=8", in_specs=["devices", "devices"])
    shardwise.einsum("nd,nd->n", x, x, mesh="devices=8", layout="auto")
    shardwise.explain_einsum("nd,nd->n", [(8, 4)] * 2, mesh="x=2,y=4", in_specs=["x,y"] * 2)
    sizes = [_size(clear) for clear in _caches._CLEARERS]
    assert sum(sizes) > 0
    shardwise.clear_caches()
    assert [_size(clear) for clear in _caches._CLEARERS] == [0] * len(sizes)


def _size(clear: object) -> int:
    owner = clear.__self__  # type: ignore[attr-defined]
    info = getattr(owner, "cache_info", None)
    return int(info().currsize) if info is not None else len(owner)


def test_a_float64_einsum_is_right_with_64_bit_mode_off_then_on():
    rng = np.random.default_rng(0)
    a = rng.random((16, 8)) * 1e-9 + 1.0  # float64: float32 would round the small parts away
    want = np.einsum("nd,nd->n", a, a)
    for x64 in (False, True, False):
        with jax.enable_x64(x64):
            got = shardwise.einsum("nd,nd->n", a, a, mesh="devices=8", layout="n=devices")
            assert got.dtype == np.float64
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-15)


def test_a_profile_recalibrated_between_two_auto_einsums_is_used(tmp_path, monkeypatch):
    from shardwise._model.profile import Link, Profile
    from shardwise._model.profile_files import cache_dir, local_name, save_profile
    from shardwise._xla import native

    for kernel in native.KERNELS:  # loaded from the real cache, not built into tmp_path
        native.available(kernel)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = cache_dir() / f"{local_name('cpu', 8)}.json"
    a = np.ones((64, 512), np.float32)
    b = np.ones((512, 64), np.float32)

    def auto_spec() -> str:
        out = shardwise.einsum("mk,kn->mn", a, b, mesh="devices=8", layout="auto")
        np.testing.assert_allclose(np.asarray(out), a @ b)
        return str(out.sharding.spec)

    slow_links = Profile("slow-links", "cpu", {"float32": 1e12}, 1e12, None, Link(1.0, 1e3))
    save_profile(slow_links, path)
    first = auto_spec()  # no collective: each device takes rows of the output
    slow_memory = Profile("slow-memory", "cpu", {"float32": 1e15}, 1e6, None, Link(0.0, 1e15))
    save_profile(slow_memory, path)
    second = auto_spec()  # free links: split the contracted index, read the least
    assert (first, second) == ("P('devices',)", "P(None, 'devices')")


_PROBE = """
import json, os, sys
import jax
from jax._src import xla_bridge
fds = sorted(os.listdir("/proc/self/fd"))
env = dict(os.environ)
cpu_devices = jax.config.jax_num_cpu_devices
stdout = os.fstat(1)
import shardwise
from shardwise._runtime import hostmem
for name in shardwise.__all__:  # load every module the public names live in
    getattr(shardwise, name)
report = {
    "env_same": dict(os.environ) == env,
    "fds_same": sorted(os.listdir("/proc/self/fd")) == fds,
    "stdout_same": os.fstat(1).st_ino == stdout.st_ino,
    "backend_started": xla_bridge.backends_are_initialized(),
    "cpu_devices_same": jax.config.jax_num_cpu_devices == cpu_devices,
    "x64": jax.config.read("jax_enable_x64"),
}
import numpy as np
x = np.ones((4, 2), np.float32)
shardwise.einsum("nd,nd->n", x, x, mesh="devices=1", in_specs=[None, None])
report["devices"] = jax.device_count()
report["malloc_tuned"] = hostmem.keep_freed_memory_warm.cache_info().currsize > 0
print(json.dumps(report))
"""


def test_import_shardwise_changes_nothing_in_the_process():
    env = {
        **ENV,
        "SHARDWISE_CPU_DEVICES": "3",
        # a runtime that cannot be joined: importing shardwise used to end the process
        "SHARDWISE_COORDINATOR": "127.0.0.1:1",
        "SHARDWISE_NUM_PROCESSES": "2",
        "SHARDWISE_PROCESS_ID": "5",
    }
    result = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report == {
        "env_same": True,
        "fds_same": True,
        "stdout_same": True,
        "backend_started": False,
        "cpu_devices_same": True,
        "x64": False,
        "devices": 1,
        "malloc_tuned": False,
    }


def test_only_the_command_line_tunes_the_process():
    callers = []
    for path in _modules():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", getattr(node.func, "attr", ""))
                if name in ("keep_freed_memory_warm", "set_up", "join_from_env", "apply_env"):
                    callers.append((str(path.relative_to(SRC)), name))
    assert sorted(set(callers)) == [
        ("_data/dask.py", "apply_env"),  # in a Dask worker only, for its own devices
        ("_runtime/child.py", "apply_env"),
        ("_runtime/child.py", "join_from_env"),
        ("_runtime/child.py", "keep_freed_memory_warm"),
        ("_runtime/child.py", "set_up"),
        ("_runtime/distributed.py", "apply_env"),  # initialize_distributed(), when called
        ("_runtime/distributed.py", "join_from_env"),
        ("cli/__init__.py", "keep_freed_memory_warm"),
        ("cli/__init__.py", "set_up"),
    ]


@pytest.mark.parametrize("how", ["-c", "script"])
def test_launched_python_programs_get_their_devices(tmp_path, how):
    code = "import jax, shardwise; print(jax.device_count(), shardwise.mesh('auto').size)"
    script = tmp_path / "prog.py"
    script.write_text(code)
    args = ["-c", code] if how == "-c" else [str(script)]
    result = subprocess.run(
        [sys.executable, "-m", "shardwise._runtime.child", *args],
        capture_output=True,
        text=True,
        env={**ENV, "SHARDWISE_CPU_DEVICES": "3"},
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["3", "3"]


def test_a_runtime_that_cannot_be_joined_is_an_error_not_an_exit(monkeypatch):
    monkeypatch.setenv("SHARDWISE_COORDINATOR", "127.0.0.1:1")
    monkeypatch.setenv("SHARDWISE_NUM_PROCESSES", "2")
    monkeypatch.setenv("SHARDWISE_PROCESS_ID", "5")
    with pytest.raises(shardwise.DistributedError, match=r"outside 0\.\.1"):
        shardwise.initialize_distributed()
