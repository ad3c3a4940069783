"""Native CPU kernels: compiled once per machine with the system C++ compiler, registered
with XLA as FFI targets, and called from inside the jitted programs like any other op.

Only one so far, ``rowdot`` (``csrc/rowdot.cc``): ``out[i] = Σ_j x[i, j]·y[i, j]``, the
local step of ``nd,nd->n``-shaped einsums with long rows. XLA's fused multiply-and-reduce
runs it about 12% slower than NumPy's single-threaded ``einsum`` on the 2-core CI machine
kind (S4's (4000, 10000) float32: 10.8 ms against 9.5); this loop reads at the memory limit
(9.5 ms on 8 simulated devices).

The shared library is built on first use into ``$XDG_CACHE_HOME/shardwise/native`` (about
3 s), under a name that hashes the source, the compiler, JAX's version and the CPU's
features, so a changed machine or JAX builds afresh. Where there is no compiler, or the
build fails, or ``SHARDWISE_NATIVE=0``, :func:`available` is false and shardwise keeps XLA's
own kernels; :func:`why_unavailable` says why.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from importlib import resources
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from shardwise._profile import cache_root

ENV = "SHARDWISE_NATIVE"
"""Set to ``0`` to keep XLA's own kernels everywhere."""

FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-w")
TARGETS = {
    jnp.dtype(jnp.float32): "shardwise_rowdot_f32",
    jnp.dtype(jnp.float64): "shardwise_rowdot_f64",
}
_SYMBOLS = {
    "shardwise_rowdot_f32": "ShardwiseRowDotF32",
    "shardwise_rowdot_f64": "ShardwiseRowDotF64",
}

_lock = threading.Lock()
_loaded: ctypes.CDLL | None = None
_why: str | None = None


def compiler() -> str | None:
    """The C++ compiler: ``$CXX``, else the first of g++, c++, clang++ on the PATH."""
    named = os.environ.get("CXX")
    if named:
        return shutil.which(named) or named
    return next((p for c in ("g++", "c++", "clang++") if (p := shutil.which(c))), None)


def _cpu_features() -> str:
    """The CPU's feature flags (what ``-march=native`` compiles for)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def library_path(cxx: str) -> Path:
    """Where the library built from this source by ``cxx`` for this machine lives."""
    digest = hashlib.sha256()
    for part in (
        _source().read_bytes(),
        cxx.encode(),
        " ".join(FLAGS).encode(),
        jax.__version__.encode(),
        platform.machine().encode(),
        _cpu_features().encode(),
    ):
        digest.update(part)
        digest.update(b"\0")
    return cache_root() / "native" / f"rowdot-{digest.hexdigest()[:16]}.so"


def _source() -> Path:
    return Path(str(resources.files("shardwise") / "csrc" / "rowdot.cc"))


def build(cxx: str, dest: Path) -> None:
    """Compile the kernels into ``dest`` (written whole, then renamed into place, so
    processes building at once never load a half-written file)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=dest.parent)
    os.close(fd)
    try:
        command = [cxx, *FLAGS, f"-I{jax.ffi.include_dir()}", str(_source()), "-o", tmp]
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed: {done.stderr.strip()[-2000:]}")
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _load() -> ctypes.CDLL:
    cxx = compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler (set CXX, or install g++)")
    path = library_path(cxx)
    if not path.exists():
        build(cxx, path)
    library = ctypes.CDLL(str(path))
    for target, symbol in _SYMBOLS.items():
        jax.ffi.register_ffi_target(
            target, jax.ffi.pycapsule(getattr(library, symbol)), platform="cpu"
        )
    return library


def available() -> bool:
    """Whether the native kernels are built and registered (building them on first call).

    >>> isinstance(available(), bool)
    True
    """
    global _loaded, _why
    if os.environ.get(ENV, "1") == "0":
        return False
    with _lock:
        if _loaded is None and _why is None:
            try:
                _loaded = _load()
            except (OSError, RuntimeError, subprocess.SubprocessError) as e:
                _why = str(e)
        return _loaded is not None


def why_unavailable() -> str | None:
    """Why :func:`available` is false (None when it is true or was not asked yet)."""
    if os.environ.get(ENV, "1") == "0":
        return f"{ENV}=0"
    return _why


@jax.custom_jvp
def rowdot(x: jax.Array, y: jax.Array) -> jax.Array:
    """``Σ_j x[i, j]·y[i, j]`` for two (rows, cols) float32 or float64 arrays of one dtype,
    on a CPU device; needs :func:`available`. Differentiable (its derivatives are einsums);
    under ``vmap`` the batch joins the rows.

    >>> import numpy as np
    >>> x = np.arange(6.0, dtype=np.float32).reshape(2, 3)
    >>> available() and rowdot(x, x).tolist() == [5.0, 50.0]
    True
    """
    x, y = jnp.asarray(x), jnp.asarray(y)
    # the result varies over the same manual mesh axes as the operands (inside shard_map)
    out: Any = jax.typeof(x).update(shape=x.shape[:-1])
    call = jax.ffi.ffi_call(TARGETS[x.dtype], out, vmap_method="broadcast_all")
    result: jax.Array = call(x, y)  # type: ignore[no-untyped-call]
    return result


@rowdot.defjvp
def _rowdot_jvp(primals: Any, tangents: Any) -> tuple[jax.Array, jax.Array]:
    x, y = primals
    dx, dy = tangents
    tangent = jnp.einsum("...j,...j->...", dx, y) + jnp.einsum("...j,...j->...", x, dy)
    return rowdot(x, y), tangent
