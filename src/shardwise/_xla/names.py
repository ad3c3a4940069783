"""Names from the user's code for a function's arrays: parameter names and pytree paths."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Sequence
from typing import Any

import jax


def positional_names(fn: Callable[..., Any]) -> list[str]:
    """The names of ``fn``'s parameters that take arguments by position (``[]`` where its
    signature cannot be read).

    >>> positional_names(lambda x, params, *, lr=0.1: None)
    ['x', 'params']
    """
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def top_names(fn: Callable[..., Any], count: int) -> list[str]:
    """A name for each of ``count`` arguments given to ``fn`` by position: its parameter's,
    ``args[k]`` past them (``*args``).

    >>> top_names(lambda x, mask, *rest: None, 3)
    ['x', 'mask', 'args[2]']
    """
    params = positional_names(fn)
    return [params[k] if k < len(params) else f"args[{k}]" for k in range(count)]


def argument_names(fn: Callable[..., Any], args: Sequence[Any]) -> list[str]:
    """A name for every leaf of ``args``: the parameter's name and the leaf's pytree path.

    >>> argument_names(lambda x, params: None, [1, {"w1": 2, "w2": 3}])
    ['x', "params['w1']", "params['w2']"]
    """
    names = []
    for base, arg in zip(top_names(fn, len(args)), args, strict=True):
        for path, _ in jax.tree_util.tree_flatten_with_path(arg)[0]:
            names.append(base + jax.tree_util.keystr(path))
    return names


_INDEX = re.compile(r"""\[(?:'([^']*)'|"([^"]*)"|(\d+))\]""")


def dotted(name: str) -> str:
    """``name`` (a pytree path as :func:`argument_names` writes it) with dots, as the command
    line's ``--args`` writes it.

    >>> dotted("params['w1']"), dotted("opt[0].mu['w']"), dotted("x")
    ('params.w1', 'opt.0.mu.w', 'x')
    """
    return _INDEX.sub(lambda m: "." + next(g for g in m.groups() if g is not None), name)


def find_name(names: Sequence[str], name: str) -> int | None:
    """The position among ``names`` of ``name``, written as they are (``params['w1']``) or
    with dots (``params.w1``, :func:`dotted`); ``None`` where none is, or more than one.

    >>> find_name(["x", "params['w1']"], "params.w1"), find_name(["x"], "y")
    (1, None)
    """
    if name in names:
        return list(names).index(name)
    found = [k for k, known in enumerate(names) if dotted(known) == dotted(name)]
    return found[0] if len(found) == 1 else None


def result_names(tree: Any) -> list[str]:
    """A name for every leaf of a function's result: ``result`` and the leaf's pytree path.

    >>> result_names((1, {"loss": 2}))
    ['result[0]', "result[1]['loss']"]
    >>> result_names(3)
    ['result']
    """
    return [
        "result" + jax.tree_util.keystr(path)
        for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]
    ]
