"""Data beyond one memory: streamed sources and outputs, Dask arrays."""
