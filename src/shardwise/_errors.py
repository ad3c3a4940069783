"""One exception family for everything a user can get wrong.

Every error says what was given, what is wrong with it and how to fix it.
Each subclass also derives from the standard exception that fits, so code that
already catches ``ValueError`` or ``TypeError`` keeps working.
"""

from __future__ import annotations

import difflib
import enum
import functools
import os
import warnings
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any, Final, Literal, TypeVar

T = TypeVar("T")


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


class ShardwiseWarning(UserWarning):
    """Something shardwise was given could not be used and it carried on without it (a
    calibrated profile it could not read, for instance); the message says what was set
    aside, what was used instead, and how to fix it."""


class MiscompileError(ShardwiseError, RuntimeError):
    """The compiled program would return a wrong result (XLA dropped a sum it needs), or a
    result failed its check against NumPy; shardwise returns nothing from it."""


class UserCodeError(ShardwiseError, RuntimeError):
    """The user's own code raised an exception (or called ``sys.exit``) while shardwise ran
    it: the module that ``--function`` names, as shardwise imported it, or a function, as
    shardwise traced it. The message says where; the original exception is the
    ``__cause__``."""


_LIBRARIES = frozenset({"shardwise", "jax", "jaxlib", "numpy", "ml_dtypes", "opt_einsum"})
"""Top-level packages whose frames are never the user's code in a traceback."""

_STDLIB = os.path.dirname(os.__file__) + os.sep


def _is_library(frame: FrameType) -> bool:
    module = str(frame.f_globals.get("__name__", ""))
    if module.partition(".")[0] in _LIBRARIES:
        return True
    file = frame.f_code.co_filename
    return file.startswith("<frozen ") or (file.startswith(_STDLIB) and "-packages" not in file)


def _shown(file: str) -> str:
    """``file`` relative to the working directory where it lies below it."""
    try:
        rel = os.path.relpath(file)
    except ValueError:  # another drive
        return file
    return file if rel.startswith("..") else rel


def user_frame(exc: BaseException) -> str | None:
    """Where in the user's code ``exc`` was raised, as ``file:line (in function)``: the
    innermost frame of its traceback outside shardwise, JAX, NumPy and Python's own library
    (for a ``SyntaxError``, the place it names); ``None`` when no frame is the user's."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{_shown(exc.filename)}:{exc.lineno}"
    tb, found = exc.__traceback__, None
    while tb is not None:
        if not _is_library(tb.tb_frame):
            found = tb
        tb = tb.tb_next
    if found is None:
        return None
    code = found.tb_frame.f_code
    return f"{_shown(code.co_filename)}:{found.tb_lineno} (in {code.co_name})"


def user_code_error(exc: BaseException, what: str, doing: str, fix: str) -> UserCodeError:
    """``exc``, raised by the user's code, as a :class:`UserCodeError` that says whose code
    raised it, where, and what it said; raise it ``from exc``.

    Args:
        exc: what the user's code raised.
        what: the user's code, e.g. ``"your module 'mypkg.model'"``.
        doing: what shardwise was doing with it, e.g. ``"imported"``.
        fix: the sentence that ends the message, saying what to change.

    >>> str(user_code_error(KeyError("w1"), "your function 'f'", "traced", "Fix it."))
    "your function 'f' raised KeyError while shardwise traced it: 'w1'. Fix it."
    """
    where = user_frame(exc)
    at = f" at {where}" if where else ""
    if isinstance(exc, SystemExit):
        text = f"{what} called sys.exit({exc.code!r}){at} while shardwise {doing} it"
    elif isinstance(exc, SyntaxError):
        text = f"{what} has a syntax error{at}: {exc.msg}"
    else:
        said = str(exc).strip()
        text = f"{what} raised {type(exc).__name__}{at} while shardwise {doing} it"
        text += f": {said}" if said else ""
    return UserCodeError(f"{text.rstrip('.')}. {fix}")


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


def as_users(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """``fn``, whose exceptions while shardwise traces it (and ``sys.exit``) are raised as
    the user's own, with where in their code: a :class:`UserCodeError` from the original.
    shardwise's own errors (``fn`` may call shardwise) pass unchanged."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (ShardwiseError, KeyboardInterrupt, GeneratorExit):
            raise
        except BaseException as e:  # (SystemExit, and a class of the user's own of it)
            fix = (
                "Planning traces the function once with abstract arrays of the arguments' "
                "shapes: fix the function, or the shapes it was given."
            )
            raise user_code_error(e, f"your function {name!r}", "traced", fix) from e

    return call


def check_count(name: str, value: object) -> None:
    """Refuse ``value`` for ``name`` unless it is a whole number of at least 1 (a bool is not).

    >>> check_count("repeat", 0)
    Traceback (most recent call last):
    shardwise._errors.ArgumentError: repeat=0; it must be a whole number of at least 1.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ArgumentError(f"{name}={value!r}; it must be a whole number of at least 1.")
