"""Seeing it: memory and compute, terminal views, SVG/PNG pictures, Jupyter HTML, hints."""

from __future__ import annotations

import json
import struct
import sys
import xml.etree.ElementTree as ET

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from typer.testing import CliRunner

import shardwise
from shardwise.cli import app
from shardwise.render.figure import DPI, figure_size, save, to_svg
from shardwise.render.terminal import to_text

runner = CliRunner()
SVG = "{http://www.w3.org/2000/svg}"


def s4():
    return shardwise.explain_einsum(
        "nd,nd->n", [(4000, 10000)] * 2, mesh="x=2,y=4", in_specs=["x,y", "x,y"], out_specs="x"
    )


def test_memory_and_compute_per_device():
    e = s4()
    assert e.memory is not None and e.compute is not None
    assert e.memory.argument_bytes == 2 * 2000 * 2500 * 4  # both shards, per device
    assert e.memory.output_bytes == 2000 * 4
    assert e.memory.total_bytes >= e.memory.argument_bytes
    assert e.memory.capacity_bytes is None and e.memory.fraction is None  # CPU reports none
    assert e.compute.flops == pytest.approx(2 * 2000 * 2500, rel=0.01)
    data = e.to_json()
    assert set(data["memory"]) >= {
        "argument_bytes",
        "output_bytes",
        "temp_bytes",
        "total_bytes",
        "capacity_bytes",
        "fraction",
    }
    assert set(data["compute"]) >= {"flops", "bytes_accessed"}


def test_json_is_additive_to_the_engine_contract():
    data = s4().to_json()
    assert {"equation", "mesh", "mode", "operands", "output", "collectives"} <= set(data)
    assert data["operands"][0]["spec"] == ["x", "y"]
    assert data["collectives"][0]["kind"] == "all-reduce"
    assert data["local"]["placements"] == "(S(0), P(y))"
    assert data["output"]["placements"] == "(S(0), R)"


def test_terminal_view_shows_devices_ranges_and_partial_state():
    text = to_text(s4())
    assert "(S(0), P(y))" in text and "(S(0), R)" in text
    assert "dev 7" in text and "n 2000:4000" in text and "d 7500:10000" in text
    assert "partial" in text
    assert "contracted index `d` is sharded on `y`" in text
    assert "memory per device" in text and "compute per device" in text
    quiet = to_text(s4(), quiet=True)
    assert "dev 7" not in quiet and "all-reduce" in quiet


def test_rank_three_arrays_are_drawn_as_slices():
    e = shardwise.explain_einsum(
        "bmk,bkn->bmn", [(4, 8, 8)] * 2, mesh="x=2,y=4", in_specs=["x,-,y", "x,y"], out_specs="x"
    )
    text = to_text(e)
    assert "b 0:2" in text and "b 2:4" in text  # one 2-D slice per block of the leading dim
    assert "blocks of m×n per slice" in text


def test_svg_is_xml_with_one_shard_rectangle_per_device_per_operand():
    e = s4()
    root = ET.fromstring(to_svg(e))
    ids = [g.get("id") for g in root.iter(f"{SVG}g") if g.get("id")]
    for dev in range(8):
        for tag in ("op0", "op1", "local"):
            assert ids.count(f"shard-{tag}-dev{dev}") == 1
    shards = [i for i in ids if i.startswith("shard-")]
    assert len(shards) == 8 * 3
    assert "collective-0" in ids


def test_a_functions_picture_draws_its_inputs_and_output_and_short_labels():
    """An explained function's arrays are named by its parameters (``x``, ``params[...]``),
    not ``operand k``/``output``: its picture had drawn the inputs' and output's columns
    empty, and the devices' labels of a long pytree path ran over each other."""
    long = "params['encoder_block_with_a_very_long_name']['feed_forward_projection_kernel']"

    def f(params, x):
        return x @ params["encoder_block_with_a_very_long_name"]["feed_forward_projection_kernel"]

    params = {"encoder_block_with_a_very_long_name": {
        "feed_forward_projection_kernel": jax.ShapeDtypeStruct((32, 64), "float32")}}  # fmt: skip
    e = shardwise.explain(f, params, jax.ShapeDtypeStruct((16, 32), "float32"), mesh="x=2,y=4",
                          in_specs=({"encoder_block_with_a_very_long_name": {
                              "feed_forward_projection_kernel": "y,-"}}, "x,y"))  # fmt: skip
    assert e.operands[0].name == long
    root = ET.fromstring(to_svg(e))
    ids = [g.get("id") for g in root.iter(f"{SVG}g") if g.get("id")]
    assert {"full-0", "full-1", "out-0"} <= set(ids), ids
    from shardwise.render.figure import draw

    texts = [t.get_text() for t in draw(e).axes[0].texts if "kernel" in t.get_text()]
    assert len(texts) == 1 + 8, texts  # (its column's label, and one per device)
    assert all(len(line) <= 40 for t in texts for line in t.splitlines()), texts
    assert all(line.startswith("…") for t in texts[1:] for line in t.splitlines()[:1]), texts


