"""Gradient accumulation: an AdamW step over microbatches is the full batch's step, holds one
microbatch's activations (predicted as XLA holds them), and plans, runs and compiles as
predicted."""

import dataclasses

import jax
import numpy as np
import pytest
from typer.testing import CliRunner

import shardwise
from shardwise._errors import ArgumentError
from shardwise._model.profile import BUILTIN
from shardwise.cli import app

CPU = BUILTIN["cpu-2core"]
TINY = dict(hidden=32, layers=2, heads=4, kv_heads=2, ffn=64, vocab=64, dtype="float32")
DIMS = dict(hidden=64, layers=2, heads=4, kv_heads=2, ffn=256, vocab=128, dtype="float32")


def _real(args, vocab):
    rng = np.random.default_rng(3)

    def one(a):
        if a.dtype == np.int32:
            return rng.integers(0, vocab, a.shape).astype(np.int32) if a.shape else np.int32(3)
        return (0.02 * rng.standard_normal(a.shape)).astype(a.dtype)

    return jax.tree.map(one, args)


def test_microbatches_give_the_full_batchs_step_and_the_plan_runs_it():
    full, args = shardwise.model("llama", batch=8, seq=8, train=True, optimizer="adamw", **TINY)
    step, same = shardwise.model("llama", batch=8, seq=8, train=True, optimizer="adamw",
                                 microbatches=4, **TINY)  # fmt: skip
    assert jax.tree.map(lambda a: (a.shape, a.dtype), same) == jax.tree.map(
        lambda a: (a.shape, a.dtype), args
    )
    real = _real(args, TINY["vocab"])
    want = jax.jit(full)(*real)
    got = jax.jit(step)(*real)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    plan = shardwise.plan(step, *args, mesh="data=2,model=4", profile=CPU, top=1)
    # (the tiny model's search keeps everything whole: the data-parallel plan moves the parts)
    ran = plan.sharded("data-parallel")(*real)
    for a, b in zip(jax.tree.leaves(ran), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
    some = dataclasses.replace(plan, plans=(plan.get("data-parallel"),))
    (checked,) = some.verify(repeat=1).plans
    assert checked.predicted.collectives
    assert checked.verified.collectives_match and checked.verified.sources_match


def test_microbatches_hold_less_as_xla_does():
    """Predicted memory falls with the microbatch, within 20% of what XLA's compiled program
    holds, at the same FLOPs."""
    held = {}
    for k in (1, 4):
        step, args = shardwise.model("llama", batch=16, seq=64, train=True, optimizer="adamw",
                                     microbatches=k, **DIMS)  # fmt: skip
        plan = shardwise.plan(step, *args, mesh="data=2,model=4", profile=CPU, top=1)
        zeros = jax.tree.map(lambda a: np.zeros(a.shape, a.dtype), args)
        stats = plan.sharded().lower(*zeros).compile().memory_analysis()
        xla = (stats.argument_size_in_bytes + stats.output_size_in_bytes
               + stats.temp_size_in_bytes - stats.alias_size_in_bytes)  # fmt: skip
        predicted = plan.chosen.predicted
        held[k] = (predicted.memory_bytes, xla, predicted.flops)
    assert held[1][0] > 1.5 * held[4][0]
    assert held[1][1] > 1.5 * held[4][1]
    for k, (mine, xla, _) in held.items():
        # (the whole batch's chosen plan: 1.14x XLA's on jaxlib 0.10.2; 1.17x on 0.12.1,
        # whose XLA holds 0.4 MB less in its heap, of which the prediction follows 0.25)
        assert 0.85 < mine / xla < 1.2, (k, held)
    assert held[4][2] == pytest.approx(held[1][2], rel=0.01)


def test_microbatches_that_do_not_divide_the_batch_or_have_no_optimizer_are_refused():
    with pytest.raises(ArgumentError, match="does not divide the batch of 8"):
        shardwise.model("llama", batch=8, seq=8, train=True, optimizer="adamw", microbatches=3,
                        **TINY)  # fmt: skip
    with pytest.raises(ArgumentError, match="give optimizer='adamw'"):
        shardwise.model("llama", batch=8, seq=8, train=True, microbatches=2, **TINY)
    given = ["plan", "--model", "llama", "--batch", "8", "--seq", "8", "--hidden", "32",
             "--layers", "2", "--heads", "4", "--kv-heads", "2", "--ffn", "64", "--vocab",
             "64", "--train", "--microbatches", "2", "--mesh", "data=2"]  # fmt: skip
    result = CliRunner().invoke(app, given)
    assert result.exit_code == 2, result.output
    assert "--optimizer adamw --train" in result.output
    swept = [*given[:-2], "--optimizer", "adamw", "--mesh", "data=2", "--profile", "tpu-v5p",
             "--sweep-batch", "8,16"]  # fmt: skip
    result = CliRunner().invoke(app, swept)
    assert result.exit_code == 2, result.output
    assert "takes no --optimizer or --microbatches" in " ".join(result.output.split())
