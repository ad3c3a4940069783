"""Native CPU kernels: compiled once per machine with the system C++ compiler, registered
with XLA as FFI targets, and called from inside the jitted programs like any other op.

- ``rowdot`` (``csrc/rowdot.cc``): ``out[i] = Σ_j x[i, j]·y[i, j]``, the local step of
  ``nd,nd->n``-shaped einsums with long rows, read at the memory limit (XLA's fused
  multiply-and-reduce is slower there).
- ``matmul`` (``csrc/matmul.cc``): ``a @ b`` through OpenBLAS from the ``scipy-openblas32``
  wheel (its own copy, set to one thread: it is used only when a program has at least as
  many CPU devices as there are cores, each device calling it from its own thread).

Each shared library is built on first use into ``$XDG_CACHE_HOME/shardwise/native``,
under a name that hashes the source, the compiler, JAX's (and OpenBLAS's)
version and the CPU's features, so a changed machine or JAX builds afresh. Where there is
no compiler, or the build fails, or ``SHARDWISE_NATIVE=0``, :func:`available` is false and
shardwise keeps XLA's own kernels; :func:`why_unavailable` says why.
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
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from shardwise._model.profile_files import cache_root
from shardwise._versions import varying_axes

ENV = "SHARDWISE_NATIVE"
"""Set to ``0`` to keep XLA's own kernels everywhere."""

FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-w")


@dataclass(frozen=True)
class Kernel:
    """One native kernel: its source file and, per dtype, its FFI target and symbol."""

    name: str
    targets: dict[str, tuple[str, str]]  # dtype name -> (FFI target, symbol)
    blas: bool = False  # links OpenBLAS from scipy-openblas32

    def target(self, dtype: Any) -> str | None:
        """The FFI target for ``dtype``, or None when the kernel has none."""
        entry = self.targets.get(jnp.dtype(dtype).name)
        return entry[0] if entry else None


KERNELS = {
    "rowdot": Kernel(
        "rowdot",
        {
            "float32": ("shardwise_rowdot_f32", "ShardwiseRowDotF32"),
            "float64": ("shardwise_rowdot_f64", "ShardwiseRowDotF64"),
        },
    ),
    "matmul": Kernel(
        "matmul",
        {
            "float32": ("shardwise_matmul_f32", "ShardwiseMatmulF32"),
            "float64": ("shardwise_matmul_f64", "ShardwiseMatmulF64"),
        },
        blas=True,
    ),
}

_lock = threading.Lock()
_loaded: dict[str, ctypes.CDLL] = {}
_why: dict[str, str] = {}


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


def _source(kernel: Kernel) -> Path:
    return Path(str(resources.files("shardwise._xla") / "csrc" / f"{kernel.name}.cc"))


def _openblas() -> tuple[str, str, str, str]:
    """scipy-openblas32's include directory, library directory, link name and version."""
    import scipy_openblas32 as blas  # type: ignore[import-untyped,unused-ignore]

    return blas.get_include_dir(), blas.get_lib_dir(), blas.get_library(), blas.__version__


def _link_flags(kernel: Kernel) -> list[str]:
    if not kernel.blas:
        return []
    include, lib, name, _ = _openblas()
    return [f"-I{include}", f"-L{lib}", f"-l{name}", f"-Wl,-rpath,{lib}"]


def library_path(kernel: Kernel, cxx: str) -> Path:
    """Where ``kernel``'s library built by ``cxx`` for this machine lives."""
    digest = hashlib.sha256()
    for part in (
        _source(kernel).read_bytes(),
        cxx.encode(),
        " ".join([*FLAGS, *_link_flags(kernel)]).encode(),
        jax.__version__.encode(),
        (_openblas()[3] if kernel.blas else "").encode(),
        platform.machine().encode(),
        _cpu_features().encode(),
    ):
        digest.update(part)
        digest.update(b"\0")
    return cache_root() / "native" / f"{kernel.name}-{digest.hexdigest()[:16]}.so"


