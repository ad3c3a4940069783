"""Predicted collectives against the compiled HLO's metadata: each compiled collective must
belong to the op and the user's source line the plan gives it, where XLA combines some."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import pytest

import shardwise
from shardwise._model.collective import Collective
from shardwise._program.attribution import _ops
from shardwise._program.attribution import attributed as _attributed
from shardwise._xla.hlo import collectives

AR, AG = "all-reduce", "all-gather"


def attributed(said, hlo):
    """:func:`attributed` of collectives written as (kind, axes, bytes, op, ``file:line``)."""

    def made(items):
        return [Collective(k, a, b, op_name=op, source=src) for k, a, b, op, src in items]

    return _attributed(made(said), made(hlo))


M, D = ("model",), ("data",)


def test_op_names_of_plain_and_combined_collectives():
    assert _ops("jit(f)/jvp()/dot_general") == {"dot_general"}
    assert _ops("jit(f)/(jvp()/reduce_sum:transpose(jvp())/dot_general)") == {
        "reduce_sum",
        "dot_general",
    }
    assert _ops("jit(f)/while/body/(a/dot_general:b/sharding_constraint)") == {
        "dot_general",
        "sharding_constraint",
    }
    assert _ops("") == {""}


def test_one_to_one_matches_and_a_wrong_line_or_op_does_not():
    said = [(AR, M, 8, "dot_general", "m.py:3"), (AG, D, 16, "dot_general", "m.py:5")]
    hlo = [
        (AR, M, 8, "jit(f)/dot_general", "/x/m.py:3 (f)"),
        (AG, D, 16, "jit(f)/sharding_constraint", "/x/m.py:5 (f)"),
    ]
    assert attributed(said, hlo)
    assert not attributed(said, [hlo[0], (AG, D, 16, "jit(f)/sharding_constraint", "m.py:6")])
    assert not attributed(said, [(AR, M, 8, "jit(f)/reduce_sum", "m.py:3"), hlo[1]])
    # the right op and line, the wrong axes
    assert not attributed(said, [(AR, D, 8, "jit(f)/dot_general", "m.py:3"), hlo[1]])
    # one predicted collective that never came
    assert not attributed(said, hlo[:1])
    # one that came unpredicted
    assert not attributed(said[:1], hlo)


def test_combined_collectives_stand_for_their_parts():
    said = [
        (AR, D, 4, "reduce_sum", "loss.py:9"),
        (AR, D, 100, "dot_general", "m.py:3"),
        (AR, D, 100, "dot_general", "m.py:4"),
        (AR, D, 100, "dot_general", "m.py:5"),
    ]
    # XLA names each op once: three dots summed together read as one dot_general
    hlo = [
        (AR, D, 4, "jit(f)/reduce_sum", "loss.py:9 (loss)"),
        (AR, D, 300, "jit(f)/transpose(jvp())/dot_general", "m.py:4 (f)"),
    ]
    assert attributed(said, hlo)
    mixed = [(AR, D, 104, "jit(f)/(jvp()/reduce_sum:jvp()/dot_general)", "loss.py:9"),
             (AR, D, 200, "jit(f)/dot_general", "m.py:5")]  # fmt: skip
    assert attributed(said, mixed)
    # the combined one's line must be one of its parts'
    assert not attributed(said, [hlo[0], (AR, D, 300, "jit(f)/dot_general", "m.py:7")])
    # a combined reduce_sum and dot cannot stand for two dots
    assert not attributed(
        said,
        [
            (AR, D, 200, "jit(f)/(a/reduce_sum:b/dot_general)", "m.py:3"),
            *hlo[:1],
            (AR, D, 100, "jit(f)/dot_general", "m.py:5"),
        ],
    )


@pytest.mark.parametrize("every", [True, False])
def test_a_combined_collective_named_after_its_first_part_alone(monkeypatch, every):
    # jaxlib 0.9's XLA names an all-reduce combined from a sum and two dots after the sum alone
    # (jaxlib 0.10's lists every part): correct plans had been reported "ops/lines NO" there
    from shardwise._program import attribution

    monkeypatch.setattr(attribution, "combined_names_every_part", lambda: every)
    said = [(AR, D, 4, "reduce_sum", "loss.py:9"), (AR, D, 100, "dot_general", "m.py:3"),
            (AR, D, 100, "dot_general", "m.py:4")]  # fmt: skip
    first = [(AR, D, 204, "jit(f)/jvp()/reduce_sum", "loss.py:9 (loss)")]
    assert attributed(said, first) is not every  # (where XLA names every part, it is wrong)
    # the one name must still be one of the parts', and its line one of theirs
    assert not attributed(said, [(AR, D, 204, "jit(f)/mul", "loss.py:9 (loss)")])
    assert not attributed(said, [(AR, D, 204, "jit(f)/jvp()/reduce_sum", "loss.py:7 (loss)")])


@pytest.mark.parametrize("after_operand", [True, False])
def test_a_move_named_after_where_its_array_was_laid_out(monkeypatch, after_operand):
    # jaxlib 0.12.1's XLA names an MLP training step's gather of the cotangent for the dot at
    # m.py:44 after the loss's line, where the cotangent was made in its layout (0.10.2's after
    # m.py:44): correct plans had been reported "ops/lines NO" there
    from shardwise._model.cost import PredictedCollective
    from shardwise._program import attribution

    monkeypatch.setattr(attribution, "moves_named_after_operand", lambda: after_operand)
    said = [PredictedCollective(AG, M, 64, op_name="dot_general", source="m.py:44",
                                operand_source="loss.py:81")]  # fmt: skip

    def hlo(line):
        return [Collective(AG, M, 64, op_name="jit(f)/sharding_constraint", source=line)]

    assert _attributed(said, hlo("/src/m.py:44 (f)"))  # (a later step of the move is)
    assert _attributed(said, hlo("/src/loss.py:81 (loss)")) is after_operand
    assert not _attributed(said, hlo("/src/loss.py:80 (loss)"))
    # named after another dot at the operand's line: that dot's, not this move's
    other = [Collective(AG, M, 64, op_name="jit(f)/dot_general", source="/src/loss.py:81 (loss)")]
    assert not _attributed(said, other)


def test_an_array_a_body_takes_is_laid_out_where_the_body_is_entered():
    """The plan's program lays out again each array a scan's body takes (its carry, a weight)
    as the body starts, under the scan's line: jaxlib 0.12.1 names a move of the carry for a
    dot in the body after the scan's line. One the body makes is laid out where it is made."""
    import inspect

    from shardwise._program.explain import laid_out_at
    from shardwise._program.graph import read_jaxpr

    def f(x, w):
        h = x * 2.0

        def body(c, _):
            y = c @ w
            return jnp.tanh(y) @ w, None

        return jax.lax.scan(body, h, None, length=3)[0]

    first = inspect.getsourcelines(f)[1]
    at = {k: f"{__file__.rsplit('/', 1)[-1]}:{first + k}" for k in (1, 4, 5, 7)}
    g = read_jaxpr(jax.make_jaxpr(f)(jnp.ones((4, 8)), jnp.ones((8, 8))))
    one, two = [k for k, s in enumerate(g.steps) if s.kind == "dot"]
    (c, w), (tanh, _) = g.steps[one].inputs, g.steps[two].inputs
    lines = g.steps[one].source, g.values[c].source, g.values[tanh].source
    assert lines == (at[4], at[1], at[5])
    assert laid_out_at(g, one, c) == laid_out_at(g, one, w) == at[7]  # (taken by the body)
    assert laid_out_at(g, two, tanh) == at[5]  # (made in it)
    assert laid_out_at(g, two, -1) == ""  # (the dot's partial sums: after it)


