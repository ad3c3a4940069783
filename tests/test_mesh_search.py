"""Choosing the mesh: every split of the devices over the roles, pruned, planned, best first."""

import json
import math
import time

import pytest

import shardwise
from shardwise._model.profile import BUILTIN
from shardwise._program.llama import named_size
from shardwise._program.mesh_search import MeshChoice, choose_mesh
from shardwise._program.splits import factorisations


@pytest.fixture(scope="module")
def small() -> MeshChoice:
    fn, args = shardwise.model("transformer", batch=4, hidden=64, ffn=256, seq=16, heads=8)
    return choose_mesh(fn, args, 8, "cpu-2core", batch=4, heads=8, max_tensor=4, top=100,
                       roles=("data", "fsdp", "tensor"))  # fmt: skip


def test_every_candidate_is_a_factorisation_of_the_devices(small):
    assert small.candidates
    for c in (*small.candidates, *small.skipped):
        assert math.prod(c.sizes) == 8 and len(c.sizes) == 3
    every = {c.sizes for c in (*small.candidates, *small.skipped)}
    assert every == set(factorisations(8, 3))


def test_the_best_is_predicted_no_slower_than_any_other(small):
    fitting = [c for c in small.candidates if c.fits]
    assert fitting[0] is small.candidates[0]
    assert all(small.candidates[0].seconds <= c.seconds for c in fitting)
    assert small.best.mesh.size == 8
    assert small.best.chosen.predicted.seconds == small.candidates[0].seconds


def test_ici_multiplies_to_the_devices(small):
    ici = small.ici()
    assert set(ici) == {f"ici_{r}_parallelism" for r in ("data", "fsdp", "tensor")}
    assert math.prod(ici.values()) == 8
    assert small.to_json()["mesh"] == small.mesh


def test_pruned_candidates_say_why(small):
    reasons = {c.mesh: c.skipped for c in small.skipped}
    assert "max_tensor" in reasons["tensor=8"]
    assert "does not divide the batch 4" in reasons["data=8"]
    assert all(c.skipped is None and c.seconds is not None for c in small.candidates)
    # a mesh not planned neither fits nor fails to: its memory is not known
    rows = {row["mesh"]: row for row in small.to_json()["candidates"]}
    assert rows["tensor=8"]["fits"] is None and rows["tensor=8"]["memory_bytes"] is None
    assert all(isinstance(rows[c.mesh]["fits"], bool) for c in small.candidates)


def test_meshes_given_in_also_are_planned_beside_the_splits():
    """``also``: the mesh run today (its axes need not be the roles) is planned too, so the
    choice is never slower; where it wins, ``ici`` reads its axes."""
    fn, args = shardwise.model("mlp", batch=64, hidden=32, ffn=128)
    c = choose_mesh(fn, args, 8, "cpu-2core", batch=64, top=100, limit=1,
                    also=("data=2,fsdp=4", "fsdp=8"))  # fmt: skip
    planned = {x.mesh: x for x in c.candidates}
    assert "data=2,fsdp=4" in planned and planned["data=2,fsdp=4"].axes == ("data", "fsdp")
    assert {"fsdp=8", "data=2,fsdp=4"} <= set(planned)  # (each once: the first split's too)
    assert len(c.candidates) == len(planned) <= 3
    assert not {x.mesh for x in c.skipped} & set(planned)  # (not also "past the limit")
    alone = shardwise.plan(fn, *args, mesh="data=2,fsdp=4", profile="cpu-2core", top=1)
    assert planned["data=2,fsdp=4"].seconds == alone.chosen.predicted.overlapped_seconds
    best = min(c.candidates, key=lambda x: x.seconds)
    assert c.candidates[0] is best
    given = MeshChoice(**{**{f: getattr(c, f) for f in MeshChoice.__slots__},
                          "candidates": (planned["data=2,fsdp=4"],)})  # fmt: skip
    assert given.ici() == {"ici_fsdp_parallelism": 4, "ici_tensor_parallelism": 1,
                           "ici_data_parallelism": 2}  # fmt: skip
    with pytest.raises(shardwise.ArgumentError, match="'model' is not a role"):
        choose_mesh(fn, args, 8, "cpu-2core", also=("data=2,model=4",))
    with pytest.raises(shardwise.ArgumentError, match="it has 4 devices, not 8"):
        choose_mesh(fn, args, 8, "cpu-2core", also=("fsdp=4",))


