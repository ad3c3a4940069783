"""The options of ``shardwise plan`` that only a program's plan reads (``--model``,
``--function``), as the types ``plan`` takes them."""

from __future__ import annotations

from typing import Annotated

import typer

Rules = Annotated[
    str | None,
    typer.Option(
        "--rules",
        help="For a program: logical axis rules for the names its parameters are annotated "
        "with: batch=data,embed=-,mlp=model, or a YAML file of MaxText's logical_axis_rules.",
    ),
]

Respect = Annotated[
    str,
    typer.Option(
        "--respect",
        help="For a program: what every plan keeps of what the model says: none, "
        "annotations (its parameters' layouts), constraints (its sharding constraints) "
        "or names (only plans that rules over its logical names can write).",
    ),
]

ChooseMesh = Annotated[
    int | None,
    typer.Option(
        "--choose-mesh",
        min=1,
        help="For a program: split this many devices (of --profile) over --roles every "
        "way, plan each split and keep the fastest; the devices need not exist here.",
    ),
]

Roles = Annotated[
    str,
    typer.Option(
        "--roles",
        help="With --choose-mesh: the mesh axes, in order, named by MaxText's roles "
        "(data, fsdp, fsdp_transpose, sequence, context, tensor, expert).",
    ),
]

Donate = Annotated[
    str | None,
    typer.Option(
        "--donate",
        help="For a program: the arguments whose buffers its results may take, by "
        "position, as jax.jit's donate_argnums (0,1: a training step's parameters and "
        "optimizer state, written over as MaxText's step does).",
    ),
]

TimeLimit = Annotated[
    float | None,
    typer.Option(
        "--time-limit",
        min=1,
        help="For a program: seconds for each integer program (60 by default), and for "
        "pricing the layouts at least 120 (a mesh of four axes can take minutes).",
    ),
]

Emit = Annotated[
    str | None,
    typer.Option(
        "--emit",
        help="For a program: after the plan, print it as flax (logical axis rules), "
        "maxtext (a config block), regex (rules by path) or specs (each input's spec).",
    ),
]
