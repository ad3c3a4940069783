"""Benchmarks: shardwise side by side with NumPy, PyTorch, Dask and plain JAX, against the
machine's own limits (memory bandwidth and sgemm FLOP/s, measured in the same run)."""

from shardwise.bench.run import SUITES as SUITES
from shardwise.bench.run import run_bench as run_bench

__all__ = ["SUITES", "run_bench"]
