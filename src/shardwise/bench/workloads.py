"""The benchmark workloads, each written the way a user of every library would write it.

- W1: batched dot (10⁷, 3) float32 on ``devices=8`` (the tutorial's S1/S2);
- W2: batched dot (4000, 10000) float32 on a 2×4 mesh, ``P('x','y') → P('x')`` (S4);
- W3: matmul 4096×4096 float32 (the tutorial's ``da.dot(data, data)``), on the planner's
  best layout;
- W4: mean of a (10000, 10000) float64 array in 1000×1000 chunks (the tutorial's Dask
  ``data.mean()``).

Each system holds its data where it naturally lives before timing starts: NumPy and PyTorch
in host memory, Dask as a chunked array over it, JAX and shardwise as sharded arrays on the
mesh (placement is timed separately and reported).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shardwise._extras import available, require

Runner = Callable[[], Any]
PEERS = ("numpy", "torch", "dask", "jax")


@dataclass
class Workload:
    """One benchmark: its data, what it must move and compute, and who runs it."""

    name: str
    title: str
    nbytes: int
    flops: int
    terms: int
    reference: Callable[[], np.ndarray]
    shardwise: Callable[[], Runner]
    raw: Callable[[], Runner]
    peers: dict[str, Callable[[], Runner]] = field(default_factory=dict)


PEER_MODULES = {"numpy": "numpy", "torch": "torch", "dask": "dask.array", "jax": "jax"}
"""The module each peer runs on."""


def installed(peer: str) -> bool:
    """Whether a peer library can be imported."""
    return available(PEER_MODULES[peer])


@dataclass(frozen=True)
class Sizes:
    """Problem sizes of one suite."""

    w1: int
    w2: tuple[int, int]
    w3: int
    w4: tuple[int, int]


SIZES = {
    "seed": Sizes(w1=10_000_000, w2=(4000, 10000), w3=4096, w4=(10000, 1000)),
    "tiny": Sizes(w1=8_000, w2=(16, 80), w3=64, w4=(80, 10)),
}


def _torch_threads() -> None:
    import os

    torch = require("torch", "the PyTorch peer")

    torch.set_num_threads(os.cpu_count() or 1)


def batched_dot(
    name: str,
    title: str,
    n: int,
    d: int,
    mesh_text: str,
    in_spec: str,
    out_spec: str,
    dask_chunks: tuple[int, int],
) -> Workload:
    """W1 / W2: ``nd,nd->n``."""
    import jax
    import jax.numpy as jnp

    import shardwise
    from shardwise._planner.layout import plan_arrays
    from shardwise._xla.lower import jitted, place

    rng = np.random.default_rng(0)
    a = rng.random((n, d), dtype=np.float32)
    b = rng.random((n, d), dtype=np.float32)
    mesh = shardwise.mesh(mesh_text)

    layout: dict[str, Any] = {"in_specs": [in_spec, in_spec], "out_specs": out_spec}

    def ours() -> Runner:
        plan, jm = plan_arrays("nd,nd->n", a, b, mesh=mesh, **layout)
        pa, pb = place(plan, jm, [a, b])
        return lambda: shardwise.einsum("nd,nd->n", pa, pb, mesh=mesh, **layout)

    def raw() -> Runner:
        plan, jm = plan_arrays("nd,nd->n", a, b, mesh=mesh, **layout)
        compiled = jitted(plan, jm)
        pa, pb = place(plan, jm, [a, b])
        return lambda: compiled(pa, pb)

    def numpy() -> Runner:
        return lambda: np.einsum("nd,nd->n", a, b)

    def torch() -> Runner:
        th = require("torch", "the PyTorch peer")

        _torch_threads()
        ta, tb = th.from_numpy(a), th.from_numpy(b)
        return lambda: th.einsum("nd,nd->n", ta, tb)

    def dask() -> Runner:
        da = require("dask.array", "the Dask peer")

        xa, xb = da.from_array(a, chunks=dask_chunks), da.from_array(b, chunks=dask_chunks)
        return lambda: da.einsum("nd,nd->n", xa, xb).compute()

    def plain_jax() -> Runner:
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P

        spec = shardwise.Spec.parse(in_spec).to_partition_spec()
        s = NamedSharding(mesh, spec)
        f = jax.jit(
            jax.vmap(jnp.dot),
            in_shardings=(s, s),
            out_shardings=NamedSharding(
                mesh, P(*shardwise.Spec.parse(out_spec).to_partition_spec())
            ),
        )
        ja, jb = jax.device_put(a, s), jax.device_put(b, s)
        return lambda: f(ja, jb)

    return Workload(
        name,
        title,
        nbytes=2 * a.nbytes + n * 4,
        flops=2 * n * d,
        terms=d,
        reference=lambda: np.einsum("nd,nd->n", a.astype(np.float64), b.astype(np.float64)),
        shardwise=ours,
        raw=raw,
        peers={"numpy": numpy, "torch": torch, "dask": dask, "jax": plain_jax},
    )


def matmul(size: int) -> Workload:
    """W3: ``mk,kn->mn`` on the planner's best layout."""
    import jax
    import jax.numpy as jnp

    import shardwise
    from shardwise._planner.layout import auto_layout, plan_arrays
    from shardwise._xla.lower import jitted, place

    a = np.random.default_rng(1).random((size, size), dtype=np.float32)
    mesh = shardwise.mesh("x=2,y=4")
    in_specs, out_spec, _ = auto_layout("mk,kn->mn", [a.shape, a.shape], a.dtype, mesh)

    def ours() -> Runner:
        plan, jm = plan_arrays("mk,kn->mn", a, a, mesh=mesh, in_specs=in_specs, out_specs=out_spec)
        pa, pb = place(plan, jm, [a, a])
        return lambda: shardwise.einsum(
            "mk,kn->mn", pa, pb, mesh=mesh, in_specs=in_specs, out_specs=out_spec
        )

    def raw() -> Runner:
        plan, jm = plan_arrays("mk,kn->mn", a, a, mesh=mesh, in_specs=in_specs, out_specs=out_spec)
        compiled = jitted(plan, jm)
        pa, pb = place(plan, jm, [a, a])
        return lambda: compiled(pa, pb)

    def torch() -> Runner:
        th = require("torch", "the PyTorch peer")

        _torch_threads()
        t = th.from_numpy(a)
        return lambda: t @ t

    def dask() -> Runner:
        da = require("dask.array", "the Dask peer")

        chunk = max(size // 4, 1)
        x = da.from_array(a, chunks=(chunk, chunk))
        return lambda: da.dot(x, x).compute()

    def plain_jax() -> Runner:
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P

        line = shardwise.mesh("devices=8")
        rows, full = NamedSharding(line, P("devices")), NamedSharding(line, P())
        f = jax.jit(jnp.dot, in_shardings=(rows, full), out_shardings=rows)
        ja, jb = jax.device_put(a, rows), jax.device_put(a, full)
        return lambda: f(ja, jb)

    return Workload(
        "W3",
        f"matmul {size}×{size} float32, planner's best layout on x=2,y=4",
        nbytes=3 * a.nbytes,
        flops=2 * size**3,
        terms=size,
        reference=lambda: a.astype(np.float64) @ a.astype(np.float64),
        shardwise=ours,
        raw=raw,
        peers={"numpy": lambda: lambda: a @ a, "torch": torch, "dask": dask, "jax": plain_jax},
    )


def mean(size: int, chunk: int) -> Workload:
    """W4: the mean of a float64 array (needs JAX's x64 mode, which the bench turns on)."""
    import jax
    import jax.numpy as jnp

    import shardwise
    from shardwise._planner.layout import plan_arrays
    from shardwise._xla.dtypes import mean_dtypes
    from shardwise._xla.lower import mean_program, place

    x = np.random.default_rng(2).random((size, size))
    mesh = shardwise.mesh("devices=8")

    def ours() -> Runner:
        plan, jm = plan_arrays("ij->", x, mesh=mesh, layout="i=devices")
        (px,) = place(plan, jm, [x])
        return lambda: shardwise.mean(px, mesh=mesh)

    def raw() -> Runner:  # (the program shardwise.mean runs, called directly)
        plan, jm = plan_arrays("ij->", x, mesh=mesh, layout="i=devices")
        compiled = mean_program(x.size, *(t.name for t in mean_dtypes(x.dtype)))
        (px,) = place(plan, jm, [x])
        return lambda: compiled(px)

    def torch() -> Runner:
        th = require("torch", "the PyTorch peer")

        _torch_threads()
        t = th.from_numpy(x)
        return lambda: t.mean()

    def dask() -> Runner:
        da = require("dask.array", "the Dask peer")

        d = da.from_array(x, chunks=(chunk, chunk))
        return lambda: d.mean().compute()

    def plain_jax() -> Runner:
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P

        s = NamedSharding(mesh, P("devices"))
        f = jax.jit(jnp.mean, in_shardings=s)
        jx = jax.device_put(x, s)
        return lambda: f(jx)

    return Workload(
        "W4",
        f"mean of ({size}, {size}) float64 in {chunk}×{chunk} chunks on devices=8",
        nbytes=x.nbytes,
        flops=x.size,
        terms=x.size,
        reference=lambda: np.asarray(x.mean(dtype=np.float64)),
        shardwise=ours,
        raw=raw,
        peers={"numpy": lambda: lambda: x.mean(), "torch": torch, "dask": dask, "jax": plain_jax},
    )


def seed_workloads(suite: str) -> list[Callable[[], Workload]]:
    """The four workloads of a suite, each built only when its turn comes (to bound memory)."""
    s = SIZES["tiny" if suite == "tiny" else "seed"]
    n1 = s.w1
    rows, cols = s.w2
    size, chunk = s.w4
    return [
        lambda: batched_dot(
            "W1",
            f"batched dot ({n1}, 3) float32 on devices=8 (S1/S2)",
            n1,
            3,
            "devices=8",
            "devices",
            "devices",
            (n1 // 8, 3),
        ),
        lambda: batched_dot(
            "W2",
            f"batched dot ({rows}, {cols}) float32 on x=2,y=4 (S4)",
            rows,
            cols,
            "x=2,y=4",
            "x,y",
            "x",
            (rows // 8, cols),
        ),
        lambda: matmul(s.w3),
        lambda: mean(size, chunk),
    ]
