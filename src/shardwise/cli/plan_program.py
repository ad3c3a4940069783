"""``shardwise plan --model/--function``: plan a whole program, on a mesh given or on the best
split of a number of devices (``--choose-mesh``)."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from shardwise._errors import ArgumentError
from shardwise._model.units import parse_bytes
from shardwise.cli._common import (
    check_out,
    check_plot,
    console,
    print_json,
    setup_devices,
    table_format,
    write_file,
)
from shardwise.render.formats import Format, show


def program(given: dict[str, Any]) -> None:
    """``plan --model/--function``: plan a whole program."""
    from shardwise._program.emit import emitted
    from shardwise.cli.program import show_ops, show_plans, sweep_batches

    if given["model"] is not None and given["function"] is not None:
        raise ArgumentError("give --model or --function, not both.")
    _no_einsum(given)
    if given["plot"] is not None:  # said before the sweep, not after it
        check_plot(Path(given["plot"]))
    if given["html"] is not None:
        check_out(Path(given["html"]), "--html")
    if given["sweep_devices"] is not None:
        sweep_device_counts(given)
        return
    if given["sweep_batch"] is not None or given["plot"] is not None:
        sweep_batches(given)
        return
    fmt = table_format(given["format"])
    out = console(stderr=given["json"])
    # the user's module and function may print: that goes to standard error while they run,
    # so that standard output holds only the result (the JSON of --json)
    with contextlib.redirect_stdout(sys.stderr):
        report, name, choice = _planned(given, out)
    text = None if given["emit"] is None else emitted(report, given["emit"])
    if given["html"] is not None:
        write_file(given["html"], report.to_html())
    if given["json"]:
        doc = report.to_json()
        doc["program"] = name
        # what the program is: a training step with --train, whether planned from the loss
        # (plain SGD) or, with --optimizer, the model's whole step, planned as it is (its plan's
        # own "train" had said false, as for a forward pass)
        doc["train"] = given["train"]
        doc["optimizer"] = (given["optimizer"] or "sgd") if given["train"] else None
        if choice is not None:
            doc["mesh_choice"] = choice.to_json()
        if text is not None:
            doc["emit"] = {"form": given["emit"], "text": text}
        print_json(doc)
        return
    if choice is not None:
        show_choice(choice, out, fmt)
    show_plans(report, out, fmt)
    show_ops(report.report(), out, quiet=given["quiet"], fmt=fmt)
    if text is not None:
        out.print("\n" + text, end="", markup=False, highlight=False, soft_wrap=True)
    if given["html"] is not None:
        out.print(f"wrote {given['html']}")


def _no_einsum(given: dict[str, Any]) -> None:
    """Refuse an einsum (or its ``--shapes``) given with a program, which would be left out:
    most often a second value after one ``--args``, which the einsum's place took."""
    flag = "--model" if given["model"] is not None else "--function"
    equation = given["equation"]
    if equation is not None and flag == "--function" and "=" in equation:
        raise ArgumentError(
            f"plan was given {equation!r} where an einsum goes: each --args takes one value, "
            f"so write --args before each: --args {equation}."
        )
    if equation is not None or given["shapes"] is not None:
        what = f"the einsum {equation!r}" if equation is not None else "--shapes"
        raise ArgumentError(
            f"plan was given {what} and {flag}; it plans an einsum (an equation and --shapes) "
            f"or a program ({flag}), not both: drop one."
        )


