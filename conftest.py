"""Simulate 8 CPU devices for the tests and the doctests, before JAX starts.

XLA's CPU backend also compiles without LLVM's optimisations here
(``--xla_backend_optimization_level=0``): the optimised HLO, its collectives and its buffer
sizes are the same (checked on every plan of a Llama training step), only the machine code
is slower, and compiling takes about 40% less time, most of this suite's. The variable is
set before JAX starts, so the processes the tests launch (the CLI, ``shardwise launch``)
inherit it.

A program plan's ``verify`` times each plan here in turns of one call, not of 0.2 s
(``TURN_SECONDS``): no test asserts on a measured time, and the turns had taken a tenth of
the suite's time.
"""

import os

_FLAG = "--xla_backend_optimization_level=0"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FLAG}".strip()

import jax  # noqa: E402  (after XLA_FLAGS, which XLA reads when it starts)

jax.config.update("jax_num_cpu_devices", 8)

import shardwise._program.verify  # noqa: E402

shardwise._program.verify.TURN_SECONDS = 0.0
