"""Every collective's cause, for a table of cases whose collectives are known."""

from __future__ import annotations

import pytest

import shardwise

XY = "x=2,y=4"

# (equation, shapes, in_specs, out_spec, mode, [(kind, axes, reason, array, index)])
CASES = [
    # batched dot, sharded on the batch: nothing to do
    ("nd,nd->n", [(16, 8)] * 2, ["x", "x"], "x", "auto", []),
    # contracted index sharded: partial sums
    (
        "nd,nd->n",
        [(16, 8)] * 2,
        ["x,y", "x,y"],
        "x",
        "auto",
        [("all-reduce", ("y",), "partial-sum", None, "d")],
    ),
    (
        "nd,nd->n",
        [(16, 8)] * 2,
        ["-,y", "-,y"],
        None,
        "manual",
        [("all-reduce", ("y",), "partial-sum", None, "d")],
    ),
    (
        "nd,nd->n",
        [(16, 8)] * 2,
        ["-,(x,y)", "-,(x,y)"],
        None,
        "auto",
        [("all-reduce", ("x", "y"), "partial-sum", None, "d")],
    ),
    # matmul sharded on a free index: nothing
    ("mk,kn->mn", [(16, 8), (8, 16)], ["x", None], "x", "auto", []),
    ("mk,kn->mn", [(16, 8), (8, 16)], [None, "-,y"], "-,y", "auto", []),
    ("mk,kn->mn", [(16, 8), (8, 16)], ["x", "-,y"], "x,y", "auto", []),
    # matmul with the contracted index sharded
    (
        "mk,kn->mn",
        [(16, 8), (8, 16)],
        ["-,y", "y"],
        None,
        "auto",
        [("all-reduce", ("y",), "partial-sum", None, "k")],
    ),
    (
        "mk,kn->mn",
        [(16, 8), (8, 16)],
        ["x,y", "y"],
        "x",
        "manual",
        [("all-reduce", ("y",), "partial-sum", None, "k")],
    ),
    # contracted sharded and the output scattered on the same axis (CPU: all-reduce + slice)
    (
        "mk,kn->mn",
        [(16, 8), (8, 16)],
        ["-,y", "y"],
        "y",
        "auto",
        [("all-reduce", ("y",), "partial-sum", None, "k")],
    ),
    # batched matmul on the batch, and on batch + contracted
    ("bmk,bkn->bmn", [(4, 8, 8), (4, 8, 8)], ["x", "x"], "x", "auto", []),
    (
        "bmk,bkn->bmn",
        [(4, 8, 8), (4, 8, 8)],
        ["x,-,y", "x,y"],
        "x",
        "manual",
        [("all-reduce", ("y",), "partial-sum", None, "k")],
    ),
    # an operand split on an axis the computation needs whole: all-gather
    (
        "mk,kn->mn",
        [(16, 8), (8, 16)],
        ["x", "-,x"],
        "x",
        "auto",
        [("all-gather", ("x",), "gather-operand", "operand 1", "n")],
        "x=2",
    ),
    (
        "mk,kn->mn",
        [(16, 8), (8, 16)],
        ["y", "y"],
        "y",
        "auto",
        [("all-gather", ("y",), "gather-operand", "operand 1", "k")],
    ),
    # an operand split along another dimension than the computation needs: all-to-all
    (
        "nd,nd->n",
        [(16, 8)] * 2,
        ["x", "-,x"],
        "x",
        "auto",
        [("all-to-all", ("x",), "relayout", "operand 1", None)],
        "x=2",
    ),
    (
        "mn->nm",
        [(16, 16)],
        ["x"],
        "x",
        "auto",
        [("all-to-all", ("x",), "relayout", "operand 0", None)],
        "x=2",
    ),
    # the output asked for less split than the computation produces: gather the output
    (
        "nd,nd->n",
        [(16, 8)] * 2,
        ["x", "x"],
        None,
        "auto",
        [("all-gather", ("x",), "gather-output", "output", None)],
    ),
    (
        "mk,kn->mn",
        [(16, 8), (8, 16)],
        ["x", None],
        None,
        "auto",
        [("all-gather", ("x",), "gather-output", "output", None)],
    ),
    # operands that agree, the output asked for on another axis: the output is moved
    (
        "nd,nd->n",
        [(16, 8)] * 2,
        ["x,y", "x,y"],
        "y",
        "auto",
        [
            ("all-reduce", ("y",), "partial-sum", None, "d"),
            ("collective-permute", ("x", "y"), "relayout", "output", None),
        ],
    ),
    # a 3-operand einsum's intermediate gathered: told from its kind, not said to be the
    # output "split (x, y) but requested as (x, y)"
    (
        "ij,jk,kl->il",
        [(8, 8)] * 3,
        ["x,y", "y,x", "x,y"],
        "infer",
        "auto",
        [
            ("all-gather", ("y",), "gather-operand", "operand 1", "j"),
            ("all-gather", ("x",), "gather-operand", "operand 0", "i"),
            ("all-gather", ("y",), "gather-operand", None, None),
            ("all-reduce", ("x",), "partial-sum", None, "k"),
        ],
    ),
    # reductions
    ("ij->i", [(16, 8)], ["-,y"], None, "auto", [("all-reduce", ("y",), "partial-sum", None, "j")]),
    (
        "ij->",
        [(16, 8)],
        ["x,y"],
        None,
        "manual",
        [("all-reduce", ("x", "y"), "partial-sum", None, "ij")],
    ),
]


