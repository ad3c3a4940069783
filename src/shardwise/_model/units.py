"""Byte sizes written by people: ``"16GiB"``, ``"2GB"``, ``"500MB"``, ``"1e9"``."""

from __future__ import annotations

import math
import numbers
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

MAX_BYTES = 2**63 - 1
"""The largest size :func:`parse_bytes` accepts (8 EiB, past any machine's memory): a size is
a signed 64-bit count in XLA and in the integer programs a budget constrains."""


def parse_bytes(text: str | int | float, what: str = "the size") -> int:
    """Bytes in ``text``, a size of at least one byte (a budget, a capacity): the one reader of
    every size a user gives, in Python (an int, a float, or text) or on the command line.

    >>> parse_bytes("16GiB"), parse_bytes("2 GB"), parse_bytes("1e6"), parse_bytes(4096)
    (17179869184, 2000000000, 1000000, 4096)
    >>> parse_bytes("0", "--budget")
    Traceback (most recent call last):
    shardwise._errors.ArgumentError: --budget '0' is 0 bytes; it must be at least 1 byte: ...

    Raises:
        ArgumentError: for text that is not a size, or a size below one byte or above
            :data:`MAX_BYTES`, or not finite.
        ArgumentTypeError: for anything but text or a number (``True`` included).
    """
    if isinstance(text, bool) or not isinstance(text, str | numbers.Real):
        raise ArgumentTypeError(
            f"{what} is {type(text).__name__} {text!r}; give a number of bytes or text like 16GiB."
        )
    if isinstance(text, str):
        m = re.fullmatch(r"\s*([-+]?[0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
        unit = m.group(2).lower() if m else ""
        if not m or unit not in _UNITS:
            raise ArgumentError(
                f"cannot read {what} {text!r}: write a number and a unit, e.g. 16GiB, 2GB or "
                "500MiB (units: B, KB, MB, GB, TB, KiB, MiB, GiB, TiB; K, M, G and T alone "
                "are KiB, MiB, GiB and TiB)."
            )
        value: float = float(m.group(1)) * _UNITS[unit]
    else:  # an int of any size is compared as an int: a float cannot hold 10**400
        value = int(text) if isinstance(text, numbers.Integral) else float(text)
    if isinstance(value, float) and not math.isfinite(value):
        raise ArgumentError(
            f"{what} {text!r} is not a finite number; give a positive size, e.g. 16GiB."
        )
    if value > MAX_BYTES:
        raise ArgumentError(
            f"{what} {_shown(text)} is more than 8 EiB (2**63 - 1 bytes), more than any machine "
            "holds; give a size such as 16GiB."
        )
    if value < 1:
        raise ArgumentError(
            f"{what} {text!r} is {_amount(value)}; it must be at least 1 byte: give a "
            "positive size, e.g. 16GiB."
        )
    return int(value)


def _shown(text: object) -> str:
    """``repr(text)``, its middle cut out past 40 characters (an int of 400 digits)."""
    shown = repr(text)
    return shown if len(shown) <= 40 else f"{shown[:18]}…{shown[-18:]} ({len(shown)} characters)"


def _amount(value: float) -> str:
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
