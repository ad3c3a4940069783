"""The libraries' own models (Flax NNX and Linen, Optax, Equinox, Haiku; see
``library_models.py``) planned on a mesh given as text and on an Explicit JAX mesh: each is
planned and its chosen plan runs and equals the function under ``jax.jit``; after ``verify``
every plan's collectives are the compiled program's and its memory is within 20% of the
prediction.

A check that fails today is marked ``xfail(strict=True)`` with what it found and the exception
it fails with (a memory check that fails raises :class:`MemoryOffPrediction`, so a wrong
collective in the same test is still a failure), so that the suite stays green and the mark
turns into a failure the day the planner is fixed."""

from __future__ import annotations

import functools
from typing import Any

import jax
import numpy as np
import pytest
from jax.sharding import AxisType

import shardwise
from helpers import A_RANDOM_PROFILE, ANOTHER_MACHINE
from library_models import MODELS, TOLERANCES
from shardwise._model.profile import Profile
from shardwise._model.spec import Spec
from shardwise._versions import heap_release

PROFILE = "cpu-2core"
MESHES = ("string", "explicit")
CHECKS = ("sharded", "verify")
"""``sharded``: plan, run the chosen plan, compare with ``jax.jit``; ``verify``: every plan's
collectives, then its memory."""
MEMORY_RANGE = (0.8, 1.25)
"""Compiled over predicted memory per device, for every plan."""


class MemoryOffPrediction(AssertionError):
    """Some plan's compiled memory is outside :data:`MEMORY_RANGE` of its prediction."""


LIBRARIES = {
    "nnx-mlp": ("flax",),
    "nnx-gpt-loss": ("flax", "optax"),
    "nnx-adamw-step": ("flax", "optax"),
    "linen-cnn-step": ("flax", "optax"),
    "eqx-attention": ("equinox",),
    "eqx-checkpoint": ("equinox",),
    "haiku-mlp": ("haiku",),
    "nnx-dropout": ("flax",),
    "nnx-12-layers": ("flax",),
    "linen-logical": ("flax",),
    "nnx-mixed-precision": ("flax",),
    "eqx-batchnorm-step": ("equinox",),
}
"""The libraries each case needs; a case whose library is missing is skipped."""

HEAVY = ("nnx-gpt-loss", "linen-cnn-step", "nnx-adamw-step", "eqx-attention", "eqx-checkpoint")
"""The cases whose ``verify`` takes longest, marked slow. Every case but the MLP is verified
on the Explicit mesh only: on the mesh given as text they compile to the same programs."""
SLOW = {"nnx-gpt-loss": CHECKS} | {name: ("verify",) for name in HEAVY}
"""The checks that take longest (``make test-fast`` leaves them out); planning the GPT's 250
ops takes seconds."""

KNOWN: dict[tuple[str, str], tuple[str, type[BaseException]]] = {}
"""What each check that fails today found (the same on both meshes), and the exception it
fails with: none now (see :func:`test_an_attention_split_along_each_heads_features`)."""


def _params() -> list[Any]:
    params = []
    for name in MODELS:
        for mesh in MESHES:
            for check in CHECKS:
                if check == "verify" and mesh == "string" and name != "nnx-mlp":
                    continue  # (the same programs as on the Explicit mesh; one kept to show it)
                marks = []
                if check in SLOW.get(name, ()):
                    marks.append(pytest.mark.slow)
                if (name, check) in KNOWN:
                    reason, raises = KNOWN[name, check]
                    marks.append(pytest.mark.xfail(strict=True, reason=reason, raises=raises))
                params.append(
                    pytest.param(name, mesh, check, marks=marks, id=f"{name}-{mesh}-{check}")
                )
    return params


def _mesh(kind: str) -> Any:
    if kind == "string":
        return "data=2,model=4"
    return jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)


@functools.cache
def _model(name: str) -> Any:
    return MODELS[name]()


@functools.cache
def _plan(name: str, mesh: str) -> shardwise.ProgramPlan:
    fn, args = _model(name)
    return shardwise.plan(fn, *args, mesh=_mesh(mesh), profile=PROFILE)


def _check_sharded(name: str, mesh: str) -> None:
    fn, args = _model(name)
    p = _plan(name, mesh)
    assert p.chosen.name == "search"
    assert jax.tree.structure(p.in_specs) == jax.tree.structure(args)
    got = p.sharded()(*args)
    want = jax.jit(fn)(*args)
    rtol, atol = TOLERANCES.get(name, (1e-4, 1e-5))
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
            a, b = jax.random.key_data(a), jax.random.key_data(b)
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=atol)


def _check_verify(name: str, mesh: str) -> None:
    _check_plans(_plan(name, mesh))


def _check_plans(p: shardwise.ProgramPlan) -> None:
    """Every plan of ``p`` compiles to its collectives and to within :data:`MEMORY_RANGE` of
    its predicted memory."""
    checked = p.verify(repeat=1)
    assert all(p.verified is not None for p in checked.plans)
    wrong = [p.name for p in checked.plans if not p.verified.collectives_match]
    assert wrong == []
    ratios = {p.name: p.verified.memory_bytes / p.predicted.memory_bytes for p in checked.plans}
    low, high = MEMORY_RANGE
    outside = {n: round(r, 3) for n, r in ratios.items() if not low <= r <= high}
    if outside:
        raise MemoryOffPrediction(f"compiled / predicted memory outside [{low}, {high}]: {outside}")


