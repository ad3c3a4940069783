"""The user's module, imported for ``--function module:fn`` and ``--args module:fn``: found as
``python -m`` finds one, and what it raises said to be the user's."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shardwise._errors import ArgumentError, user_code_error

_IMPORT_FIX = (
    "shardwise imports the module to find the function: fix the module, and keep code that "
    'should run only as a script under `if __name__ == "__main__":`.'
)


def load_function(ref: str) -> Any:
    """``pkg.module:fn`` or ``path/file.py:fn`` as the function it names. A module is found
    as ``python -m`` finds one (the working directory first); what the module raises, or a
    ``sys.exit`` in it, is a :class:`UserCodeError` that says where."""
    target, colon, attr = ref.rpartition(":")
    if not colon or not target or not attr:
        raise ArgumentError(
            f"--function {ref!r} does not name a function; write module:function, e.g. "
            "--function mypkg.models:loss or --function train.py:loss."
        )
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            raise ArgumentError(
                f"cannot import {target!r} for --function: there is no such file; give the "
                "path of a Python file, or a module (mypkg.models:loss)."
            )
        module = _load_file(path, target)
    else:
        _a_module_name(ref, target)
        here = os.getcwd()
        if "" not in sys.path and here not in sys.path:  # as `python -m` has it
            sys.path.insert(0, here)
        module = _run_users(lambda: importlib.import_module(target), target, ref)
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ArgumentError(f"{target!r} has no function {attr!r}.")
    return fn


FILE_SUFFIXES = frozenset({
    "npy", "npz", "json", "yaml", "yml", "toml", "txt", "csv", "pkl", "pickle", "h5", "hdf5",
    "msgpack", "safetensors", "ckpt", "ipynb",
})  # fmt: skip
"""The endings of files that are not Python: a name that ends so, and is not a module, is
said to be a path."""


def _a_module_name(ref: str, target: str, missing: bool = False) -> None:
    """Refuse ``target`` of ``--function ref`` where it is a path, not a module: one with a
    folder in it, or the name of a file here; once no module of that name was found
    (``missing``), one that is not a dotted name or ends as a data file does (``a.npy``).
    Python imports a file ``my-module.py`` as ``my-module``, so that is tried first."""
    path = "/" in target or os.sep in target or Path(target).is_file()
    dotted = all(part.isidentifier() for part in target.split("."))
    data = target.rpartition(".")[2].lower() in FILE_SUFFIXES
    if not path and (not missing or (dotted and not data)):
        return
    raise ArgumentError(
        f"--function {ref} names {target!r}, a path but not a Python file (.py) or module: "
        "--function takes the function to plan, as module:function (--function "
        "mypkg.models:loss) or the path of a Python file and its function (--function "
        "train.py:loss); the shapes of its arguments go in --args."
    )


def _load_file(path: Path, target: str) -> Any:
    """The module of the Python file at ``path``, run once a process however often it is
    named (``--function model.py:f --args model.py:example``: one module, so one class of
    each), as a ``python`` script's imports are: it is put in ``sys.modules`` under its stem,
    where that name is free (so that the user's own ``import model`` finds it too), else
    under a name of its own path."""
    resolved = path.resolve()
    for name in (path.stem, f"{path.stem}@{resolved}"):
        known = sys.modules.get(name)
        if known is None:
            break
        if _file_of(known) == resolved:
            return known
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ArgumentError(f"cannot import {target!r} for --function: not a Python file.")
    module, loader = importlib.util.module_from_spec(spec), spec.loader
    sys.path.insert(0, str(resolved.parent))
    sys.modules[name] = module  # (before it runs, as import does: dataclasses look it up)
    try:
        _run_users(lambda: loader.exec_module(module), target)
    except BaseException:
        sys.modules.pop(name, None)  # a module that failed is not imported, as import has it
        raise
    return module


def _file_of(module: Any) -> Path | None:
    """The resolved path of the file ``module`` was loaded from, or ``None``."""
    file = getattr(module, "__file__", None)
    return Path(file).resolve() if isinstance(file, str) else None


def _run_users(body: Callable[[], Any], target: str, ref: str | None = None) -> Any:
    """``body()``, which imports the user's module ``target`` (of ``--function ref``, where
    given): whatever it raises is theirs, said so with where, except that ``target`` itself
    cannot be found."""
    what = f"your module {target!r}"
    try:
        return body()
    except ModuleNotFoundError as e:
        missing = e.name or ""
        if missing and (target == missing or target.startswith(missing + ".")):
            if ref is not None:
                _a_module_name(ref, target, missing=True)
            raise ArgumentError(
                f"cannot import {target!r} for --function: {e}. Run shardwise from the "
                "folder that holds it (or add that folder to PYTHONPATH), or give its file: "
                "--function path/to/file.py:fn."
            ) from None
        raise user_code_error(e, what, "imported", _IMPORT_FIX) from e
    except (Exception, SystemExit) as e:
        raise user_code_error(e, what, "imported", _IMPORT_FIX) from e