def test_layout_changes_and_scan_slices_stand_for_the_ops_they_serve():
    said = [(AG, M, 64, "dot_general", "m.py:3"), (AG, M, 32, "scan slice", "m.py:9")]
    hlo = [
        (AG, M, 64, "jit(f)/while/body/closed_call/sharding_constraint", "m.py:3 (block)"),
        (AG, M, 32, "jit(f)/while/body/jit(dynamic_index_in_dim)/squeeze", "m.py:9 (f)"),
    ]
    assert attributed(said, hlo)
    # a squeeze is not a dot
    assert not attributed(said, [(AG, M, 64, "jit(f)/squeeze", "m.py:3"), hlo[1]])


def test_many_equal_collectives_are_matched_without_search_blowing_up():
    said = [(AG, M, 8, "scan slice", "m.py:9")] * 40 + [(AG, M, 16, "dot_general", "m.py:3")]
    hlo = [(AG, M, 8, "jit(f)/squeeze", "m.py:9")] * 40 + [
        (AG, M, 16, "jit(f)/sharding_constraint", "m.py:3")
    ]
    assert attributed(said, hlo)
    assert not attributed(said, hlo[1:])


@pytest.mark.parametrize("train", [False, True])
def test_compiled_collectives_carry_the_users_lines(train):
    """The plan's program runs each equation under the user's source line, so the HLO's
    collectives point at the model's code, not at shardwise's."""
    fn, args = shardwise.model("mlp", batch=64, hidden=32, ffn=128, train=train)
    plan = shardwise.plan(fn, *args, mesh="data=2,model=4", profile="cpu-2core", train=train)
    item = plan.get("megatron")
    shapes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), args)
    mesh = jax.make_mesh((2, 4), ("data", "model"))
    leaves = [
        jax.ShapeDtypeStruct(
            a.shape, a.dtype, sharding=jax.NamedSharding(mesh, s.to_partition_spec())
        )
        for a, s in zip(jax.tree.leaves(shapes), item.in_specs, strict=True)
    ]
    compiled = (
        plan.sharded("megatron")
        .lower(*jax.tree.unflatten(jax.tree.structure(shapes), leaves))
        .compile()
    )
    found = collectives(compiled.as_text(), {"data": 2, "model": 4})
    assert found and all(
        c.source.split(" ")[0].rsplit("/", 1)[-1].startswith("models.py:") for c in found
    )