@pytest.mark.parametrize(
    "case", CASES, ids=[f"{c[0]}|{'/'.join(map(str, c[2]))}->{c[3]}|{c[4]}" for c in CASES]
)
def test_cause(case):
    equation, shapes, in_specs, out_spec, mode, expected, *mesh = case
    e = shardwise.explain_einsum(
        equation,
        shapes,
        mesh=mesh[0] if mesh else XY,
        in_specs=in_specs,
        out_specs=out_spec,
        mode=mode,
    )
    got = [
        (c.kind, c.mesh_axes, cause.reason, cause.array, cause.index)
        for c, cause in zip(e.collectives, e.causes, strict=True)
    ]
    assert got == expected
    for c, cause in zip(e.collectives, e.causes, strict=True):
        assert cause.text.startswith(f"{c.kind} over `")
        if cause.index:
            assert f"`{cause.index}`" in cause.text


def test_an_output_asked_for_more_split_is_said_to_be_split_again_not_gathered():
    """``(x,y)`` asked where the computation makes ``(x)``: XLA gathers along ``x`` and
    slices again; the cause had said the output "is requested as ((x,y)), so the pieces are
    gathered", which holds only for an output asked for less split."""
    e = shardwise.explain_einsum("nd,nd->n", [(16, 8)] * 2, mesh=XY, in_specs=["x,y", "x,y"],
                                 out_specs="(x,y)")  # fmt: skip
    (gather,) = [k for c, k in zip(e.collectives, e.causes, strict=True) if c.kind == "all-gather"]
    assert gather.reason == "gather-output"
    assert "requested split ((x,y))" in gather.text and "keeps its slice" in gather.text


def test_cases_cover_every_kind_of_cause():
    reasons = {row[2] for case in CASES for row in case[5]}
    assert reasons == {"partial-sum", "gather-operand", "gather-output", "relayout"}
    assert len(CASES) >= 15


def test_cause_in_json_is_additive():
    e = shardwise.explain_einsum(
        "nd,nd->n", [(16, 8)] * 2, mesh=XY, in_specs=["x,y", "x,y"], out_specs="x"
    )
    (c,) = e.to_json()["collectives"]
    assert {"kind", "mesh_axes", "bytes"} <= set(c)
    assert c["cause"]["reason"] == "partial-sum"
    assert "contracted index `d` is sharded on `y`" in c["cause"]["text"]


def test_function_collectives_name_their_source_line():
    import jax
    import numpy as np

    def f(a, b):
        return (a @ b).sum()  # the line the all-reduce comes from

    e = shardwise.explain(
        f,
        jax.ShapeDtypeStruct((16, 8), np.float32),
        jax.ShapeDtypeStruct((8, 16), np.float32),
        mesh=XY,
        in_specs=("x,y", "y"),
    )
    assert e.collectives
    assert all(c.kind == "all-reduce" for c in e.collectives)
    assert any("test_causes.py" in c.source for c in e.collectives)
    assert all(cause.reason == "partial-sum" for cause in e.causes)
    assert any("test_causes.py" in cause.text for cause in e.causes)


def test_a_maximum_across_devices_is_said_as_one_not_as_a_sum():
    """A softmax over a split dimension: XLA takes the maximum across devices, then sums; the
    first had been said to be "summed" too."""
    import jax
    import numpy as np

    e = shardwise.explain(lambda x: jax.nn.softmax(x, axis=1), jax.ShapeDtypeStruct((8, 64),
                          np.float32), mesh=XY, in_specs="x,y")  # fmt: skip
    texts = {c.combiner: cause.text for c, cause in zip(e.collectives, e.causes, strict=True)}
    assert set(texts) == {"maximum", "add"}
    assert "combined by their maximum across `y` (from `reduce_max`" in texts["maximum"]
    assert "summed across `y` (from `reduce_sum`" in texts["add"]


def test_a_libraries_ops_are_named_by_the_users_line_that_calls_them():
    """An optax loss explained: its collectives had named optax's own lines
    (``_classification.py:400``); they name the user's call, as plans do."""
    import jax
    import numpy as np

    optax = pytest.importorskip("optax")

    def xent(logits, labels):
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    e = shardwise.explain(xent, jax.ShapeDtypeStruct((16, 64), np.float32),
                          jax.ShapeDtypeStruct((16,), np.int32), mesh=XY,
                          in_specs=("x,y", "x"))  # fmt: skip
    line = xent.__code__.co_firstlineno + 1
    assert e.collectives
    assert all(c.source.split(" ")[0].endswith(f"test_causes.py:{line}") for c in e.collectives)


def test_a_plans_maximum_over_a_split_dimension_is_a_partial_maximum_not_a_sum():
    """A program plan's reason for the all-reduce of ``jnp.max`` over a split dimension had
    said "sums over split dimensions: each device holds a partial sum"."""
    import jax
    import jax.numpy as jnp

    S = jax.ShapeDtypeStruct
    p = shardwise.plan(lambda x, w: jnp.max(x @ w, axis=1), S((256, 64), "float32"),
                       S((64, 512), "float32"), mesh=XY, profile="cpu-2core",
                       fixed={"w": "-,y"}, top=1)  # fmt: skip
    whys = [c.why for c in p.chosen.predicted.collectives if c.kind == "all-reduce"]
    assert any("reduce_max reduces over split dimensions: each device holds a partial maximum" in w
               for w in whys), whys  # fmt: skip
    assert not any("reduce_max" in w and "partial sum" in w for w in whys)
