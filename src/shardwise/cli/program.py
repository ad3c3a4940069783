"""``shardwise plan --model …`` / ``--function …``: plan a whole program and print the plans."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from shardwise._errors import ArgumentError, user_code_error
from shardwise._extras import require
from shardwise._model.op import MAX_DIMENSION
from shardwise.cli._common import console, print_json, table_format
from shardwise.cli._user_module import load_function
from shardwise.render.formats import Format, show
from shardwise.render.program import ops_view, plans_view

_ARRAY = re.compile(r"^\s*([A-Za-z]+\d*)\[([\d,\s]*)\]\s*$")

MAX_NESTING = 100
"""The deepest an argument's name may nest (``params.layer.w`` is 3 levels): far past real
programs, and far from the depth where tracing a pytree runs out of recursion (3000)."""


def parse_array(text: str, where: str) -> Any:
    """``"f32[256,1024]"`` → ``jax.ShapeDtypeStruct((256, 1024), float32)``."""
    import jax

    from shardwise._xla.dtypes import parse_dtype

    m = _ARRAY.match(text)
    if not m:
        raise ArgumentError(
            f"cannot read {where} {text!r}: write a dtype and a shape, e.g. f32[256,1024] "
            "(dtypes f16, bf16, f32, f64, i32, …)."
        )
    dtype = parse_dtype(m.group(1), f"cannot read {where} {text!r}: the dtype")
    digits = [d for d in m.group(2).replace(" ", "").split(",") if d]
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


def parse_batches(text: str, flag: str = "--sweep-batch") -> list[int]:
    """``--sweep-batch`` (or ``flag``): ``"256,1024"``, or ``"256..65536"`` for the powers of
    two from one to the other (each times the first)."""
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
            f"cannot read {flag} {text!r}: give sizes (256,1024,4096) or a range of powers "
            "of two (256..65536)."
        ) from None


def parse_args(items: list[str], fn: Callable[..., Any] | None = None) -> list[Any]:
    """``--args`` values (``x=f32[8,4]``, ``params.w1=f32[4,2]``, or a JSON file of them) as
    the positional arguments of ``fn``, each bound to the parameter of its name (in order of
    first appearance where ``fn`` takes ``*args`` or has no signature to read); or, given
    ``module:fn`` (``model.py:example``), the arguments that function returns."""
    made = [item for item in items if "=" not in item and ":" in item]
    if made:
        return _made_args(made[0], len(items))
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
            for k, v in raw.items():
                _put(named, [k], _tree(v, k), f"{item!r} gives {k}")
            continue
        name, eq, shape = item.partition("=")
        if not eq or not name:
            raise ArgumentError(
                f"cannot read --args {item!r}: write NAME=SHAPE, e.g. --args x=f32[256,1024] "
                "--args params.w1=f32[1024,4096], or give a JSON file."
            )
        _put(named, name.split("."), parse_array(shape, f"--args {name}"), f"--args {name}")
    return bind(fn, named) if fn is not None else list(named.values())


def _made_args(ref: str, given: int) -> list[Any]:
    """The arguments the user's function ``ref`` (``model.py:example``) returns: a tuple of
    them as the planned function takes them (arrays, Flax's boxed parameters, an NNX state,
    optimizer state), so that what they say about their layout is read."""
    if given > 1:
        raise ArgumentError(
            f"--args {ref} gives every argument (what that function returns), so it comes "
            "alone: drop the other --args, or return those arguments from it too."
        )
    fn = load_function(ref)
    try:
        made = fn()
    except (Exception, SystemExit) as e:
        fix = "--args module:fn calls fn() for the arguments: fix that function."
        raise user_code_error(e, f"your function {ref!r}", "called", fix) from e
    if not isinstance(made, tuple | list):
        raise ArgumentError(
            f"--args {ref} returned {type(made).__name__}; it must return a tuple of the "
            "planned function's arguments, e.g. return params, x."
        )
    return list(made)


def bind(fn: Callable[..., Any], named: dict[str, Any]) -> list[Any]:
    """The arguments ``named`` gives, in the order of ``fn``'s parameters of those names
    (those its ``*args`` takes after them, in the order given).

    >>> def f(params, x): ...
    >>> bind(f, {"x": 1, "params": 2})
    [2, 1]
    >>> bind(f, {"x": 1})
    Traceback (most recent call last):
    shardwise._errors.ArgumentError: --args gives no params; f takes params, x: ...
    >>> def g(params, x, *rest): ...
    >>> bind(g, {"x": 1, "mask": 3, "params": 2})  # (by name, then *rest in order)
    [2, 1, 3]
    """
    import inspect

    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return list(named.values())
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    names = ", ".join(p.name for p in positional)
    fn_name = getattr(fn, "__name__", "the function")
    unknown = [k for k in named if k not in {p.name for p in positional}]
    if any(p.kind is p.VAR_POSITIONAL for p in params):  # the rest go to *args, in order
        given = {k: v for k, v in named.items() if k not in unknown}
        return [*_in_order(positional, given, fn_name, names), *(named[k] for k in unknown)]
    keyword = [k for k in unknown if k in {p.name for p in params}]
    if keyword:
        raise ArgumentError(
            f"--args gives {', '.join(keyword)}, which {fn_name} takes by keyword only; --args "
            f"binds the parameters it takes by position ({names}): fix the others with "
            "functools.partial in your module."
        )
    if unknown:
        takes = f"it takes {names}: give --args NAME=SHAPE for each" if names else (
            "it takes no array arguments: plan a function of the arrays to lay out"
        )  # fmt: skip
        raise ArgumentError(
            f"--args gives {', '.join(unknown)}, but {fn_name} has no parameter of that name; "
            f"{takes}."
        )
    return _in_order(positional, named, fn_name, names)


def _in_order(positional: list[Any], named: dict[str, Any], fn_name: str, names: str) -> list[Any]:
    """The arguments ``named`` gives, in the order of the ``positional`` parameters."""
    out = []
    for p in positional:
        if p.name in named:
            out.append(named[p.name])
        elif p.default is p.empty:
            raise ArgumentError(
                f"--args gives no {p.name}; {fn_name} takes {names}: give --args {p.name}=SHAPE "
                "(e.g. f32[256,1024])."
            )
        else:
            break
    if len(out) < len(named):
        skipped = [k for k in named if all(k != p.name for p in positional[: len(out)])]
        raise ArgumentError(
            f"--args gives {', '.join(skipped)} after a parameter it leaves to its default; "
            f"{fn_name} takes {names}: give every parameter before them too."
        )
    return out


def _put(named: dict[str, Any], path: list[str], value: Any, given: str) -> None:
    """Put ``value`` at ``path`` (``params.w1`` → ``["params", "w1"]``) in the argument tree
    ``named``; refuse a path given twice, or an array and its part (``p`` and ``p.q``)."""
    *parents, leaf = path
    if len(parents) >= MAX_NESTING:
        raise _too_deep(parents[0])
    node = named
    for k, part in enumerate(parents):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            whole = ".".join(path[: k + 1])
            raise ArgumentError(
                f"{given}, a part of {whole}, but {whole} was already given as one array; an "
                f"argument is one array (--args {whole}=f32[…]) or a tree of arrays (--args "
                f"{'.'.join(path)}=f32[…]), not both: drop one."
            )
        node = child
    if leaf in node:
        name = ".".join(path)
        what = "a tree of arrays" if isinstance(node[leaf], dict) else "an array"
        raise ArgumentError(
            f"{given}, but {name} was already given ({what}); give each argument once: an "
            f"argument is one array (--args {name}=f32[…]) or a tree of arrays (--args "
            f"{name}.w=f32[…]), not both."
        )
    node[leaf] = value


def _too_deep(name: str) -> ArgumentError:
    return ArgumentError(
        f"--args {name[:40]!r} nests deeper than {MAX_NESTING} levels; give arguments nested "
        f"at most {MAX_NESTING} deep (params.w1 is 2)."
    )


def show_plans(report: Any, console: Console, fmt: Format | None = None) -> None:
    """The plans as a table, cheapest first, with what was chosen and why."""
    show(console, plans_view(report), fmt)


def show_ops(report: Any, console: Console, quiet: bool = False, fmt: Format | None = None) -> None:
    """One plan op by op (``quiet``: only the ops that cause collectives), then its memory."""
    show(console, ops_view(report, quiet), fmt)


def sweep_batches(given: dict[str, Any]) -> None:
    """``plan --model … --sweep-batch …``: plan the model at each batch size."""
    from shardwise._program.sweep import sweep
    from shardwise.cli._models import dims
    from shardwise.render.sweep import save_sweep, sweep_view

    if given["model"] is None or given["sweep_batch"] is None:
        raise ArgumentError(
            "--sweep-batch and --plot plan a built-in model across batch sizes: give --model "
            "and --sweep-batch (e.g. --sweep-batch 256..16777216), and --plot FILE for the "
            "picture."
        )
    if given["profile"] is None or given["mesh"] == "auto":
        raise ArgumentError(
            "a sweep plans for a mesh and a profile you name: give --mesh (e.g. "
            "data=16,model=16) and --profile (e.g. tpu-v5p)."
        )
    flags = {"--verify": "verify", "--tune": "tune", "--html": "html", "--fixed": "fixed",
             "--device-memory": "device_memory", "--emit": "emit"}  # fmt: skip
    unused = [flag for flag, key in flags.items() if given[key]]
    if unused:
        raise ArgumentError(
            f"a sweep only plans; it does not take {', '.join(unused)}. Plan one batch size "
            "without --sweep-batch for those."
        )
    if given["optimizer"] is not None or given["microbatches"] != 1:
        raise ArgumentError(
            "--sweep-batch plans the loss's SGD step at each batch size; it takes no "
            "--optimizer or --microbatches. Plan one batch size without --sweep-batch for "
            "those, or sweep the device count (--sweep-devices)."
        )
    out = console(stderr=given["json"])
    with out.status("planning") as status:
        result = sweep(
            given["model"],
            parse_batches(given["sweep_batch"]),
            mesh=given["mesh"],
            profile=given["profile"],
            train=given["train"],
            on_step=lambda k, n: status.update(f"planning batch size {k + 1}/{n}"),
            **dims(given),
        )
    show_sweep(result, given, out, sweep_view, save_sweep)


def show_sweep(
    result: Any, given: dict[str, Any], out: Console, view: Callable[[Any], Any],
    save: Callable[[Any, Any], Any],
) -> None:  # fmt: skip
    """A sweep's ``--plot`` (drawn by ``save``), then its ``--json`` or its table (``view``)."""
    if given["plot"] is not None:
        save(result, given["plot"])
    if given["json"]:
        print_json(result.to_json())
        return
    show(out, view(result), table_format(given["format"]))
    if given["plot"] is not None:
        out.print(f"wrote {given['plot']}")