_CHECKS = {"sharded": _check_sharded, "verify": _check_verify}


@pytest.mark.parametrize(("name", "mesh", "check"), _params())
def test_library_model(name: str, mesh: str, check: str) -> None:
    for library in LIBRARIES[name]:
        pytest.importorskip(library)
    _CHECKS[check](name, mesh)


def _head_features() -> dict[str, str]:
    out = {}
    for n in range(2):
        attn = f"state['blocks'][{n}]['attn']"
        for proj in ("query", "key", "value"):
            out[f"{attn}['{proj}']['kernel'].value"] = "-,-,(data,model)"  # (32, 4, 8)
            out[f"{attn}['{proj}']['bias'].value"] = "-,(data,model)"  # (4, 8)
        out[f"{attn}['out']['kernel'].value"] = "-,(data,model)"  # (4, 8, 32)
        out[f"{attn}['out']['bias'].value"] = "replicated"
    return out


HEAD_FEATURES = _head_features()
"""The GPT's attention split along each head's features (``head_dim``, 8 of them) over all
8 devices: every score a partial sum, all-reduced. (Megatron, which had split it so where the
4 heads do not divide over 8 devices, now keeps those projections whole.)"""


@pytest.mark.slow
@pytest.mark.xfail(
    heap_release() < (0, 12, 1),  # (jaxlib 0.12.1's heap is 1.17× the live bytes, the plan 1.09×)
    strict=True,
    raises=MemoryOffPrediction,
    reason="compiled to 1.36× its prediction: XLA's heap leaves gaps between the attention "
    "scores' buffers (the bytes it holds at once, from its live ranges, are 0.98× the "
    "prediction; benchmarks/xla_heap.py). XLA's best fit (largest first, then longest) over "
    "its own live ranges gives its heap to 16 bytes: five 32 KiB score buffers (the partial "
    "sums, their all-reduce, the mask, the softmax), each live with the next, take three "
    "slots. Run over the prediction's temporaries it leaves no gap: there the scale, mask and "
    "softmax are written over one another (buffers.overwritten), where XLA's fusions make "
    "each a new buffer",
)
def test_an_attention_split_along_each_heads_features() -> None:
    """The plans of the GPT with its attention pinned so: each within 20% of XLA's memory."""
    for library in LIBRARIES["nnx-gpt-loss"]:
        pytest.importorskip(library)
    fn, args = _model("nnx-gpt-loss")
    _check_plans(shardwise.plan(fn, *args, mesh="data=2,model=4", profile=PROFILE,
                                fixed=HEAD_FEATURES, top=2))  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("name", ["linen-cnn-step", "haiku-mlp", "eqx-checkpoint"])
def test_the_plans_of_another_machines_profile(name: str) -> None:
    """Every plan made with another machine's profile compiles to its collectives and within
    20% of its predicted memory."""
    for library in LIBRARIES[name]:
        pytest.importorskip(library)
    fn, args = _model(name)
    profile = Profile.from_json(ANOTHER_MACHINE)  # (its plans' misses: helpers.ANOTHER_MACHINE)
    _check_plans(shardwise.plan(fn, *args, mesh="data=2,model=4", profile=profile))


@pytest.mark.slow
def test_the_cnn_steps_moves_under_a_random_profile_hold_what_xla_holds() -> None:
    """The CNN step under :data:`helpers.A_RANDOM_PROFILE`. Its FSDP plan moves the
    convolution from the batch split 8 ways to the channels split 8 ways: an all-gather on
    ``model``, then an all-to-all of the gathered block on ``data``, whose slices and pieces
    CPU holds at once (counted as one block, the plan was at 1.65× XLA's memory). Its
    data × tensor plan gathers the pooled images along their channels for the flattening
    reshape: CPU gathers them in a transposed layout that the reshape reads as it is, with
    no copy back (counted with one, 0.78×)."""
    for library in LIBRARIES["linen-cnn-step"]:
        pytest.importorskip(library)
    fn, args = _model("linen-cnn-step")
    profile = Profile.from_json(A_RANDOM_PROFILE)
    p = shardwise.plan(fn, *args, mesh="data=2,model=4", profile=profile)
    plans = {item.name: item for item in p.plans}
    steps = [s for s in p.graph.steps if not s.backward]
    conv = next(s for s in steps if s.prim == "conv_general_dilated")
    fsdp, tensor = plans["fsdp"].layouts, plans["data×tensor"].layouts  # the cases
    both = Spec.parse("(data,model)").canonical()
    assert fsdp.steps[conv.key][1].canonical() == both
    assert fsdp.specs[conv.output].canonical() == Spec.parse("-,-,-,(data,model)").canonical()
    flat = next(s for s in steps if s.prim == "reshape" and len(p.graph.values[s.output].shape) < 3)
    assert tensor.specs[flat.inputs[0]].canonical() == Spec.parse("-,-,-,model").canonical()
    assert tensor.steps[flat.key][0][0].canonical() == Spec().canonical()
    low, high = MEMORY_RANGE
    for name in ("fsdp", "data×tensor"):
        m = p.sharded(name).lower(*args).compile().memory_analysis()
        compiled = m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
        ratio = (compiled + m.temp_size_in_bytes) / plans[name].predicted.memory_bytes
        assert low <= ratio <= high, (name, ratio)
