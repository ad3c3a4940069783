"""Simulate 8 CPU devices for the tests and the doctests, before JAX starts."""

import jax

jax.config.update("jax_num_cpu_devices", 8)