def test_cli_verify_json_gives_each_collective_the_users_line(tmp_path):
    """A user's own function: the verified collectives point at its file and line, as the
    predicted ones do, and the JSON says whether they agree."""
    from typer.testing import CliRunner

    from shardwise.cli import app

    src = tmp_path / "prog.py"
    src.write_text("def f(x, w):\n    return (x @ w).sum(0)\n")
    args = ["plan", "--function", f"{src}:f", "--args", "x=f32[64,32]", "--args",
            "w=f32[32,16]", "--mesh", "data=2,model=4", "--profile", "cpu-2core", "--top", "2",
            "--verify", "--json"]  # fmt: skip
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    plans = json.loads(r.stdout)["plans"]
    said = [c for p in plans for c in p["predicted"]["collectives"]]
    seen = [c for p in plans for c in p["verified"]["collectives"]]
    assert said and seen
    assert {c["source"] for c in said} == {"prog.py:2"}
    # from JAX 0.11 XLA names the change of an argument's layout after the argument, no line
    assert all(
        c["source"].startswith(f"{src}:2") or ("/" not in c["op"] and not c["source"]) for c in seen
    ), seen
    assert all(p["verified"]["sources_match"] for p in plans)


def test_many_collectives_each_its_own_are_attributed_without_running_out_of_tries():
    """A Linen decoder's training step: 27 all-gathers over `model`, each one predicted one
    (sizes repeated across lines, some two of them summing to a third). The backtracking
    search ran out of tries and said they did not belong to their ops."""
    lines = {16384: [42, 42], 32768: [35, 35, 36, 36, 42, 42], 65536: [55, 55, 56, 56],
             131072: [36, 36, 37, 37, 91], 262144: [35, 35, 52, 52], 524288: [58, 58],
             1048576: [55, 55, 56, 56]}  # fmt: skip
    said = [(AG, M, n, "transpose", f"m.py:{k}") for n, ks in lines.items() for k in ks]
    hlo = [(AG, M, n, "jit(f)/sharding_constraint", f"/src/m.py:{k} (f)") for n, ks in
           lines.items() for k in ks]  # fmt: skip
    assert len(said) == 27 and attributed(said, hlo)
    hlo[0] = (AG, M, 16384, "jit(f)/sharding_constraint", "/src/m.py:43 (f)")  # a line off
    assert not attributed(said, hlo)


def test_combined_collectives_among_many_small_ones_are_attributed():
    """A ViT training step: XLA combines three 34 KiB all-reduces of one line into one, and
    pairs of 1 KiB ones, beside thirty 4-byte norm reductions of another line combined into
    one. The search tried the many sets the small parts make first, ran out of tries, and
    said the collectives did not belong to their ops."""
    DM = ("data", "model")
    said = [(AR, DM, 34816, "dot_general", "m.py:15")] * 6
    said += [(AR, DM, 1088, "reduce_sum", f"m.py:{k}") for k in [15] * 8 + [16] * 8 + [42] * 4]
    said += [(AR, DM, 4, "reduce_sum", "m.py:60")] * 30
    hlo = [(AR, DM, 104448, "jit(f)/dot_general", "/src/m.py:15 (f)")] * 2
    hlo += [(AR, DM, 2176, "jit(f)/reduce_sum", f"/src/m.py:{k} (f)") for k in [15] * 4 +
            [16] * 4 + [42] * 2]  # fmt: skip
    hlo += [(AR, DM, 120, "jit(f)/reduce_sum", "/src/m.py:60 (f)")]
    assert attributed(said, hlo)
    hlo[-1] = (AR, DM, 120, "jit(f)/reduce_sum", "/src/m.py:61 (f)")  # a line off
    assert not attributed(said, hlo)
