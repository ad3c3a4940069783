"""Simulate 8 CPU devices for the tests and the doctests, before JAX starts.

XLA's CPU backend also compiles without LLVM's optimisations here
(``--xla_backend_optimization_level=0``, ``--xla_llvm_disable_expensive_passes``): the
optimised HLO, its collectives and its buffer sizes are the same (checked on every plan of a
Llama training step, and by every test that reads them), only the machine code is slower, and
compiling, most of this suite's time, takes about 40% less (the second flag takes another 8%
off the Llama and cost-model tests). The variable is set before JAX starts, so the processes
the tests launch (the CLI, ``shardwise launch``) inherit it.

A program plan's ``verify`` times each plan here in turns of one call, not of 0.2 s
(``TURN_SECONDS``): no test asserts on a measured time, and the turns had taken a tenth of
the suite's time.

The suite does not keep compiled programs in JAX's persistent compilation cache: a program
found there carries the source lines of the test that compiled it first, and tests read lines
from compiled programs (the tests that turn the cache on give it a directory of their own,
``helpers.persistent_cache``).
"""

import os

for _flag in ("--xla_backend_optimization_level=0", "--xla_llvm_disable_expensive_passes=true"):
    if _flag not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_flag}".strip()

import jax  # noqa: E402  (after XLA_FLAGS, which XLA reads when it starts)

jax.config.update("jax_num_cpu_devices", 8)

import shardwise._program.verify  # noqa: E402

shardwise._program.verify.TURN_SECONDS = 0.0
