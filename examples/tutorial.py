"""The pjit tutorial's five scenarios on current JAX, with shardwise.

S1  batched dot products, v1 split along the batch on a 1-D mesh of 8 devices, v2 replicated
S2  the same with both inputs split along the batch
S3  long vectors split along their components: partial dot products, summed across devices
S4  both axes split on a 2x4 mesh: an all-reduce over one mesh axis
S5  data larger than the memory budget, streamed through the mesh in chunks (and with Dask)

Every result is checked against NumPy. Run it with ``python examples/tutorial.py``; it runs on
8 simulated CPU devices where the machine has fewer than 8 accelerators (a few seconds).
"""

import tempfile
import time
from pathlib import Path

import dask.array as da
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import shardwise

shardwise.use_cpu_devices(8)  # before any JAX computation: 8 simulated CPU devices
START = time.perf_counter()
# the real accelerators where there are 8 of them, else the 8 simulated CPU devices
DEVICES = jax.devices() if len(jax.devices()) >= 8 else jax.devices("cpu")
line = shardwise.mesh("devices=8", devices=DEVICES)  # 1-D mesh: one axis of 8 devices
grid = shardwise.mesh("x=2,y=4", devices=DEVICES)  # 2-D mesh: 2 rows x 4 columns
rng = np.random.default_rng(0)


def collectives(explanation: shardwise.Explanation) -> str:
    """The collectives XLA inserted, e.g. 'all-reduce over y'."""
    found = [f"{c.kind} over {','.join(c.mesh_axes)}" for c in explanation.collectives]
    return ", ".join(found) or "none"


def show(name: str, out: jax.Array, explanation: shardwise.Explanation) -> None:
    shard = out.addressable_shards[0].data.shape
    print(f"{name}: output {out.shape} as {out.sharding.spec}, {shard} per device; ", end="")
    print(f"collectives: {collectives(explanation)}")


# S1: the tutorial's pjit(jax.vmap(jnp.dot), in_axis_resources=(P('devices'), None), ...)
v1 = rng.random((8_000, 3), dtype=np.float32)
v2 = rng.random((8_000, 3), dtype=np.float32)
expected = np.einsum("nd,nd->n", v1, v2)
dot_s1 = shardwise.shard(
    jax.vmap(jnp.dot), line, in_specs=(P("devices"), None), out_specs=P("devices")
)
out = dot_s1(v1, v2)
assert np.allclose(out, expected, rtol=1e-5)
show("S1", out, dot_s1.explain(v1, v2))

# S2: both inputs split along the batch; each device dots its own rows, nothing moves
dot_s2 = shardwise.shard(
    jax.vmap(jnp.dot), line, in_specs=(P("devices"), P("devices")), out_specs=P("devices")
)
out = dot_s2(v1, v2)
assert np.allclose(out, expected, rtol=1e-5)
show("S2", out, dot_s2.explain(v1, v2))

# S3: 64 pairs of 800-component vectors, split along the components ('-' = not split):
# each device dots its 100 components, and a psum adds the 8 partial dots
a = rng.random((64, 800), dtype=np.float32)
b = rng.random((64, 800), dtype=np.float32)
specs = ["-,devices", "-,devices"]
out = shardwise.einsum("nd,nd->n", a, b, mesh=line, in_specs=specs, out_specs=None, mode="manual")
assert np.allclose(out, np.einsum("nd,nd->n", a, b), rtol=1e-5)
how = shardwise.explain("nd,nd->n", a, b, mesh=line, in_specs=specs, out_specs=None, mode="manual")
show("S3", out, how)
print(f"    why: {how.causes[0].text}")

# S4: rows split over x, components over y on the 2x4 mesh; the output keeps x, and the
# partial sums over y are added by one all-reduce over y
a = rng.random((400, 1_000), dtype=np.float32)
b = rng.random((400, 1_000), dtype=np.float32)
specs = [P("x", "y"), P("x", "y")]
out = shardwise.einsum("nd,nd->n", a, b, mesh=grid, in_specs=specs, out_specs=P("x"))
assert np.allclose(out, np.einsum("nd,nd->n", a, b), rtol=1e-5)
show("S4", out, shardwise.explain("nd,nd->n", a, b, mesh=grid, in_specs=specs, out_specs=P("x")))

# S5: 12.8 MB of input through a 2 MiB budget: shardwise.stream cuts it into chunks along
# n, runs each chunk on the 8 devices, and writes the result to disk as it goes
with tempfile.TemporaryDirectory() as folder:
    work = Path(folder)
    big = rng.random((200_000, 8), dtype=np.float32)
    np.save(work / "a.npy", big)
    np.save(work / "b.npy", big[::-1])
    done = shardwise.stream(
        "nd,nd->n", work / "a.npy", work / "b.npy", mesh=line, out=work / "dots.npy", budget="2MiB"
    )
    assert np.allclose(np.load(work / "dots.npy"), np.einsum("nd,nd->n", big, big[::-1]))
    print(
        f"S5: {2 * big.nbytes / 2**20:.1f} MiB of input in {done.chunks} chunks of "
        f"{done.plan.chunk:,} rows under a 2 MiB budget"
    )

# S5 with Dask, as the tutorial ends: each block runs through JAX on the mesh
data = da.random.default_rng(0).random((1_000, 1_000), chunks=(250, 250))
values = data.compute()
assert np.allclose(shardwise.mean(data).compute(), values.mean())
dot_mean = shardwise.einsum("ij,jk->", data, data) / 1_000**2  # dot(data, data).mean()
assert np.allclose(dot_mean.compute(), (values @ values).mean())
print(
    f"S5: Dask: data.mean() and dot(data, data).mean() of {data.shape} in {data.npartitions} blocks"
)

print(f"all five scenarios agree with NumPy ({time.perf_counter() - START:.1f} s)")
