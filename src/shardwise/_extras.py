"""Optional dependencies. Each is imported through :func:`require`, which raises
:class:`~shardwise._errors.MissingExtraError` naming the extra to install (from the CLI and
from Python alike), or tested with :func:`available`.

>>> available("numpy"), available("no_such_module_here")
(True, False)
>>> require("no_such_module_here", "testing")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
shardwise._errors.MissingExtraError: testing needs no_such_module_here, which is not ...
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from shardwise._errors import MissingExtraError

EXTRAS = {
    "matplotlib": "pictures",
    "dask": "dask",
    "distributed": "dask",
    "zarr": "zarr",
    "torch": "bench",
    "yaml": "yaml",
}
"""The top-level module of each optional dependency → the extra of shardwise that installs it."""


def install_hint(module: str) -> str:
    """How to install the package that provides ``module``.

    >>> install_hint("matplotlib.figure")
    "pip install 'shardwise[pictures]'"
    """
    top = module.split(".")[0]
    extra = EXTRAS.get(top)
    return f"pip install 'shardwise[{extra}]'" if extra else f"pip install {top}"


def require(module: str, purpose: str) -> ModuleType:
    """Import ``module`` (``"dask.array"``), or say that ``purpose`` needs it and which extra
    installs it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        top = module.split(".")[0]
        raise MissingExtraError(
            f"{purpose} needs {top}, which is not installed; install it with "
            f"{install_hint(module)}."
        ) from None


def available(module: str) -> bool:
    """Whether ``module`` can be imported (without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent missing, or a module set to None
        return False