def test_past_the_limit_candidates_are_ranked_and_left_out():
    fn, args = shardwise.model("mlp", batch=64, hidden=32, ffn=128)
    c = choose_mesh(fn, args, 8, "cpu-2core", batch=64, ffn=128, limit=3, top=100,
                    roles=("data", "fsdp", "tensor"))  # fmt: skip
    assert len(c.candidates) == 3
    assert sum("past the 3 planned" in (s.skipped or "") for s in c.skipped) == 10 - 3
    assert "X_opt" in c.ranked_by


@pytest.mark.parametrize(
    ("devices", "roles", "fragment"),
    [(0, ("data",), "devices is 0"), (8, ("data", "modle"), "unknown role 'modle'"),
     (8, ("data", "data"), "twice"), (8, (), "at least one role")],
)  # fmt: skip
def test_bad_input_is_an_argument_error(devices, roles, fragment):
    fn, args = shardwise.model("mlp", batch=8, hidden=8, ffn=8)
    with pytest.raises(shardwise.ArgumentError, match=fragment):
        choose_mesh(fn, args, devices, "cpu-2core", roles=roles)


def test_a_count_no_split_divides_uses_the_most_devices_one_can_and_says_so():
    """A batch of 3 rows splits over no 4 devices: 3 are used, 1 idle, and the report says
    why; a count that splits uses them all."""
    fn, args = shardwise.model("mlp", batch=3, hidden=8, ffn=8)
    c = choose_mesh(fn, args, 4, "cpu-2core", roles=("data",), batch=3)
    assert (c.devices, c.used, c.mesh, c.best.mesh.size) == (4, 3, "data=3", 3)
    assert c.idle_why is not None and "3 of them are used, 1 idle" in c.idle_why
    assert "the batch 3" in c.idle_why
    assert c.to_json()["used"] == 3
    whole = choose_mesh(fn, args, 3, "cpu-2core", roles=("data",), batch=3)
    assert (whole.used, whole.idle_why) == (3, None)


def test_the_most_usable_count_is_the_largest_product_of_splits_the_model_takes():
    from shardwise._program.splits import most_usable

    # the scaling book's LLaMA-3 70B pod: 2048 rows and 64 heads split no finer than 8192
    assert most_usable(8960, ("fsdp", "tensor"), 16, 2048, 2048, 64) == 8192
    # three roles: the batch roles share the batch's divisors, sequence its own
    assert most_usable(100, ("data", "fsdp", "sequence"), 16, 6, 8, None) == 48
    assert most_usable(100, ("data", "tensor"), 16, 6, None, 12) == 72
    # a role the model does not bound splits any count: nothing to fall back to
    assert most_usable(100, ("data", "expert"), 16, 6, None, None) is None


@pytest.mark.slow
def test_llama3_8b_on_256_v5p_chips_what_if():
    size, batch, seq = named_size("llama3-8b"), 256, 2048
    fn, args = shardwise.model("llama", size="llama3-8b", batch=batch, seq=seq, train=True)
    start = time.perf_counter()
    c = choose_mesh(fn, args, 256, "tpu-v5p", train=True, batch=batch, seq=seq,
                    heads=size.heads, ffn=size.ffn, roles=("fsdp", "tensor"))  # fmt: skip
    wall = time.perf_counter() - start
    print(f"\nllama3-8b, 256 × tpu-v5p: {c.mesh} {c.ici()} "
          f"{c.candidates[0].seconds:.3f} s/step, searched in {wall:.1f} s")  # fmt: skip
    assert math.prod(c.ici().values()) == 256 and c.candidates[0].fits


MLP = ["plan", "--model", "mlp", "--batch", "64", "--hidden", "32", "--ffn", "128"]


