"""Names from the user's code for a function's arrays: parameter names and pytree paths."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import jax


def argument_names(fn: Callable[..., Any], args: Sequence[Any]) -> list[str]:
    """A name for every leaf of ``args``: the parameter's name and the leaf's pytree path.

    >>> argument_names(lambda x, params: None, [1, {"w1": 2, "w2": 3}])
    ['x', "params['w1']", "params['w2']"]
    """
    try:
        params = [
            p.name
            for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        params = []
    names = []
    for k, arg in enumerate(args):
        base = params[k] if k < len(params) else f"args[{k}]"
        for path, _ in jax.tree_util.tree_flatten_with_path(arg)[0]:
            names.append(base + jax.tree_util.keystr(path))
    return names


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
