"""Parsing user text into frozen values: meshes, specs, layouts and equations."""

from __future__ import annotations

import dataclasses

import pytest
from jax.sharding import PartitionSpec as P

from shardwise import EquationError, Layout, MeshError, MeshSpec, Op, Spec, SpecError
from shardwise._model.strategy import layouts


@pytest.mark.parametrize(
    ("text", "axes"),
    [
        ("devices=8", (("devices", 8),)),
        ("x=2,y=4", (("x", 2), ("y", 4))),
        (" x = 2 , y = 4 ", (("x", 2), ("y", 4))),
        ({"x": 4, "y": 2}, (("x", 4), ("y", 2))),
    ],
)
def test_mesh_parse(text, axes):
    spec = MeshSpec.parse(text)
    assert spec.axes == axes
    assert spec.axis_type == "auto"


def test_mesh_auto_needs_count_and_spreads_all():
    assert MeshSpec.parse("auto", device_count=8).axes == (("devices", 8),)
    with pytest.raises(MeshError, match="device count"):
        MeshSpec.parse("auto")


def test_mesh_is_frozen():
    spec = MeshSpec.parse("x=2")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.axes = ()  # type: ignore[misc]


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("x2", "name=size"),
        ("x=two", "not a whole number"),
        ("x=0", "at least 1"),
        ("x=2,x=4", "appears twice"),
        ("1x=2", "not a valid name"),
    ],
)
def test_mesh_parse_errors(text, match):
    with pytest.raises(MeshError, match=match):
        MeshSpec.parse(text)


@pytest.mark.parametrize(
    ("given", "entries"),
    [
        (P("devices"), (("devices",),)),
        (P("x", "y"), (("x",), ("y",))),
        (P(None, "x"), ((), ("x",))),
        (P("x", None), (("x",), ())),
        (P(("x", "y"), None), (("x", "y"), ())),
        (None, ()),
        ("", ()),
        ("None", ()),
        ("x,y", (("x",), ("y",))),
        ("-,devices", ((), ("devices",))),
        ("None,x", ((), ("x",))),
        ("(x,y),-", (("x", "y"), ())),
        ("P('x', None)", (("x",), ())),
        (["x", None], (("x",), ())),
        ([("x", "y")], (("x", "y"),)),
    ],
)
def test_spec_parse(given, entries):
    assert Spec.parse(given).entries == entries


def test_spec_round_trips_to_partition_spec():
    for text in ["x,y", "-,x", "(x,y)", ""]:
        spec = Spec.parse(text)
        assert Spec.parse(spec.to_partition_spec()) == spec
    assert Spec.parse("x,-").canonical() == Spec.parse("x")


def test_spec_json_has_one_entry_per_dimension():
    assert Spec.parse("(x,y)").to_json(2) == [["x", "y"], None]
    assert Spec.parse(None).to_json(1) == [None]


def test_spec_shard_shape():
    mesh = MeshSpec.parse("x=2,y=4")
    assert Spec.parse("x,y").shard_shape(mesh, (4000, 10000)) == (2000, 2500)
    assert Spec.parse("(x,y)").shard_shape(mesh, (16, 3)) == (2, 3)


def test_spec_bad_entry():
    with pytest.raises(SpecError, match="not a mesh axis name"):
        Spec.parse("x+y")
    with pytest.raises(SpecError, match="parentheses"):
        Spec.parse("(x,y")


def test_layout_parse_and_specs():
    lay = Layout.parse("n=x,d=y")
    assert lay.spec_for("nd") == Spec.parse("x,y")
    assert lay.spec_for("n") == Spec.parse("x")
    assert lay.spec_for("d") == Spec.parse("y")
    assert lay.spec_for("dn") == Spec.parse("y,x")
    assert Layout.parse("d=y").spec_for("nd") == Spec.parse("-,y")
    assert Layout.parse({"b": ("x", "y")}).spec_for("bd").entries == (("x", "y"),)
    assert Layout.parse("") == Layout.parse({})


def test_layout_errors():
    with pytest.raises(SpecError, match="both index"):
        Layout.parse("n=x,d=x")
    with pytest.raises(SpecError, match="index=axis"):
        Layout.parse("nx")
    with pytest.raises(SpecError, match="twice"):
        Layout.parse("n=x,n=y")


@pytest.mark.parametrize(
    ("equation", "inputs", "output", "batch", "contracted", "free"),
    [
        ("nd,nd->n", ("nd", "nd"), "n", "n", "d", ""),
        ("mk,kn->mn", ("mk", "kn"), "mn", "", "k", "mn"),
        ("bmk,bkn->bmn", ("bmk", "bkn"), "bmn", "b", "k", "mn"),
        ("i,j->ij", ("i", "j"), "ij", "", "", "ij"),
        ("ij->", ("ij",), "", "", "ij", ""),
        ("ij,jk", ("ij", "jk"), "ik", "", "j", "ik"),
        ("md, nd -> mn", ("md", "nd"), "mn", "", "d", "mn"),
        ("", ("",), "", "", "", ""),  # (one scalar, as NumPy's einsum reads it)
    ],
)
def test_op_parse(equation, inputs, output, batch, contracted, free):
    op = Op.parse(equation)
    assert (op.inputs, op.output) == (inputs, output)
    assert (op.batch, op.contracted, op.free) == (batch, contracted, free)


@pytest.mark.parametrize(
    ("equation", "match"),
    [
        ("...nd,...nd->...n", r"'\.\.\.'"),
        ("n1,nd->n", "contains '1'"),
        ("ii->i", "appears twice in operand 0"),
        ("nd,nd->nn", "twice in the output"),
        ("nd,nd->z", "appears in no input"),
        ("nd->n->d", "more than one"),
    ],
)
def test_op_parse_errors(equation, match):
    with pytest.raises(EquationError, match=match):
        Op.parse(equation)


def test_layout_enumeration_hand_counts():
    # 2 indices, 1 axis of 2: replicated, n=x, d=x -> 3 if both even
    got = list(layouts("nd", {"n": 4, "d": 6}, MeshSpec.parse("x=2")))
    assert [g.describe() for g in got] == ["replicated", "n=x", "d=x"]
    # 2 indices, 2 axes: (2+1)^2 = 9 assignments, all divisible
    assert len(list(layouts("nd", {"n": 8, "d": 8}, MeshSpec.parse("x=2,y=4")))) == 9
    # d=3 cannot be split by 2 or 4: only n takes axes -> {}, n=x, n=y, n=(x,y)
    got = {g.describe() for g in layouts("nd", {"n": 8, "d": 3}, MeshSpec.parse("x=2,y=4"))}
    assert got == {"replicated", "n=x", "n=y", "n=(x,y)"}
