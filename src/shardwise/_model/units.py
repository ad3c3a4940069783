"""Byte sizes written by people: ``"16GiB"``, ``"2GB"``, ``"500MB"``, ``"1e9"``."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from shardwise._errors import ArgumentError, ArgumentTypeError

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "k": 2**10,
    "m": 2**20,
    "g": 2**30,
    "t": 2**40,
}


def parse_bytes(text: str | int | float, what: str = "the size") -> int:
    """Bytes in ``text``, a size of at least one byte (a budget, a capacity).

    >>> parse_bytes("16GiB"), parse_bytes("2 GB"), parse_bytes("1e6")
    (17179869184, 2000000000, 1000000)
    >>> parse_bytes("0", "--budget")
    Traceback (most recent call last):
    shardwise._errors.ArgumentError: --budget '0' is 0 bytes; it must be at least 1 byte: ...

    Raises:
        ArgumentError: for text that is not a size, or a size below one byte.
        ArgumentTypeError: for anything but text or a number.
    """
    if isinstance(text, bool) or not isinstance(text, str | int | float):
        raise ArgumentTypeError(
            f"{what} is {type(text).__name__} {text!r}; give a number of bytes or text like 16GiB."
        )
    if isinstance(text, str):
        m = re.fullmatch(r"\s*([-+]?[0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
        unit = m.group(2).lower() if m else ""
        if not m or unit not in _UNITS:
            raise ArgumentError(
                f"cannot read {what} {text!r}: write a number and a unit, e.g. 16GiB, 2GB or "
                "500MiB (units: B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)."
            )
        value = float(m.group(1)) * _UNITS[unit]
    else:
        value = text
    if not math.isfinite(value) or value < 1:
        raise ArgumentError(
            f"{what} {text!r} is {_amount(value)}; it must be at least 1 byte: give a "
            "positive size, e.g. 16GiB."
        )
    return int(value)


def _amount(value: float) -> str:
    if not math.isfinite(value):
        return "not a finite number"
    return f"{value:g} bytes" if value >= 0 else "negative"


def format_bytes(n: float) -> str:
    """``1536`` → ``'1.5 KiB'``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n} B"


def format_seconds(s: float) -> str:
    """``0.0123`` → ``'12.3 ms'``; under 0.1 ms in µs, from 1 s in seconds.

    >>> format_seconds(0.0123), format_seconds(4e-5), format_seconds(1240.0)
    ('12.3 ms', '40 µs', '1,240 s')
    >>> format_seconds(2.5)
    '2.5 s'
    """
    if s >= 1000:
        return f"{s:,.0f} s"
    if s >= 1:
        return f"{s:.3g} s"
    return f"{s * 1e3:.3g} ms" if s >= 1e-4 else f"{s * 1e6:.3g} µs"


def format_shape(shape: Sequence[int]) -> str:
    """``(4000, 10000)`` style, the same for tuples and JSON lists.

    >>> format_shape([4000]), format_shape(())
    ('(4000)', '()')
    """
    return "(" + ", ".join(str(n) for n in shape) + ")"
