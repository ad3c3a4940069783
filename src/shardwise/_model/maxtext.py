"""MaxText's vocabulary, and logical axis rules written as a MaxText config block.

The names are copied from MaxText (github.com/AI-Hypercomputer/maxtext at commit
``e591f30cbbf217ed67ef71263ec0538239f9c3b8``): the logical names are the left sides of
``logical_axis_rules`` and the mesh axes ``mesh_axes`` in ``src/maxtext/configs/base.yml``;
which ``ici_*_parallelism`` key sizes each axis is the ``ici_map`` of
``src/maxtext/configs/types.py`` (``stage`` is sized by ``ici_pipeline_parallelism``). Pure:
no JAX, no YAML library (the text is written here, and the tests read it with PyYAML).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from shardwise._errors import ArgumentError
from shardwise._model.mesh import MeshSpec

SOURCE = "AI-Hypercomputer/maxtext@e591f30c src/maxtext/configs/base.yml"
"""Where the names below come from, for the config's comments."""

LOGICAL_NAMES: tuple[str, ...] = (
    "circular_repeats", "activation_embed_and_logits_batch",
    "activation_embed_and_logits_batch_sequence", "activation_vocab", "vocab", "embed_vocab",
    "activation_batch_attn", "activation_input_length_attn", "activation_heads",
    "activation_kv_heads", "activation_length_attn", "activation_q_length",
    "activation_kv_length", "activation_embed_attn", "activation_kv", "activation_kv_batch",
    "activation_kv_head_dim", "heads", "q_heads", "kv_heads", "qkv", "kv", "kv_head_dim",
    "q_lora", "q_lora_up_proj", "kv_lora", "kv_lora_up_proj", "activation_batch_moe",
    "activation_length_moe", "activation_norm_length_moe", "activation_embed_moe",
    "activation_mlp_moe", "activation_exp", "exp", "mlp_moe", "embed_moe", "activation_mlp",
    "activation_batch", "activation_length", "activation_norm_length", "activation_embed",
    "activation_stage", "mlp", "gdn_head", "embed", "norm", "layers", "diloco", "engram_dim",
    "dense_layers", "moe_layers", "local_layers", "mhc", "prefill_activation_length",
    "prefill_activation_norm_length", "activation_prefill_kv_batch", "decode_batch",
    "decode_length", "cache_heads", "paged_kv_heads", "cache_batch_prefill", "cache_batch",
    "cache_heads_none", "cache_kv", "cache_sequence", "num_pages", "tokens_per_page",
    "paged_kv_head_dim_size", "mlp_no_fsdp", "exp_with_fsdp",
)  # fmt: skip
"""The logical names base.yml gives rules to, in its order."""

MESH_AXES: tuple[str, ...] = (
    "diloco", "data", "stage", "fsdp", "fsdp_transpose", "context", "context_usp_ulysses",
    "context_autoregressive", "tensor", "tensor_sequence", "expert", "autoregressive",
)  # fmt: skip
"""base.yml's ``mesh_axes``, in its order (the order MaxText lays devices out in)."""

ICI_KEYS: Mapping[str, str] = {
    axis: f"ici_{'pipeline' if axis == 'stage' else axis}_parallelism" for axis in MESH_AXES
}
"""Each mesh axis's size in a config: the ``ici_*_parallelism`` key MaxText reads it from."""

Entry = tuple[str, ...]


def undefined(names: Sequence[str]) -> tuple[str, ...]:
    """The ``names`` base.yml gives no rule (each once, in order).

    >>> undefined(["embed", "mlp", "hidden", "embed"])
    ('hidden',)
    """
    known = set(LOGICAL_NAMES)
    return tuple(dict.fromkeys(n for n in names if n not in known))


def _quoted(text: str) -> str:
    """``text`` as a single-quoted YAML scalar (a quote is doubled)."""
    return "'" + text.replace("'", "''") + "'"


def _renamed(mesh: MeshSpec, rename: Mapping[str, str]) -> dict[str, int]:
    """Each MaxText mesh axis's size: the plan's axes under ``rename``, checked."""
    sizes: dict[str, int] = {}
    for axis, size in mesh.axes:
        sizes[rename.get(axis, axis)] = size
    unknown = [a for a in sizes if a not in ICI_KEYS]
    if unknown:
        raise ArgumentError(
            f"the mesh {mesh.describe()} has axes MaxText does not know: {', '.join(unknown)}; "
            f"MaxText's mesh axes are {', '.join(MESH_AXES)}. Plan on a mesh named with "
            f"them (from the command line, --mesh data=2,tensor=4), or rename the axes in "
            "Python, e.g. plan.logical_rules().to_maxtext(mesh, "
            f"rename={{{unknown[0]!r}: 'tensor'}})."
        )
    if len(sizes) < len(mesh.axes):
        raise ArgumentError(
            f"rename={dict(rename)!r} gives two axes of the mesh {mesh.describe()} one name; "
            "give each axis its own MaxText axis."
        )
    return sizes


def maxtext_config(
    rules: Sequence[tuple[str, Entry]],
    mesh: MeshSpec,
    notes: Sequence[str] = (),
    rename: Mapping[str, str] | None = None,
) -> str:
    """``rules`` (ordered; each name's mesh axes) and ``mesh`` as the YAML lines MaxText's
    config takes: ``override_logical_axis_rules``, ``logical_axis_rules`` as
    ``[name, [axes…]]`` pairs (``[]``: not split), ``mesh_axes`` (base.yml's, so that its other
    settings, e.g. ``data_sharding``, still name axes of the mesh) and each axis's
    ``ici_*_parallelism`` (1 for the axes the plan does not use). ``notes`` become comment
    lines; ``rename`` maps the plan's mesh axes to MaxText's (``{"model": "tensor"}``).

    >>> rules = [("activation_batch", ("data",)), ("embed", ())]
    >>> print("\\n".join(maxtext_config(rules, MeshSpec.parse("data=8")).splitlines()[3:8]))
    override_logical_axis_rules: true
    logical_axis_rules: [
      ['activation_batch', ['data']],
      ['embed', []],
    ]
    """
    rename = dict(rename or {})
    sizes = _renamed(mesh, rename)
    named = undefined([name for name, _ in rules])
    lines = [
        f"# MaxText config for a plan on {mesh.describe()}; names from {SOURCE}.",
        "# The rules are ordered (a later rule for a name is a fallback where the first's",
        "# axes are taken), so they replace base.yml's rules rather than merge after them.",
    ]
    if named:
        lines.append(f"# logical names MaxText's base.yml does not define: {', '.join(named)}")
    lines += [f"# {' '.join(note.split())}" for note in notes]
    lines += ["override_logical_axis_rules: true", "logical_axis_rules: ["]
    for name, axes in rules:
        written = ", ".join(_quoted(rename.get(a, a)) for a in axes)
        lines.append(f"  [{_quoted(name)}, [{written}]],")
    lines += ["]", f"mesh_axes: [{', '.join(_quoted(a) for a in MESH_AXES)}]"]
    lines += [f"{ICI_KEYS[axis]}: {sizes.get(axis, 1)}" for axis in MESH_AXES]
    return "\n".join(lines) + "\n"
