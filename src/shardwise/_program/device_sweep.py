"""What-if across device counts: choose the mesh (and the remat policy) of one built-in model
at each number of devices of a profile, and see how its predicted step time and model FLOP
utilisation (MFU) change and which strategy each count gets.

MFU is the model's FLOPs over the time the devices could have done them in: the step's
FLOPs as planned on one device, with no remat (recomputation is not the model's work), over
``devices × predicted step time × the profile's peak FLOP/s``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from shardwise._errors import ArgumentError
from shardwise._model.profile import Profile
from shardwise._model.profile_files import load_profile
from shardwise._program.llama import REMAT
from shardwise._program.mesh_search import choose_mesh
from shardwise._program.models import SEQ, remat_variants
from shardwise._program.sweep import model_dtype, model_flops


@dataclass(frozen=True, slots=True)
class DevicePoint:
    """One device count: the chosen mesh and remat policy, predicted step time and MFU, its
    memory per device and whether it fits (``skipped``: why no mesh was planned, the rest
    ``None``). ``used``: how many of the devices the mesh uses, fewer where no split of them
    all divides the model (the rest idle; MFU counts every device)."""

    devices: int
    mesh: str | None = None
    remat: str | None = None
    seconds: float | None = None
    mfu: float | None = None
    memory_bytes: int | None = None
    fits: bool | None = None
    skipped: str | None = None
    used: int | None = None


@dataclass(frozen=True, slots=True)
class DeviceSweep:
    """The mesh chosen for one model at each device count."""

    program: str
    profile: str
    batch: int
    roles: tuple[str, ...]
    model_flops: float
    points: tuple[DevicePoint, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "program": self.program,
            "profile": self.profile,
            "batch": self.batch,
            "roles": list(self.roles),
            "model_flops": self.model_flops,
            "points": [
                {"devices": p.devices, "mesh": p.mesh, "remat": p.remat, "seconds": p.seconds,
                 "mfu": p.mfu, "memory_bytes": p.memory_bytes, "fits": p.fits,
                 "skipped": p.skipped, "used": p.used}
                for p in self.points
            ],
        }  # fmt: skip


def sweep_devices(
    name: str,
    devices: Sequence[int],
    *,
    profile: Profile | str,
    batch: int,
    train: bool = False,
    optimizer: str | None = None,
    roles: Sequence[str] = ("fsdp", "tensor"),
    remat: str = "none",
    limit: int = 12,
    on_step: Callable[[int, int], None] | None = None,
    **dims: Any,
) -> DeviceSweep:
    """Choose the mesh of built-in model ``name`` (:func:`shardwise.model`, with ``batch``
    rows and ``dims``) on each of ``devices`` devices of ``profile`` over ``roles``
    (:func:`shardwise.choose_mesh`, ``limit`` splits at most each), with the Llama's remat
    policy ``remat`` (``"auto"``: each policy, the fastest that fits per split).

    >>> import shardwise
    >>> s = shardwise.sweep_devices("mlp", [4, 16], profile="tpu-v5p", batch=4096,
    ...                             hidden=1024, ffn=4096, dtype="bfloat16", train=True)
    >>> [p.devices for p in s.points], all(0 < p.mfu <= 1 for p in s.points)
    ([4, 16], True)
    """
    if not devices or any(n < 1 for n in devices):
        raise ArgumentError(f"device counts must be 1 or more, got {list(devices)}.")
    if remat not in (*REMAT, "auto"):
        raise ArgumentError(f"no remat policy {remat!r}; give one of {', '.join(REMAT)} or auto.")
    if remat != "none" and name != "llama":
        raise ArgumentError(f"remat {remat!r}: only model 'llama' takes a remat policy.")
    prof = load_profile(profile) if isinstance(profile, str) else profile
    settings = {"batch": batch, "train": train, "optimizer": optimizer, **dims}
    variants = remat_variants(name, tuple(REMAT) if remat == "auto" else (remat,), **settings)
    fn, args = base = remat_variants(name, ("none",), **settings)["none"]
    trains = train and optimizer is None  # (a step with its optimizer is planned as it is)
    total = model_flops(fn, args, prof, trains)
    peak = prof.flops(model_dtype(name, dims))
    seq = dims.get("seq", SEQ) if name in ("transformer", "llama") else None
    points = []
    for k, n in enumerate(sorted(set(devices))):
        if on_step is not None:
            on_step(k, len(set(devices)))
        try:
            choice = choose_mesh(*base, n, prof, train=trains, roles=roles, top=1, batch=batch,
                                 seq=seq, heads=dims.get("heads"), ffn=dims.get("ffn"),
                                 limit=limit, variants=variants)  # fmt: skip
        except ArgumentError as e:
            points.append(DevicePoint(n, skipped=str(e)))
            continue
        best = choice.candidates[0]
        assert best.seconds is not None and best.memory_bytes is not None
        mfu = total / (n * best.seconds * peak)
        points.append(DevicePoint(n, best.mesh, best.variant if remat != "none" else None,
                                  best.seconds, mfu, best.memory_bytes, best.fits,
                                  used=choice.used))  # fmt: skip
    return DeviceSweep(name, prof.name, batch, tuple(roles), total, tuple(points))
