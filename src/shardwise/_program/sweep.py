"""What-if across batch sizes: plan one built-in model at each batch size and see where
data-parallel / FSDP plans overtake tensor-parallel ones, the search's plan beside them.

The scaling book (jax-ml/scaling-book, training.md) puts the point where data parallelism and
FSDP become compute-bound at ``C / W_ici`` tokens per device: a device's FLOP/s over the bytes
per second it exchanges along one mesh axis, both directions (about 2550 on TPU v5p).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from shardwise._errors import ArgumentError
from shardwise._model.mesh import MeshSpec
from shardwise._model.profile import Profile
from shardwise._model.profile_files import load_profile
from shardwise._program.baselines import NAMES
from shardwise._program.models import SEQ, model
from shardwise._program.program import plan

DATA = tuple(n for n in NAMES if n in ("data-parallel", "fsdp"))
"""Baselines that split the batch and keep (or gather) whole weights."""
TENSOR = tuple(n for n in NAMES if n in ("megatron", "data×tensor"))
"""Baselines that split the weights' inner dimension."""


@dataclass(frozen=True, slots=True)
class SweepRow:
    """One batch size: the search's plan and how the best baseline of each family compares
    (its predicted time over the search's; ``None`` where no such baseline applies; times with
    collectives overlapping compute where the platform runs them so), and the
    search's plan's model FLOP utilisation (the step's FLOPs planned on one device, over
    devices × its predicted time × the profile's peak)."""

    batch: int
    tokens_per_device: float
    seconds: float
    in_specs: tuple[str, ...]
    data_parallel: float | None
    tensor_parallel: float | None
    mfu: float | None = None

    @property
    def family(self) -> str:
        """Which family's best baseline is ahead: ``"data"``, ``"tensor"``, or ``"none"``
        where neither applies."""
        if self.data_parallel is None or self.tensor_parallel is None:
            if self.data_parallel is None and self.tensor_parallel is None:
                return "none"
            return "tensor" if self.data_parallel is None else "data"
        return "data" if self.data_parallel <= self.tensor_parallel else "tensor"


@dataclass(frozen=True, slots=True)
class Sweep:
    """Plans of one model across batch sizes, and the scaling book's switch point."""

    program: str
    mesh: MeshSpec
    profile: str
    train: bool
    threshold: float
    rows: tuple[SweepRow, ...]

    @property
    def switch(self) -> float | None:
        """Tokens per device of the first batch from which the best data-parallel baseline
        stays ahead of the best tensor-parallel one."""
        for k, row in enumerate(self.rows):
            if all(r.family == "data" for r in self.rows[k:]):
                return row.tokens_per_device
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "program": self.program,
            "mesh": dict(self.mesh.axes),
            "profile": self.profile,
            "train": self.train,
            "threshold_tokens_per_device": self.threshold,
            "switch_tokens_per_device": self.switch,
            "rows": [
                {
                    "batch": r.batch,
                    "tokens_per_device": r.tokens_per_device,
                    "search_seconds": r.seconds,
                    "in_specs": list(r.in_specs),
                    "best_data_parallel": r.data_parallel,
                    "best_tensor_parallel": r.tensor_parallel,
                    "family": r.family,
                    "mfu": r.mfu,
                }
                for r in self.rows
            ],
        }


def threshold(profile: Profile, dtype: str) -> float:
    """The scaling book's ``C / W_ici``: tokens per device past which data parallelism is
    compute-bound (a device's FLOP/s over its link's bytes per second, both directions).

    >>> from shardwise._model.profile import BUILTIN
    >>> round(threshold(BUILTIN["tpu-v5p"], "bfloat16"))
    2550
    """
    return profile.flops(dtype) / (2 * profile.link.bandwidth_Bps)


def model_dtype(name: str, dims: dict[str, Any]) -> str:
    """The dtype built-in model ``name`` computes in (its ``dims``' or its default)."""
    return str(dims.get("dtype") or ("bfloat16" if name == "llama" else "float32"))


def model_flops(
    fn: Callable[..., Any], args: Sequence[Any], profile: Profile, train: bool
) -> float:
    """The model's FLOPs for MFU: the step ``fn(*args)`` planned on one device (no remat in
    ``fn``: recomputation is not the model's work)."""
    one = plan(fn, *args, mesh="x=1", profile=profile, train=train, top=1)
    return float(one.chosen.predicted.flops)


def sweep(
    name: str,
    batches: Sequence[int],
    *,
    mesh: MeshSpec | str,
    profile: Profile | str,
    train: bool = False,
    on_step: Callable[[int, int], None] | None = None,
    **dims: Any,
) -> Sweep:
    """Plan the built-in model ``name`` at each batch size on ``mesh`` (which need not exist
    here) with ``profile`` standing in for its devices (``dims``: the model's other sizes, as
    :func:`shardwise.model` takes them), and see where data-parallel plans overtake
    tensor-parallel ones.

    >>> import shardwise
    >>> s = shardwise.sweep("mlp", [8, 4096], mesh="data=4,model=4", profile="tpu-v5p",
    ...                     hidden=256, ffn=1024, dtype="bfloat16")
    >>> [r.tokens_per_device for r in s.rows], s.threshold
    ([0.5, 256.0], 2550.0)
    """
    if not batches:
        raise ArgumentError("give at least one batch size to sweep.")
    mesh = MeshSpec.parse(mesh) if isinstance(mesh, str) else mesh
    profile = load_profile(profile) if isinstance(profile, str) else profile
    if any(b < 1 for b in batches):
        raise ArgumentError(f"batch sizes must be 1 or more, got {list(batches)}.")
    tokens = dims.get("seq", SEQ) if name in ("transformer", "llama") else 1
    dtype = model_dtype(name, dims)
    rows = []
    sizes = sorted(set(batches))
    for k, batch in enumerate(sizes):
        if on_step is not None:
            on_step(k, len(sizes))
        fn, args = model(name, batch=batch, train=train, **dims)
        report = plan(fn, *args, mesh=mesh, profile=profile, train=train, top=1)
        seconds = {p.name: p.predicted.overlapped_seconds for p in report.plans}
        flops = model_flops(fn, args, profile, train)
        mfu = flops / (mesh.size * seconds["search"] * profile.flops(dtype))
        data, tensor = (
            min((seconds[n] / seconds["search"] for n in names if n in seconds), default=None)
            for names in (DATA, TENSOR)
        )
        rows.append(
            SweepRow(
                batch,
                batch * tokens / mesh.size,
                seconds["search"],
                tuple(s.describe() for s in report.chosen.in_specs),
                data,
                tensor,
                mfu,
            )
        )
    limit = threshold(profile, dtype)
    return Sweep(name, mesh, profile.name, train, limit, tuple(rows))
