"""A scan's moves counted as often as XLA runs them: a layer's slice moved in every
iteration, inside the while loop's body."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp

import shardwise

CPU = "cpu-2core"


def _while_bodies(hlo: str) -> set[str]:
    return set(re.findall(r"while\(.*?body=%?([\w.\-]+)", hlo))


def _computations_with(hlo: str, op: str) -> set[str]:
    """The computations of ``hlo`` with an ``op`` instruction in them."""
    found, current = set(), None
    for line in hlo.splitlines():
        head = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$", line)
        if head:
            current = head.group(1)
        elif f" {op}(" in line and current is not None:
            found.add(current)
    return found


def test_a_layers_gather_runs_in_every_iteration_and_is_counted_so():
    """A layer's slice of an FSDP-split stack, gathered whole for its matrix product: XLA's
    all-gather runs in the while loop's body, once per layer, and the plan counts it once per
    layer (it had counted it once per scan, which put Llama-3 8B's FSDP step about 7% short)."""

    def program(x, ws):
        return jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, ws)[0]

    S = jax.ShapeDtypeStruct
    args = (S((512, 64), "float32"), S((4, 64, 64), "float32"))
    plan = shardwise.plan(program, *args, mesh="x=8", profile=CPU, top=1,
                          fixed={"x": "x", "ws": ",x"})  # fmt: skip
    gathers = [c for c in plan.chosen.predicted.collectives
               if c.kind == "all-gather" and c.op_name == "scan slice"]  # fmt: skip
    assert gathers and all(c.repeat == 4 for c in gathers)
    hlo = plan.sharded().lower(*args).compile().as_text()
    assert _computations_with(hlo, "all-gather")
    assert _computations_with(hlo, "all-gather") <= _while_bodies(hlo)