def build(kernel: Kernel, cxx: str, dest: Path) -> None:
    """Compile ``kernel`` into ``dest`` (written whole, then renamed into place, so
    processes building at once never load a half-written file)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=dest.parent)
    os.close(fd)
    try:
        command = [cxx, *FLAGS, f"-I{jax.ffi.include_dir()}", str(_source(kernel))]
        command += [*_link_flags(kernel), "-o", tmp]
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed: {done.stderr.strip()[-2000:]}")
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _load(kernel: Kernel) -> ctypes.CDLL:
    cxx = compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler (set CXX, or install g++)")
    if kernel.blas:
        try:
            _, lib, name, _ = _openblas()
        except ImportError as e:
            raise RuntimeError(f"no OpenBLAS: {e} (pip install scipy-openblas32)") from e
        # one thread per call: each device calls it from its own thread
        ctypes.CDLL(str(Path(lib) / f"lib{name}.so")).scipy_openblas_set_num_threads(1)
    path = library_path(kernel, cxx)
    if not path.exists():
        build(kernel, cxx, path)
    library = ctypes.CDLL(str(path))
    for target, symbol in kernel.targets.values():
        jax.ffi.register_ffi_target(
            target, jax.ffi.pycapsule(getattr(library, symbol)), platform="cpu"
        )
    return library


def available(name: str = "rowdot") -> bool:
    """Whether the native kernel ``name`` is built and registered (building it on first
    call).

    >>> isinstance(available("rowdot"), bool)
    True
    """
    if os.environ.get(ENV, "1") == "0":
        return False
    with _lock:
        if name not in _loaded and name not in _why:
            try:
                _loaded[name] = _load(KERNELS[name])
            except (OSError, RuntimeError, subprocess.SubprocessError) as e:
                _why[name] = str(e)
        return name in _loaded


def why_unavailable(name: str = "rowdot") -> str | None:
    """Why :func:`available` is false (None when it is true or was not asked yet)."""
    if os.environ.get(ENV, "1") == "0":
        return f"{ENV}=0"
    return _why.get(name)


def _target(name: str, dtype: Any) -> str:
    target = KERNELS[name].target(dtype)
    if target is None:
        raise TypeError(f"shardwise's native {name} takes float32 or float64, not {dtype}")
    return target


def _call(name: str, shape: tuple[int, ...], vmap_method: str, *arrays: jax.Array) -> jax.Array:
    """Call kernel ``name`` on ``arrays``; its result, of ``shape``, has their dtype and
    varying manual axes."""
    out: Any = jax.typeof(arrays[0]).update(shape=shape)
    call = jax.ffi.ffi_call(_target(name, arrays[0].dtype), out, vmap_method=vmap_method)
    result: jax.Array = call(*arrays)  # type: ignore[no-untyped-call]
    return result


def _varying(*arrays: jax.Array) -> tuple[jax.Array, ...]:
    """The arrays made to vary over the same manual mesh axes (inside ``shard_map``), so
    a native call's result varies over all of them."""
    axes: list[frozenset[Any]] = [varying_axes(a) for a in arrays]
    union = frozenset().union(*axes)
    return tuple(
        jax.lax.pcast(a, tuple(sorted(union - v)), to="varying") if union - v else a
        for a, v in zip(arrays, axes, strict=True)
    )


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
    x, y = _varying(jnp.asarray(x), jnp.asarray(y))
    return _call("rowdot", x.shape[:-1], "broadcast_all", x, y)


@rowdot.defjvp
def _rowdot_jvp(primals: Any, tangents: Any) -> tuple[jax.Array, jax.Array]:
    x, y = primals
    dx, dy = tangents
    tangent = jnp.einsum("...j,...j->...", dx, y) + jnp.einsum("...j,...j->...", x, dy)
    return rowdot(x, y), tangent


@jax.custom_jvp
def matmul(a: jax.Array, b: jax.Array) -> jax.Array:
    """``a @ b`` for (m, k) and (k, n) float32 or float64 arrays of one dtype, on a CPU
    device; needs ``available("matmul")``. Differentiable (its derivatives are matmuls);
    under ``vmap`` each product is one call.

    >>> import numpy as np
    >>> a = np.arange(6.0, dtype=np.float32).reshape(2, 3)
    >>> available("matmul") and matmul(a, a.T).tolist() == [[5.0, 14.0], [14.0, 50.0]]
    True
    """
    a, b = _varying(jnp.asarray(a), jnp.asarray(b))
    return _call("matmul", (a.shape[0], b.shape[1]), "sequential", a, b)


@matmul.defjvp
def _matmul_jvp(primals: Any, tangents: Any) -> tuple[jax.Array, jax.Array]:
    a, b = primals
    da, db = tangents
    return matmul(a, b), jnp.matmul(da, b) + jnp.matmul(a, db)
