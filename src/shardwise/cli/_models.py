"""The built-in models' sizes on the command line (``plan --model …``): the options, and the
keyword arguments of :func:`shardwise.model` they make."""

from __future__ import annotations

from typing import Annotated, Any

import typer

WIDTHS = {"hidden": 1024, "ffn": 4096}
"""The mlp's and the transformer's width and MLP width where none is given."""

Batch = Annotated[int, typer.Option("--batch", min=1, help="Model batch size.")]
Seq = Annotated[int, typer.Option("--seq", min=1, help="Sequence length (transformer, llama).")]
Hidden = Annotated[
    int | None,
    typer.Option("--hidden", min=1, help="Model width (mlp, transformer: default 1024)."),
]
Ffn = Annotated[
    int | None,
    typer.Option("--ffn", min=1, help="MLP inner width (mlp, transformer: default 4096)."),
]
Heads = Annotated[
    int | None, typer.Option("--heads", min=1, help="Attention heads (transformer: default 8).")
]
Layers = Annotated[
    int | None, typer.Option("--layers", min=1, help="Layers (transformer: default 1).")
]
Size = Annotated[
    str | None,
    typer.Option(
        "--size",
        help="For --model llama: llama2-7b, llama2-13b, llama3-8b, llama3-70b or "
        "maxtext-<global_parameter_scale>; --hidden, --layers, … given replace its figures.",
    ),
]
KvHeads = Annotated[
    int | None,
    typer.Option("--kv-heads", min=1, help="For --model llama: key/value heads (default --heads)."),
]
Vocab = Annotated[
    int | None, typer.Option("--vocab", min=1, help="For --model llama: vocabulary size.")
]
Master = Annotated[
    bool,
    typer.Option(
        "--master-weights",
        help="For --model llama: float32 master copies of the weights, cast to --dtype "
        "where used (the step's gradients and update in float32).",
    ),
]

Remat = Annotated[
    str,
    typer.Option(
        "--remat",
        help="For --model llama: the layers' remat policy (none, full, minimal, save_dots: "
        "MaxText's names), or auto with --choose-mesh: plan each and keep the fastest that "
        "fits each split.",
    ),
]

Attention = Annotated[
    str,
    typer.Option(
        "--attention",
        help="For --model llama: dot_product (every score at once) or flash (a block of keys "
        "at a time: the memory of flash attention).",
    ),
]

Microbatches = Annotated[
    int,
    typer.Option(
        "--microbatches",
        min=1,
        help="With --optimizer: accumulate the gradient over this many equal parts of the "
        "batch, one after another (MaxText's gradient_accumulation_steps).",
    ),
]


def dims(given: dict[str, Any]) -> dict[str, Any]:
    """A built-in model's sizes from the command line, all but the batch: the ones given, and
    the mlp's and the transformer's widths where not."""
    keys = ("hidden", "ffn", "seq", "heads", "layers", "dtype", "size", "kv_heads", "vocab")
    out = {k: given[k] for k in keys if given[k] is not None}
    if given["model"] != "llama":
        out = WIDTHS | out
    if given["master"]:
        out["master"] = True
    if given["remat"] not in ("none", "auto"):
        out["remat"] = given["remat"]
    if given["attention"] != "dot_product":
        out["attention"] = given["attention"]
    if given["microbatches"] != 1:
        out["microbatches"] = given["microbatches"]
    return out