def test_an_argument_named_as_the_output_keeps_its_own_colour():
    """Colours were kept by name: an argument named ``result`` took the output's red in its
    column and on every device."""
    from matplotlib.colors import to_hex

    from shardwise.render.figure import OUTPUT_COLOUR, draw

    def f(result, w):
        return result @ w

    S = jax.ShapeDtypeStruct
    e = shardwise.explain(f, S((16, 32), "float32"), S((32, 8), "float32"), mesh="x=2,y=4",
                          in_specs=("x,y", "y"))  # fmt: skip
    assert e.operands[0].name == e.outputs[0].name == "result"
    found = {p.get_gid(): to_hex(p.get_facecolor()) for p in draw(e).axes[0].patches}
    assert found["out-0"] == OUTPUT_COLOUR
    assert found["full-0"] != OUTPUT_COLOUR
    assert all(found[f"shard-result-dev{d}"] == found["full-0"] for d in range(8))


@pytest.mark.parametrize(
    ("mesh", "devices"), [("devices=1", 1), ("devices=2", 2), ("devices=8", 8), ("x=4,y=2", 8)]
)
def test_svg_any_mesh_and_rank(mesh, devices):
    e = shardwise.explain_einsum(
        "bmk,bkn->bmn",
        [(8, 4, 4)] * 2,
        mesh=mesh,
        layout={"b": shardwise.MeshSpec.parse(mesh).names[0]},
    )
    root = ET.fromstring(to_svg(e))
    ids = [g.get("id") for g in root.iter(f"{SVG}g") if g.get("id")]
    assert len([i for i in ids if i.startswith("shard-op0-")]) == devices


def test_png_renders_at_the_expected_size(tmp_path):
    e = s4()
    path = save(e, tmp_path / "s4.png")
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", head[16:24])
    w, h = figure_size(e)
    assert (width, height) == (round(w * DPI), round(h * DPI))


def test_save_refuses_other_formats(tmp_path):
    with pytest.raises(shardwise.ShardwiseError, match=r"\.svg or \.png"):
        save(s4(), tmp_path / "x.jpg")


def test_save_into_a_folder_that_is_not_there_is_refused_as_html_is(tmp_path):
    """``--svg`` and ``--png`` had made the missing folders (a mistyped ``/nonexistent/x.svg``
    made a new top-level folder), where ``--html`` refuses."""
    with pytest.raises(shardwise.ShardwiseError, match=r"its folder .*nodir.* does not exist"):
        save(s4(), tmp_path / "nodir" / "x.svg")
    assert not (tmp_path / "nodir").exists()


def test_missing_matplotlib_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ImportError, match=r"shardwise\[pictures\]"):
        to_svg(s4())


def test_jupyter_html_has_the_svg_inline():
    html = s4()._repr_html_()
    assert "<svg" in html and "all-reduce" in html
    plan = shardwise.Plan.make("nd,nd->n", [(16, 8)] * 2, mesh="x=2,y=4", in_specs=["x,y"] * 2)
    assert "(8, 2)" in plan._repr_html_()


def test_explain_any_function_and_the_sharded_object():
    def f(a, b):
        return jnp.tanh(a @ b)

    e = shardwise.explain(
        f,
        jax.ShapeDtypeStruct((16, 8), np.float32),
        jax.ShapeDtypeStruct((8, 16), np.float32),
        mesh="x=2,y=4",
        in_specs=("x,y", "y"),
        out_specs="x",
    )
    assert e.equation is None
    assert [c.kind for c in e.collectives] == ["all-reduce"]
    assert e.compute is not None and e.compute.transcendentals > 0
    assert e.outputs[0].spec == shardwise.Spec.parse("x")
    # an equation goes through the einsum path and gets einsum causes
    e2 = shardwise.explain(
        "nd,nd->n",
        np.ones((8, 4), np.float32),
        np.ones((8, 4), np.float32),
        mesh="x=2,y=4",
        in_specs=["x,y", "x,y"],
    )
    assert e2.causes[0].index == "d"


