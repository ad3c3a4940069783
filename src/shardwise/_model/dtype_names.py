"""The dtype names shardwise reads from text and profiles: NumPy's, and XLA's short forms,
and whether a name is a dtype's as NumPy names it.
Pure."""

from __future__ import annotations

NAMES: dict[str, str] = {
    "bool": "bool",
    "i8": "int8",
    "i16": "int16",
    "i32": "int32",
    "i64": "int64",
    "u8": "uint8",
    "u16": "uint16",
    "u32": "uint32",
    "u64": "uint64",
    "f16": "float16",
    "bf16": "bfloat16",
    "f32": "float32",
    "f64": "float64",
    "c64": "complex64",
    "c128": "complex128",
}
"""Every dtype name shardwise reads from text (``--dtype``, ``--args x=bf16[…]``): the short
form (as XLA prints them, with ``i`` for signed integers) → NumPy's name, which is read too."""


def is_dtype_name(key: object) -> bool:
    """Whether ``key`` is a dtype as NumPy names it (``float32``, ``bfloat16``,
    ``float8_e4m3fn``), the names the planner looks rates up by (``f32``, ``f4``: no)."""
    import jax.numpy as jnp

    try:
        return isinstance(key, str) and jnp.dtype(key).name == key
    except TypeError:
        return False
