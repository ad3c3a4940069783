"""The dtype names shardwise reads from text and profiles: NumPy's, and XLA's short forms.
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
