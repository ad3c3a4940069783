"""A program for `shardwise launch` tests: the property-test family at small sizes.

Prints one JSON line (from process 0) with every result's checksum and collectives, so the
same program on 1 × 8 and 2 × 4 devices can be compared. ``--die K`` makes process K kill
itself once the runtime has formed.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import numpy as np

import shardwise
from shardwise._model.op import Op
from shardwise._model.strategy import layouts
from shardwise._runtime.distributed import process_index, to_host

CASES = [
    ("nd,nd->n", [(16, 6)] * 2, "devices=8"),
    ("mk,kn->mn", [(8, 4), (4, 8)], "x=2,y=4"),
    ("i,j->ij", [(8,), (4,)], "x=2,y=4"),
    ("ij->i", [(8, 8)], "x=2,y=4"),
]


def main() -> None:
    if "--die" in sys.argv:
        victim = int(sys.argv[sys.argv.index("--die") + 1])
        shardwise.mesh("auto")  # the runtime has formed
        if process_index() == victim:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(120)  # the others wait, as if in a long computation
        return
    results = []
    for equation, shapes, mesh in CASES:
        op = Op.parse(equation)
        rng = np.random.default_rng(0)
        arrays = [rng.random(s, dtype=np.float32) for s in shapes]
        spec = shardwise.MeshSpec.parse(mesh)
        for layout in layouts(op.indices, op.sizes(shapes), spec):
            for mode in ("auto", "manual"):
                out = to_host(
                    shardwise.einsum(equation, *arrays, mesh=mesh, layout=layout, mode=mode)
                )
                expl = shardwise.explain_einsum(
                    equation, shapes, mesh=mesh, layout=layout, mode=mode
                )
                results.append(
                    {
                        "case": f"{equation} {layout.describe()} {mode}",
                        "sum": float(np.float64(out).sum()),
                        "max_error": float(np.abs(out - np.einsum(equation, *arrays)).max()),
                        "collectives": sorted({c.kind for c in expl.collectives}),
                    }
                )
    # shard(): the tutorial's pjit, with host arrays, across processes
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    dot = shardwise.shard(
        jax.vmap(jnp.dot), "devices=8", in_specs=(P("devices"), None), out_specs=P("devices")
    )
    v = np.random.default_rng(1).random((64, 3), dtype=np.float32)
    out = to_host(dot(v, v))
    results.append(
        {
            "case": "shard vmap(dot)",
            "sum": float(np.float64(out).sum()),
            "max_error": float(np.abs(out - np.einsum("nd,nd->n", v, v)).max()),
            "collectives": [],
        }
    )
    if process_index() == 0:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
