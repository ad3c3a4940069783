"""Which dtypes an einsum computes in: the dtype names shardwise reads, NumPy's result type,
JAX's 64-bit mode where needed, and a clear error for dtypes that are not numbers."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from shardwise._caches import cached
from shardwise._errors import ArgumentError, ArgumentTypeError, did_you_mean
from shardwise._model.dtype_names import NAMES


def parse_dtype(text: str, where: str = "--dtype") -> np.dtype[Any]:
    """A dtype named in text: NumPy's name (``float32``, ``bfloat16``, ``int8``) or its short
    form (``f32``, ``bf16``, ``i8``), in any case; anything else is an error listing the names.

    >>> parse_dtype("bf16").name, parse_dtype("float32").name
    ('bfloat16', 'float32')
    >>> parse_dtype("bf99")
    Traceback (most recent call last):
    shardwise._errors.ArgumentError: --dtype 'bf99' is not a dtype (did you mean `bf16`?); ...
    """
    name = NAMES.get(text.strip().lower(), text.strip().lower())
    if name not in NAMES.values():
        raise ArgumentError(
            f"{where} {text!r} is not a dtype{did_you_mean(text, [*NAMES, *NAMES.values()])}; "
            f"use one of {', '.join(dict.fromkeys(NAMES.values()))}, or its short form "
            f"{', '.join(k for k in NAMES if k != 'bool')}."
        )
    return np.dtype(jnp.dtype(name))


def supported(dtype: Any, what: str = "the operands") -> np.dtype[Any]:
    """``dtype`` as a NumPy dtype, if JAX computes in it; else an error naming it and the fix.

    >>> supported("bfloat16").name, supported("bf16").name
    ('bfloat16', 'bfloat16')
    >>> supported("U3")
    Traceback (most recent call last):
    shardwise._errors.ArgumentTypeError: the dtype of the operands is <U3 (strings); ...
    """
    if isinstance(dtype, str):
        dtype = NAMES.get(dtype, dtype)
    try:
        given: np.dtype[Any] = np.dtype(jnp.dtype(dtype))
    except TypeError:
        raise ArgumentTypeError(
            f"dtype {dtype!r} of {what} is not a dtype; use a name like float32 or bfloat16."
        ) from None
    if not given.isnative:
        raise ArgumentTypeError(
            f"the dtype of {what}, {given.str!r}, is not in this machine's byte order; JAX "
            f"computes only in native order. Convert first: "
            f"a.astype(a.dtype.newbyteorder('='))."
        )
    if given != np.bool_ and not jnp.issubdtype(given, jnp.number):
        raise ArgumentTypeError(
            f"the dtype of {what} is {given} ({_kind(given)}); an einsum needs numbers: booleans, "
            "integers, floating point (bfloat16 to float64) or complex. Convert first, e.g. "
            + ("np.load(path).view(ml_dtypes.bfloat16).astype(np.float32)."
               if _saved_bfloat16(given) else "a.astype(np.float32).")
        )  # fmt: skip
    if given.itemsize > {"f": 8, "c": 16}.get(given.kind, given.itemsize):
        raise ArgumentTypeError(
            f"the dtype of {what} is {given.name}, NumPy's extended precision, which JAX does "
            "not compute in; the widest types JAX has are float64 and complex128. Convert "
            "first, e.g. a.astype(np.float64)."
        )
    return given


def check_arrays(values: Sequence[Any], what: str = "operand {k}") -> None:
    """Refuse any of ``values`` that is not an array: a NumPy or JAX array, a NumPy scalar or a
    ``jax.ShapeDtypeStruct`` (anything with ``shape`` and ``dtype``). Like ``jax.numpy``,
    shardwise does not read lists and tuples as arrays.

    >>> check_arrays([np.ones(2), [1.0, 2.0]])
    Traceback (most recent call last):
    shardwise._errors.ArgumentTypeError: operand 1 is a list, not an array; ...
    """
    for k, value in enumerate(values):
        if hasattr(value, "shape") and hasattr(value, "dtype"):
            continue
        raise ArgumentTypeError(
            f"{what.format(k=k)} is {describe_value(value)}, not an array; {ARRAYS_HINT}"
        )


ARRAYS_HINT = (
    "give a NumPy or JAX array (or a jax.ShapeDtypeStruct to explain). Like jax.numpy, "
    "shardwise does not convert lists, tuples or Python numbers: use np.asarray(x) (NumPy reads "
    "nested lists as an array)."
)
"""The fix for a value that is not an array, in every message that refuses one."""


def describe_value(value: object) -> str:
    """``'a list'``, ``'None'``, ``"the string 'abc'"``: what a value is, for a message."""
    if value is None:
        return "None"
    if isinstance(value, str | bytes):
        return f"the {'string' if isinstance(value, str) else 'bytes'} {value[:40]!r}"
    name = type(value).__name__
    article = "an" if name[:1].lower() in "aeiou" else "a"
    return f"{article} {name}"


def _kind(dtype: np.dtype[Any]) -> str:
    if dtype.fields is not None:
        return "a structured dtype"
    return {
        "O": "Python objects",
        "U": "strings",
        "S": "bytes",
        "M": "dates",
        "m": "time differences",
        "V": "raw bytes: np.save writes bfloat16 so, as .npy has no bfloat16"
        if _saved_bfloat16(dtype)
        else "raw bytes",
    }.get(dtype.kind, "not a number")


def _saved_bfloat16(dtype: np.dtype[Any]) -> bool:
    """Whether ``dtype`` is how ``np.save`` writes bfloat16: two raw bytes (``|V2``)."""
    return dtype.kind == "V" and dtype.itemsize == 2


def mean_dtypes(dtype: Any) -> tuple[np.dtype[Any], np.dtype[Any]]:
    """The type a mean of ``dtype`` is summed in and the type it is given in, as NumPy's
    ``mean``: integers and bools summed and given in float64 (an int8 sum had wrapped, and a
    bool one had been a logical or), float16 and bfloat16 summed in float32 and given in
    their own type (a float16 sum of a thousand 1000s had been inf), others in their own.

    >>> [tuple(t.name for t in mean_dtypes(d)) for d in ("int8", "bool", "float16", "float32")]
    [('float64', 'float64'), ('float64', 'float64'), ('float32', 'float16'), ('float32', 'float32')]
    """
    given = np.dtype(jnp.dtype(dtype))
    if not jnp.issubdtype(given, jnp.inexact):
        return np.dtype(np.float64), np.dtype(np.float64)
    if jnp.issubdtype(given, jnp.floating) and given.itemsize < 4:
        return np.dtype(np.float32), given
    return given, given


def result_dtype(arrays: Sequence[Any]) -> np.dtype[Any]:
    """The dtype NumPy's einsum gives these operands, bfloat16 included (with ``ml_dtypes``, as
    JAX's own arrays convert to NumPy; JAX's promotion only where NumPy has no rule); 64-bit
    types are computed in 64 bits (:func:`wide`).

    >>> result_dtype([np.ones(2, np.int8), np.ones(2, np.float32)]).name
    'float32'
    >>> result_dtype([np.ones(2, jnp.bfloat16), np.ones(2, np.int32)]).name  # JAX: bfloat16
    'float64'
    """
    return _result_dtype(tuple(a.dtype for a in arrays))


@cached(maxsize=64)
def _result_dtype(given: tuple[Any, ...]) -> np.dtype[Any]:
    dtypes = [supported(d, f"operand {k}") for k, d in enumerate(given)]
    try:  # ml_dtypes teaches NumPy its types' promotions: bfloat16 with int32 is float64
        return np.result_type(*dtypes)
    except TypeError:  # a pair NumPy has no rule for: JAX's promotion
        return np.dtype(functools.reduce(jnp.promote_types, dtypes))


def wide(dtype: Any) -> contextlib.AbstractContextManager[Any]:
    """JAX's 64-bit mode for as long as shardwise builds and runs a program in ``dtype``, when
    that is a 64-bit type (float64, int64, uint64, complex128) that JAX would otherwise narrow.

    >>> with wide("int64"):
    ...     str(jnp.asarray(np.int64(2) ** 40).dtype)
    'int64'
    """
    return _wide_if(_needs_wide(dtype))


def wide_blocks(blocks: Sequence[Any]) -> contextlib.AbstractContextManager[Any]:
    """:func:`wide` while any of ``blocks`` (arrays) has a 64-bit dtype JAX would narrow."""
    return _wide_if(any(_needs_wide(b.dtype) for b in blocks))


def _needs_wide(dtype: Any) -> bool:
    given = dtype if isinstance(dtype, np.dtype) else np.dtype(jnp.dtype(dtype))
    return given.itemsize >= 8 and _narrowed(given, x64())


def _wide_if(needed: bool) -> contextlib.AbstractContextManager[Any]:
    if not needed:
        return contextlib.nullcontext()
    return jax.enable_x64(True)  # type: ignore[no-any-return]


def x64() -> bool:
    """Whether JAX's 64-bit mode is on here (a key of every cache whose value depends on it)."""
    return bool(jax.config.read("jax_enable_x64"))


@cached(maxsize=64)
def _narrowed(dtype: np.dtype[Any], x64: bool) -> bool:
    """Whether JAX, with 64-bit mode ``x64``, would compute in a narrower type than ``dtype``."""
    return bool(np.dtype(jax.dtypes.canonicalize_dtype(dtype)) != dtype)


@cached(maxsize=256)
def storage_name(dtype: Any) -> str:
    """The NumPy name of ``dtype``, or for one NumPy has no name for (a PRNG key's
    ``key<fry>``), that of the unsigned integer of the same width, which stores as many bytes
    (kept by dtype: NumPy makes the name anew each time, and the graph asks it of every array).

    >>> storage_name(np.float32), storage_name(jax.random.key(0).dtype)
    ('float32', 'uint64')
    """
    try:
        return str(np.dtype(dtype).name)
    except TypeError:
        size = int(dtype.itemsize)
        return {1: "uint8", 2: "uint16", 4: "uint32", 8: "uint64"}.get(size, f"V{size}")
