"""One exception family for everything a user can get wrong.

Every error says what was given, what is wrong with it and how to fix it.
Each subclass also derives from the standard exception that fits, so code that
already catches ``ValueError`` or ``TypeError`` keeps working.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class ShardwiseError(Exception):
    """Base class of every error shardwise raises on purpose.

    Where the fix reads differently at the shell (``--devices 16`` rather than
    ``shardwise.use_cpu_devices(16)``), ``shell=`` gives the message as the ``shardwise``
    command prints it.

    >>> e = MeshError("call use_cpu_devices(16).", shell="give --devices 16.")
    >>> str(e), e.shell
    ('call use_cpu_devices(16).', 'give --devices 16.')
    >>> MeshError("no mesh.").shell
    'no mesh.'
    """

    def __init__(self, *args: object, shell: str | None = None) -> None:
        super().__init__(*args)
        self._shell = shell

    @property
    def shell(self) -> str:
        """The message as the ``shardwise`` command prints it."""
        return str(self) if self._shell is None else self._shell


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
