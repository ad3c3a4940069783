"""``shardwise plan --model …`` / ``--function …``: plan a whole program and print the plans."""

from __future__ import annotations

import importlib
import importlib.util
import json
import re
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from shardwise._errors import ArgumentError
from shardwise._model.op import MAX_DIMENSION
from shardwise.render.program import ops_view, plans_view

_ARRAY = re.compile(r"^\s*([a-z]+)(\d+)\[([\d,\s]*)\]\s*$")
_KINDS = {"f": "float", "bf": "bfloat", "i": "int", "u": "uint"}

MAX_NESTING = 100
"""The deepest an argument's name may nest (``params.layer.w`` is 3 levels): far past real
programs, and far from the depth where tracing a pytree runs out of recursion (3000)."""


def parse_array(text: str, where: str) -> Any:
    """``"f32[256,1024]"`` → ``jax.ShapeDtypeStruct((256, 1024), float32)``."""
    import jax
    import numpy as np

    m = _ARRAY.match(text)
    if not m or m.group(1) not in _KINDS:
        raise ArgumentError(
            f"cannot read {where} {text!r}: write a dtype and a shape, e.g. f32[256,1024] "
            "(dtypes f16, bf16, f32, f64, i32, …)."
        )
    try:
        dtype = np.dtype(_KINDS[m.group(1)] + m.group(2)) if m.group(1) != "bf" else "bfloat16"
    except TypeError:
        raise ArgumentError(f"cannot read {where} {text!r}: no dtype {m.group(0)!r}.") from None
    digits = [d for d in m.group(3).replace(" ", "").split(",") if d]
    if any(len(d.lstrip("0")) > len(str(MAX_DIMENSION)) or int(d) > MAX_DIMENSION for d in digits):
        raise ArgumentError(
            f"cannot read {where} {text!r}: a size is over {MAX_DIMENSION:,} (2**63 - 1, the "
            "largest dimension XLA can represent); give smaller sizes."
        )
    return jax.ShapeDtypeStruct(tuple(int(d) for d in digits), dtype)


def _tree(raw: Any, where: str, depth: int = 1) -> Any:
    if isinstance(raw, str):
        return parse_array(raw, where)
    if depth >= MAX_NESTING and isinstance(raw, dict | list):
        raise _too_deep(where.split(".")[0].split("[")[0])
    if isinstance(raw, dict):
        return {k: _tree(v, f"{where}.{k}", depth + 1) for k, v in raw.items()}
    if isinstance(raw, list):
        return [_tree(v, f"{where}[{k}]", depth + 1) for k, v in enumerate(raw)]
    raise ArgumentError(f"cannot read {where}: {raw!r} is not a shape like f32[256,1024].")


def parse_batches(text: str) -> list[int]:
    """``--sweep-batch``: ``"256,1024"``, or ``"256..65536"`` for the powers of two from one to
    the other (each times the first)."""
    low, dots, high = text.partition("..")
    try:
        if dots:
            start, stop = int(low), int(high)
            if start < 1 or stop < start:
                raise ValueError
            out = [start]
            while out[-1] * 2 <= stop:
                out.append(out[-1] * 2)
            return out
        return [int(b) for b in text.split(",")]
    except ValueError:
        raise ArgumentError(
            f"cannot read --sweep-batch {text!r}: give batch sizes (256,1024,4096) or a range "
            "of powers of two (256..65536)."
        ) from None


def parse_args(items: list[str]) -> list[Any]:
    """``--args`` values (``x=f32[8,4]``, ``params.w1=f32[4,2]``, or a JSON file of them) as
    the function's positional arguments, in order of first appearance."""
    named: dict[str, Any] = {}
    for item in items:
        if item.endswith(".json"):
            try:
                raw = json.loads(Path(item).read_text())
            except (OSError, json.JSONDecodeError) as e:
                raise ArgumentError(f"cannot read the shapes file {item!r}: {e}.") from None
            except RecursionError:
                raise _too_deep(item) from None
            if not isinstance(raw, dict):
                raise ArgumentError(f"{item!r} must hold an object of name → shape.")
            named.update({k: _tree(v, k) for k, v in raw.items()})
            continue
        name, eq, shape = item.partition("=")
        if not eq or not name:
            raise ArgumentError(
                f"cannot read --args {item!r}: write NAME=SHAPE, e.g. --args x=f32[256,1024] "
                "--args params.w1=f32[1024,4096], or give a JSON file."
            )
        *path, leaf = name.split(".")
        if len(path) >= MAX_NESTING:
            raise _too_deep(path[0])
        node = named
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = parse_array(shape, f"--args {name}")
    return list(named.values())


def _too_deep(name: str) -> ArgumentError:
    return ArgumentError(
        f"--args {name[:40]!r} nests deeper than {MAX_NESTING} levels; give arguments nested "
        f"at most {MAX_NESTING} deep (params.w1 is 2)."
    )


def load_function(ref: str) -> Any:
    """``pkg.module:fn`` or ``path/file.py:fn`` as the function it names."""
    target, colon, attr = ref.rpartition(":")
    if not colon or not target or not attr:
        raise ArgumentError(
            f"--function {ref!r} does not name a function; write module:function, e.g. "
            "--function mypkg.models:loss or --function train.py:loss."
        )
    try:
        if target.endswith(".py"):
            spec = importlib.util.spec_from_file_location(Path(target).stem, target)
            if spec is None or spec.loader is None:
                raise ImportError(target)
            module = importlib.util.module_from_spec(spec)
            sys.path.insert(0, str(Path(target).resolve().parent))
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(target)
    except (ImportError, OSError) as e:
        raise ArgumentError(f"cannot import {target!r} for --function: {e}.") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ArgumentError(f"{target!r} has no function {attr!r}.")
    return fn


def show(report: Any, console: Console) -> None:
    """The plans as a table, cheapest first, with what was chosen and why."""
    console.print(plans_view(report))


def show_ops(report: Any, console: Console, quiet: bool = False) -> None:
    """One plan op by op (``quiet``: only the ops that cause collectives), then its memory."""
    console.print(ops_view(report, quiet))
