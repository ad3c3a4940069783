"""Simulate 8 CPU devices for the tests and the doctests, before JAX starts.

XLA's CPU backend also compiles without LLVM's optimisations here
(``--xla_backend_optimization_level=0``, ``--xla_llvm_disable_expensive_passes``): the
optimised HLO, its collectives and its buffer sizes are the same (checked on every plan of a
Llama training step, and by every test that reads them), only the machine code is slower, and
compiling, most of this suite's time, takes about 40% less (the second flag takes another 8%
off the suite's time). The variable is set before JAX
starts, so the processes the tests launch (the CLI, ``shardwise launch``) inherit it.

A program plan's ``verify`` times each plan here in turns of one call, not of 0.2 s
(``TURN_SECONDS``): no test asserts on a measured time, and the turns had taken a tenth of
the suite's time.

Compiled programs are kept in a compilation cache for the run (a directory of its own, removed
when the run ends, shared with the test workers and the processes the tests launch): the
suite compiles many programs more than once (a plan's ``verify`` and the test's own
``jax.jit``, the same step in several tests), and a program found there is not compiled again
(as users with the cache on have it: the miscompile guard reads such a program with its own
source lines, :mod:`shardwise._xla.located`).
"""

import atexit
import os
import shutil
import tempfile

for _flag in ("--xla_backend_optimization_level=0", "--xla_llvm_disable_expensive_passes=true"):
    if _flag not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_flag}".strip()

_CACHE = "JAX_COMPILATION_CACHE_DIR"
if _CACHE not in os.environ:  # (the run's first process; the workers inherit it)
    os.environ[_CACHE] = tempfile.mkdtemp(prefix="shardwise-test-jit-")
    atexit.register(shutil.rmtree, os.environ[_CACHE], ignore_errors=True)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

import jax  # noqa: E402  (after XLA_FLAGS, which XLA reads when it starts)

jax.config.update("jax_num_cpu_devices", 8)

import shardwise._program.verify  # noqa: E402

shardwise._program.verify.TURN_SECONDS = 0.0