def _planned(given: dict[str, Any], out: Console) -> tuple[Any, str, Any]:
    """The program plan that ``given`` asks for, the program's name, and the mesh choice
    (``None`` unless ``--choose-mesh``)."""
    import shardwise
    from shardwise._program.models import model as built_in
    from shardwise._program.stages import told
    from shardwise.cli._models import dims
    from shardwise.cli._user_module import load_function
    from shardwise.cli.program import load_rules, parse_args

    train = given["train"] and given["optimizer"] is None  # (a step with its optimizer: as is)
    # the devices first: the user's module, or the function --args names, may start JAX
    # (an array made at import, a random key), after which their count is fixed
    runs_here = given["verify"] or given["tune"] or given["mesh"] == "auto"
    if given["choose_mesh"] is None and (runs_here or given["profile"] is None):
        setup_devices(given["devices"])
    if given["model"] is not None:
        fn, model_args = built_in(given["model"], batch=given["batch"], train=given["train"],
                                  optimizer=given["optimizer"], **dims(given))  # fmt: skip
        fn_args = list(model_args)
        name = given["model"]
    elif given["optimizer"] is not None:
        raise ArgumentError("--optimizer builds a built-in model's training step: give --model.")
    else:
        fn = load_function(given["function"])
        fn_args = parse_args(given["args"] or [], fn)
        name = given["function"]
    if given["choose_mesh"] is not None:
        choice = _choose(given, fn, fn_args, train, out)
        return choice.best, name, choice
    if given["remat"] == "auto":
        raise ArgumentError(
            "--remat auto chooses a remat policy with the mesh: give --choose-mesh N, or "
            "name a policy (none, full, minimal, save_dots) for --mesh."
        )
    fixed: dict[str, str] = {}
    for item in given["fixed"] or []:
        key, eq, value = item.rpartition("=")  # (a spec has no '=', a name's key may)
        if not eq or not key:
            raise ArgumentError(f"cannot read --fixed {item!r}: write NAME=SPEC, e.g. x=data.")
        if key in fixed:
            raise ArgumentError(f"--fixed pins {key} twice ({fixed[key]!r}, {value!r}); pin "
                                "it once.")  # fmt: skip
        fixed[key] = value
    memory = given["device_memory"]
    # by default the profile's memory: the fastest plan that fits, or said that none does
    limit = "device" if memory is None else parse_bytes(memory, "--device-memory")
    with out.status("planning") as status, told(status.update):  # (each stage as it starts)
        report = shardwise.plan(
            fn,
            *fn_args,
            mesh=given["mesh"],
            profile=given["profile"],
            budget=limit,
            fixed=fixed,
            train=train,
            top=given["top"],
            rules=None if given["rules"] is None else load_rules(given["rules"]),
            respect=given["respect"],
            donate_argnums=donated(given["donate"]),
            **({} if given["time_limit"] is None else {"time_limit": given["time_limit"]}),
        )
        if given["verify"] or given["tune"]:
            measure = report.tune if given["tune"] else report.verify
            report = measure(
                repeat=given["repeat"],
                on_step=lambda k, n: status.update(f"compiling and timing plan {k + 1}/{n}"),
            )
    return report, name, None


def _choose(given: dict[str, Any], fn: Any, fn_args: list[Any], train: bool, out: Console) -> Any:
    """``--choose-mesh N``: the best split of N devices over ``--roles``
    (:func:`shardwise.choose_mesh`), with the model's batch, sequence, heads and MLP width
    where a built-in model gives them."""
    import shardwise

    asked = [k for k in ("verify", "tune", "fixed", "device_memory", "rules", "time_limit")
             if given[k]]  # fmt: skip
    if given["mesh"] != "auto" or asked:
        clash = "--mesh" if given["mesh"] != "auto" else "--" + asked[0].replace("_", "-")
        raise ArgumentError(
            f"--choose-mesh chooses the mesh for devices that need not exist here; {clash} "
            "does not go with it. Plan the mesh it chooses with --mesh to use that."
        )
    if given["profile"] is None:
        raise ArgumentError(
            "--choose-mesh plans for devices you may not have: give their --profile "
            "(tpu-v5p, h100, … or a calibrated one)."
        )
    roles = _roles(given)
    known = hints(given)
    with out.status("choosing the mesh") as status:
        return shardwise.choose_mesh(
            fn, fn_args, given["choose_mesh"], given["profile"], train=train,
            roles=roles, top=given["top"], batch=known.get("batch"), seq=known.get("seq"),
            heads=known.get("heads"), ffn=known.get("ffn"), variants=_remats(given),
            on_step=lambda k, n: status.update(f"planning mesh {k + 1}/{n}"),
            donate_argnums=donated(given["donate"]),
        )  # fmt: skip