def test_the_cli_chooses_the_mesh_and_plans_on_it():
    """``plan --choose-mesh 8 --profile …``: the meshes planned, the chosen one as MaxText's
    ici_* settings, then that mesh's plans; --json holds both, and the plan is on the mesh
    chosen."""
    from typer.testing import CliRunner

    from shardwise.cli import app

    runner = CliRunner()
    args = [*MLP, "--choose-mesh", "8", "--profile", "tpu-v5p", "--top", "2"]
    shown = runner.invoke(app, args)
    assert shown.exit_code == 0, shown.output
    assert "chosen mesh:" in shown.output and "ici_fsdp_parallelism" in shown.output
    doc = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    choice = doc["mesh_choice"]
    assert math.prod(choice["ici"].values()) == 8 and len(choice["candidates"]) >= 2
    assert shardwise.MeshSpec.parse(choice["mesh"]) == shardwise.MeshSpec.parse(doc["mesh"])


def test_the_cli_says_which_devices_idle_where_no_split_uses_them_all():
    from typer.testing import CliRunner

    from shardwise.cli import app

    runner = CliRunner()
    args = ["plan", "--model", "mlp", "--batch", "6", "--hidden", "32", "--ffn", "128",
            "--choose-mesh", "8", "--profile", "tpu-v5p", "--roles", "data"]  # fmt: skip
    shown = runner.invoke(app, args)
    assert shown.exit_code == 0, shown.output
    said = " ".join(shown.output.split())
    assert "6 of them are used, 2 idle" in said and "chosen mesh: data=6" in said, said
    doc = json.loads(runner.invoke(app, [*args, "--json"]).stdout)["mesh_choice"]
    assert (doc["devices"], doc["used"], doc["mesh"]) == (8, 6, "data=6")


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [([], "give their --profile"), (["--profile", "tpu-v5p", "--mesh", "x=8"], "--mesh"),
     (["--profile", "tpu-v5p", "--roles", "data,modle"], "unknown role 'modle'"),
     (["--profile", "tpu-v5p", "--verify"], "--verify")],
)  # fmt: skip
def test_the_cli_says_what_does_not_go_with_choose_mesh(extra, fragment):
    from typer.testing import CliRunner

    from shardwise.cli import app

    r = CliRunner().invoke(app, [*MLP, "--choose-mesh", "8", *extra])
    assert r.exit_code == 2 and fragment in r.output, r.output


def test_llama3_70b_on_a_v5p_pod_the_books_split_fits_and_is_near_the_best():
    """The scaling book's LLaMA-3 70B (applied-training.md): a 4M-token batch on a v5p pod
    of 8960 chips wants about 2048-way FSDP × 4-way tensor parallelism. 2048 rows and 64
    heads split no finer than 8192 ways, so 8192 chips are used. With AdamW's state every split the
    batch allows fits in a v5p's 95 GiB; the book's is planned and predicted within 10% of
    the best, and the best (collectives overlapping compute, as the book assumes) is within
    a factor 2 of the book's X and Y (the planner prices a 16-way tensor axis on a whole
    wrapped torus dimension, a 4-way one on part of one)."""
    size, batch, seq = named_size("llama3-70b"), 2048, 2048
    step, args = shardwise.model("llama", size="llama3-70b", batch=batch, seq=seq, train=True,
                                 optimizer="adamw")  # fmt: skip
    c = choose_mesh(step, args, 8960, "tpu-v5p", batch=batch, seq=seq, heads=size.heads,
                    ffn=size.ffn, top=10)  # fmt: skip
    assert (c.used, c.best.mesh.size) == (8192, 8192) and "768 idle" in (c.idle_why or "")
    meshes = {x.mesh: x for x in c.candidates}
    assert set(meshes) == {"fsdp=2048,tensor=4", "fsdp=1024,tensor=8", "fsdp=512,tensor=16"}
    assert all(x.fits for x in c.candidates)
    book = meshes["fsdp=2048,tensor=4"]
    assert book.seconds <= 1.1 * c.candidates[0].seconds
    x, y = c.candidates[0].sizes
    assert 2048 / 2 <= x <= 2048 * 2 and 4 / 2 <= y <= 4 * 2, c.candidates[0].mesh
    # every split is predicted slower than its matmuls at peak (6 FLOPs a parameter a token)
    assert c.candidates[0].seconds > 6 * size.parameters * batch * seq / (8192 * 4.59e14)