def test_explicit_mode_contraction_runs_as_pjit_did_and_its_hint_stays_for_explicit_code():
    """A split contraction on Explicit axes, which JAX refuses without an out_sharding, runs
    with the axes Auto (it had been refused, with the hint); a function that asks for an
    out_sharding JAX cannot give still gets the hint."""
    mesh = shardwise.mesh("x=2,y=4", axis_types="explicit")
    f = shardwise.shard(lambda a, b: a @ b, mesh, in_specs=("x,y", "y"))
    a, b = np.ones((8, 8), np.float32), np.ones((8, 8), np.float32)
    for run in (f, lambda a, b: f.lower(a, b).compile()(a, b)):
        out = run(a, b)
        np.testing.assert_allclose(np.asarray(out), a @ b)
    assert f(a, b).sharding.mesh == mesh
    from shardwise._xla.meshes import explicit_hints

    with pytest.raises(shardwise.SpecError) as info, explicit_hints():
        raise ValueError(
            "Contracting dimensions are sharded and it is ambiguous how the output should be "
            "sharded. Got lhs_contracting_spec=('y',) and rhs_contracting_spec=('y',)"
        )
    msg = str(info.value)
    assert "sharded on `y`" in msg and "out_sharding=P(...)" in msg and "axis_types='auto'" in msg


S4_EXPLAIN = [
    "explain",
    "nd,nd->n",
    "--shapes",
    "16x8,16x8",
    "--mesh",
    "x=2,y=4",
    "--in",
    "x,y",
    "--in",
    "x,y",
    "--out-spec",
    "x",
]
"""``shardwise explain`` of S4's layout at a small size."""


def test_cli_explain_quiet_svg_png(tmp_path):
    svg, png = tmp_path / "a.svg", tmp_path / "a.png"
    result = runner.invoke(
        app,
        [
            *S4_EXPLAIN,
            "--quiet",
            "--svg",
            str(svg),
            "--png",
            str(png),
        ],
        env={"COLUMNS": "160"},
    )
    assert result.exit_code == 0, result.output
    assert "dev 7" not in result.stdout and "contracted index `d`" in result.stdout
    ET.parse(svg)
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_cli_explain_json_has_causes_memory_compute():
    result = runner.invoke(
        app,
        [*S4_EXPLAIN, "--json"],
    )
    data = json.loads(result.stdout)
    assert data["collectives"][0]["cause"]["reason"] == "partial-sum"
    assert data["memory"]["argument_bytes"] == 2 * 8 * 2 * 4
    assert data["compute"]["flops"] > 0


def test_demo_pictures(tmp_path):
    result = runner.invoke(
        app, ["demo", "--size", "small", "--repeat", "1", "--json", "--pictures", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    for name in ("S1", "S2", "S3", "S4"):
        assert (tmp_path / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
        ET.parse(tmp_path / f"{name}.svg")


def test_shard_pjit_style_with_none_means_replicated():
    f = shardwise.shard(
        lambda a, b: a * b, "devices=8", in_specs=(P("devices"), None), out_specs=None
    )
    out = f(np.ones((8, 2), np.float32), np.ones((8, 2), np.float32))
    assert out.sharding.is_fully_replicated


def test_the_demo_makes_the_pictures_folder_it_is_given(tmp_path):
    """``demo --pictures DIR`` names a folder to write to: it is made, where a picture's own
    path (``--svg``) must be in a folder that exists."""
    from shardwise._demo import run_demo

    folder = tmp_path / "new" / "pictures"
    run_demo("small", repeat=1, pictures=folder, with_dask=False)
    assert {p.name for p in folder.iterdir()} >= {"S1.svg", "S1.png", "S4.svg", "S4.png"}


def test_explain_takes_a_prng_key_and_an_argument_the_function_does_not_read():
    """A typed PRNG key had no NumPy dtype to name (``key<fry>``: a raw ``TypeError``), and
    an argument the function does not read, which XLA leaves out of the compiled program,
    had made the operands one short (``zip() argument 2 is shorter``)."""
    x = jnp.ones((16, 32))

    def noisy(key, x, unused):
        return jax.random.normal(key, x.shape) + x

    e = shardwise.explain(noisy, jax.random.key(0), x, x, mesh="x=2,y=4",
                          in_specs=(None, "x", None))  # fmt: skip
    assert [(o.name, o.dtype) for o in e.operands] == [("key", "uint64"), ("x", "float32")]
    assert "dev 7" in to_text(e)
    ET.fromstring(to_svg(e))