def donated(text: str | None) -> tuple[int, ...]:
    """``--donate 0,1`` as argument positions.

    >>> donated("0, 1"), donated(None)
    ((0, 1), ())
    """
    if text is None:
        return ()
    try:
        return tuple(int(k) for k in text.split(","))
    except ValueError:
        raise ArgumentError(
            f"cannot read --donate {text!r}: give argument positions, e.g. 0,1."
        ) from None


def _remats(given: dict[str, Any]) -> dict[str, Any] | None:
    """``--remat auto``: the built-in Llama under each remat policy, by name; ``None`` for
    one policy."""
    from shardwise._program.llama import REMAT
    from shardwise._program.models import remat_variants
    from shardwise.cli._models import dims

    if given["remat"] != "auto":
        return None
    if given["model"] != "llama":
        raise ArgumentError("--remat auto chooses the layers' remat policy of --model llama.")
    return remat_variants("llama", tuple(REMAT), batch=given["batch"], train=given["train"],
                          optimizer=given["optimizer"], **dims(given))  # fmt: skip


def hints(given: dict[str, Any]) -> dict[str, int | None]:
    """What a built-in model tells the mesh search: its batch, sequence, query heads and MLP
    width (a split that does not divide them is not planned); nothing for ``--function``."""
    from shardwise._program.llama import sized
    from shardwise._program.models import HEADS
    from shardwise.cli._models import dims

    model = given["model"]
    if model is None:
        return {}
    batch = given["batch"] // given["microbatches"]  # (what each part splits)
    if model == "llama":
        keys = ("hidden", "ffn", "heads", "layers", "kv_heads", "vocab")
        size = sized(given["size"], **{k: given[k] for k in keys})
        return {"batch": batch, "seq": given["seq"], "heads": size.heads, "ffn": size.ffn}
    ffn = dims(given)["ffn"]  # (the width the model is built with)
    if model == "transformer":
        heads = given["heads"] or HEADS
        return {"batch": batch, "seq": given["seq"], "heads": heads, "ffn": ffn}
    return {"batch": batch, "ffn": ffn}


def show_choice(choice: Any, out: Console, fmt: Format | None) -> None:
    """The meshes planned, best first, then why the others were not."""
    from shardwise.render.program import choice_notes, choice_table

    show(out, choice_table(choice), fmt)
    for line in choice_notes(choice):
        out.print(line)


def sweep_device_counts(given: dict[str, Any]) -> None:
    """``plan --model … --sweep-devices …``: choose the mesh at each device count."""
    from shardwise._program.device_sweep import sweep_devices
    from shardwise.cli._models import dims
    from shardwise.cli.program import parse_batches, show_sweep
    from shardwise.render.sweep import device_sweep_view, save_device_sweep

    if given["model"] is None or given["profile"] is None:
        raise ArgumentError(
            "--sweep-devices chooses a built-in model's mesh at each device count of a "
            "profile: give --model and --profile (e.g. --model llama --profile tpu-v5p)."
        )
    flags = {"--mesh": given["mesh"] != "auto", "--sweep-batch": given["sweep_batch"],
             "--choose-mesh": given["choose_mesh"], "--verify": given["verify"],
             "--tune": given["tune"], "--html": given["html"], "--fixed": given["fixed"],
             "--emit": given["emit"]}  # fmt: skip
    unused = [flag for flag, value in flags.items() if value]
    if unused:
        raise ArgumentError(
            f"--sweep-devices chooses the mesh at each device count; it does not take "
            f"{', '.join(unused)}."
        )
    out = console(stderr=given["json"])
    roles = _roles(given)
    with out.status("planning") as status:
        result = sweep_devices(
            given["model"], parse_batches(given["sweep_devices"], "--sweep-devices"),
            profile=given["profile"], batch=given["batch"], train=given["train"],
            optimizer=given["optimizer"], roles=roles, remat=given["remat"],
            on_step=lambda k, n: status.update(f"choosing the mesh of device count {k + 1}/{n}"),
            **{k: v for k, v in dims(given).items() if k != "remat"},
        )  # fmt: skip
    show_sweep(result, given, out, device_sweep_view, save_device_sweep)


def _roles(given: dict[str, Any]) -> tuple[str, ...]:
    """``--roles``: the mesh axes' names, in order."""
    return tuple(r.strip() for r in given["roles"].split(",") if r.strip())
