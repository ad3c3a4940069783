"""What a JSON value read as a figure is: its type in JSON's words, and why it is not a
usable figure (a profile's rates and sizes). Pure."""

from __future__ import annotations

import json
import math
import numbers


def json_type(value: object) -> str:
    """What JSON calls ``value``'s type."""
    if value is None:
        return "null"
    for kind, name in ((bool, "boolean"), (str, "string"), (dict, "object"), (list, "array")):
        if isinstance(value, kind):
            return name
    return "number" if isinstance(value, int | float) else type(value).__name__


def figure_fault(value: object, where: str, zero_ok: bool = False) -> str | None:
    """Why ``value`` is not a usable figure (a finite number above 0, or from 0 with
    ``zero_ok``), or ``None`` when it is one."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        shown = json.dumps(value) if isinstance(value, str | bool) else repr(value)
        return f"{where} is {shown[:80]}, not a number"
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an int too large for a float
        finite = False
    if not finite or value < 0 or (value == 0 and not zero_ok):
        least = "of 0 or more" if zero_ok else "above 0"
        return f"{where} is {value!r:.40}; it must be a finite number {least}"
    return None