def load_rules(text: str) -> tuple[tuple[str, Any], ...]:
    """``--rules``: logical axis rules, inline (``batch=data,embed=-,mlp=data+model``: ``-``
    for not split, ``+`` between the axes of one name) or a YAML file of MaxText's
    ``logical_axis_rules`` (a list of ``[name, axes]``, alone or under that key)."""
    from shardwise._model.logical import check_rules

    if text.endswith((".yml", ".yaml")):
        yaml = require("yaml", "reading a YAML file of rules")
        try:
            raw = yaml.safe_load(Path(text).read_text())
        except (OSError, yaml.YAMLError) as e:
            raise ArgumentError(f"cannot read the rules file {text!r}: {e}") from None
        raw = raw.get("logical_axis_rules") if isinstance(raw, dict) else raw
        if not isinstance(raw, list):
            raise ArgumentError(
                f"{text!r} has no logical_axis_rules list: write logical_axis_rules: "
                "[['batch', ['data']], ['mlp', ['model']]], as MaxText's configs do."
            )
        pairs = [(r[0], _axes(r[1])) if isinstance(r, list) and len(r) == 2 else r for r in raw]
        return check_rules(pairs, f"the rules in {text}")
    pairs = []
    for item in text.split(","):
        name, eq, axes = item.strip().partition("=")
        if not eq or not name:
            raise ArgumentError(
                f"cannot read --rules {item!r}: write NAME=AXES, e.g. --rules "
                "batch=data,embed=-,mlp=model (- for not split, data+fsdp for two axes), or "
                "give a YAML file of MaxText's logical_axis_rules."
            )
        pairs.append((name, _axes(None if axes in ("-", "None", "none") else axes.split("+"))))
    return check_rules(pairs, "--rules")


def _axes(raw: Any) -> Any:
    """A rule's axes from YAML or text: a list of axes as Flax writes them (``[]`` → ``None``,
    one axis → its name); anything else as it is, for :func:`check_rules` to judge."""
    from shardwise._model.logical import axes_of

    return axes_of(tuple(raw)) if isinstance(raw, list) else raw
