"""Build programs with JAX and read back what XLA did.

Lowering, kernels, HLO, explanations and checks.
"""
