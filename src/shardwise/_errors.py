"""One exception family for everything a user can get wrong.

Every error says what was given, what is wrong with it and how to fix it.
Each subclass also derives from the standard exception that fits, so code that
already catches ``ValueError`` or ``TypeError`` keeps working.
"""

from __future__ import annotations

import difflib
import enum
import warnings
from collections.abc import Iterable
from typing import Final, Literal, TypeVar

T = TypeVar("T")


class ShardwiseError(Exception):
    """Base class of every error shardwise raises on purpose."""


class MeshError(ShardwiseError, ValueError):
    """A mesh description is malformed, or asks for devices that do not exist."""


class SpecError(ShardwiseError, ValueError):
    """A partition spec or index layout is malformed or does not fit the mesh or operand."""


class IndivisibleError(SpecError):
    """A dimension's size is not a multiple of the number of shards it is split into."""


class EquationError(ShardwiseError, ValueError):
    """An einsum equation is malformed."""


class ShapeError(ShardwiseError, ValueError):
    """Operands do not match the equation: wrong count, rank or sizes."""


class ArgumentError(ShardwiseError, ValueError):
    """An argument's value is not one shardwise can use (an option, a size, a file)."""


class ArgumentTypeError(ArgumentError, TypeError):
    """An argument has the wrong type (or dtype), or the wrong number of entries: a
    ``TypeError``, and an :class:`ArgumentError` so that one ``except`` catches every bad
    argument."""


def did_you_mean(given: str, choices: Iterable[str]) -> str:
    """A ' (did you mean `y`?)' hint for ``given``, or '' when nothing is close.

    >>> did_you_mean("dev", ["devices", "x"])
    ' (did you mean `devices`?)'
    >>> did_you_mean("q", ["x", "y"])
    ''
    """
    close = difflib.get_close_matches(given, list(choices), n=1, cutoff=0.5)
    return f" (did you mean `{close[0]}`?)" if close else ""


class MissingExtraError(ShardwiseError, ImportError):
    """An optional dependency is not installed; the message names the extra to install."""


class DistributedError(ShardwiseError, RuntimeError):
    """The processes could not form, or keep, one runtime."""


class MiscompileError(ShardwiseError, RuntimeError):
    """The compiled program would return a wrong result (XLA dropped a sum it needs), or a
    result failed its check against NumPy; shardwise returns nothing from it."""


class _Unset(enum.Enum):
    UNSET = "unset"


UNSET: Final = _Unset.UNSET
"""The default of a deprecated argument: not given."""

Unset = Literal[_Unset.UNSET]


def renamed_argument(
    function: str, new: str, new_value: T, old: str, old_value: T | Unset, default: T
) -> T:
    """The value of argument ``new`` of ``function``, or of ``old``, its deprecated name: using
    ``old`` warns (``DeprecationWarning``); giving both (``new`` not at its ``default``) is an
    error.

    >>> renamed_argument("einsum", "out_specs", "x", "out_spec", UNSET, "infer")
    'x'
    """
    if old_value is UNSET:
        return new_value
    if not (new_value is default or (isinstance(new_value, str) and new_value == default)):
        raise ArgumentTypeError(
            f"{function}() was given {new}= and {old}=, its deprecated old name; give {new}= only."
        )
    warnings.warn(
        f"{function}({old}=...) is deprecated; use {new}=..., the name shardwise.shard, "
        "shardwise.explain and jax.shard_map use (it will be removed in the next release).",
        DeprecationWarning,
        stacklevel=3,
    )
    return old_value