def test_variants_are_planned_on_each_split_and_the_fastest_that_fits_kept():
    """Remat policies as variants: where the profile's memory is too small for keeping every
    activation, a split's best is a policy that recomputes; each candidate names its policy."""
    import dataclasses

    from shardwise._model.profile import BUILTIN

    def step(remat):
        return shardwise.model("llama", size="llama3-8b", batch=256, seq=2048, train=True,
                               layers=2, remat=remat)  # fmt: skip

    variants = {r: step(r) for r in ("none", "full")}
    roomy = choose_mesh(*step("none"), 256, "tpu-v5p", limit=2, variants=variants, train=True)
    assert roomy.variant == "none" and {c.variant for c in roomy.candidates} == {"none"}
    least = min(c.memory_bytes for c in roomy.candidates)
    # a quarter under it: just under it, proving that no plan without remat fits takes the
    # integer program a minute and a half on one split
    tight = dataclasses.replace(BUILTIN["tpu-v5p"], memory_bytes=0.76 * least)
    chosen = choose_mesh(*step("none"), 256, tight, limit=1, variants=variants, train=True)
    assert chosen.variant == "full" and chosen.candidates[0].fits
    assert chosen.to_json()["variant"] == "full"
    # (not compared by time: the search minimises the serial time, and the plan it finds
    # under the budget can overlap its collectives better than the one it finds without)
    assert chosen.candidates[0].memory_bytes < least


def test_a_choice_prints_as_its_table_and_its_repr_leaves_the_plan_out(small):
    text = str(small)
    assert f"chosen mesh: {small.mesh}" in text and "not planned: " in text
    assert all(c.mesh in text for c in small.candidates)
    assert "ProgramPlan(" not in repr(small) and repr(small).startswith("MeshChoice(")
    first = small.candidates[0]
    tied = [c.mesh for c in small.candidates if (c.seconds, c.memory_bytes) == (first.seconds,
            first.memory_bytes)]  # fmt: skip
    assert (f"{', '.join(tied)} tie" in text) == (len(tied) > 1)  # (a tie is said as one)


def test_meshes_that_tie_are_said_to_tie():
    """Three meshes with the same predicted step and memory: the first is chosen, and the
    output says they tie (it had read as a choice among them)."""
    fn, args = shardwise.model("mlp", batch=64, hidden=32, ffn=128)
    choice = shardwise.choose_mesh(fn, args, 8, "cpu-2core", batch=4, top=3)
    assert {c.seconds for c in choice.candidates} == {choice.candidates[0].seconds}
    meshes = ", ".join(c.mesh for c in choice.candidates)
    assert f"{meshes} tie (the same predicted step and memory); the first is chosen" in str(choice)


def test_each_mesh_is_ranked_by_its_fastest_plan_that_fits_named():
    """Candidates are ranked by the step with collectives beside compute; each had taken the
    search's plan, which minimises the serial step, and so ranked Llama-3 8B's
    fsdp=64,tensor=4 at 412 ms where its FSDP baseline, shown on the same mesh, ran 369 ms in
    half the memory. Each mesh's time is now its fastest plan within a device's memory, and
    the plan is named."""
    fn, args = shardwise.model("llama", size="llama3-8b", batch=64, seq=512, train=True,
                               layers=2)  # fmt: skip
    c = choose_mesh(fn, args, 64, "tpu-v5p", limit=3, train=True, batch=64, seq=512)
    memory = BUILTIN["tpu-v5p"].memory_bytes
    for cand in c.candidates:
        p = shardwise.plan(fn, *args, mesh=cand.mesh, profile="tpu-v5p", train=True, top=1)
        fitting = [q for q in p.plans if q.predicted.memory_bytes <= memory]
        best = min(fitting, key=lambda q: q.predicted.overlapped_seconds)
        assert cand.seconds == best.predicted.overlapped_seconds, cand.mesh
        assert cand.plan == best.name and cand.memory_bytes == best.predicted.memory_bytes
    assert c.to_json()["candidates"][0]["plan"] == c.candidates[0].plan
    assert c.candidates[0].plan in str(c)
