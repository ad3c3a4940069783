"""The tutorial's scenarios, on current JAX: batched dot products on 1-D and 2-D meshes.

- S1: (10⁷, 3) vectors on ``devices=8``, v1 split along the batch, v2 replicated: no collectives.
- S2: the same with both split along the batch.
- S3: 1,000 pairs of 10,000-component vectors split along the components: each device computes
  partial dot products, and a ``psum`` (an all-reduce) adds them up.
- S4: (4000, 10000) on a 2×4 mesh, both inputs ``P('x', 'y')``, output ``P('x')``: one
  all-reduce over ``y``.
"""

from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import jax
import numpy as np

from shardwise._errors import ArgumentError
from shardwise._extras import available, install_hint, require
from shardwise._model.mesh import MeshSpec, build_mesh
from shardwise._model.plan import Mode, Plan
from shardwise._runtime.devices import device_summary
from shardwise._runtime.distributed import multi_process, to_host
from shardwise._xla.check import Check, check_einsum
from shardwise._xla.explain import Explanation, compile_plan, explain_compiled
from shardwise._xla.lower import place

Size = Literal["tutorial", "small"]
SIZES: tuple[Size, ...] = ("tutorial", "small")


@dataclass(frozen=True, slots=True)
class Scenario:
    """One of the tutorial's computations: what to run and what the tutorial says happens."""

    name: str
    title: str
    equation: str
    shapes: tuple[tuple[int, ...], ...]
    mesh: MeshSpec
    in_specs: tuple[str | None, ...]
    out_spec: str | None
    mode: Mode
    expect: str

    def plan(self) -> Plan:
        return Plan.make(
            self.equation,
            self.shapes,
            mesh=self.mesh,
            in_specs=self.in_specs,
            out_specs=self.out_spec,
            mode=self.mode,
        )


DEMO_DEVICES = 8
"""The devices the tutorial's scenarios run on: a line of 8, and a 2 × 4 grid."""


def check_devices(what: str) -> None:
    """Refuse fewer devices than :data:`DEMO_DEVICES`, saying that ``what`` (the demo's
    scenarios, bench's workloads) needs them: it had been said as a mesh 'devices=8' the user
    never gave."""
    have = jax.device_count()
    if have < DEMO_DEVICES:
        raise ArgumentError(
            f"{what} run on {DEMO_DEVICES} devices (a line of {DEMO_DEVICES} and a 2 × 4 "
            f"grid), but {have} are available; simulate {DEMO_DEVICES} or more CPU devices "
            f"(--devices {DEMO_DEVICES})."
        )


def scenarios(size: Size = "tutorial") -> list[Scenario]:
    """The four scenarios at the tutorial's sizes or at a quick, small size."""
    small = size == "small"
    n1 = 8_000 if small else 10_000_000
    pairs, comps = (64, 800) if small else (1_000, 10_000)
    rows, cols = (400, 1_000) if small else (4_000, 10_000)
    line = MeshSpec.parse(f"devices={DEMO_DEVICES}")
    grid = MeshSpec.parse("x=2,y=4")
    return [
        Scenario(
            "S1",
            "batch-sharded v1, replicated v2",
            "nd,nd->n",
            ((n1, 3),) * 2,
            line,
            ("devices", None),
            "devices",
            "auto",
            "no collectives",
        ),
        Scenario(
            "S2",
            "both batch-sharded",
            "nd,nd->n",
            ((n1, 3),) * 2,
            line,
            ("devices", "devices"),
            "devices",
            "auto",
            "no collectives",
        ),
        Scenario(
            "S3",
            "component-sharded, partial dots + psum",
            "nd,nd->n",
            ((pairs, comps),) * 2,
            line,
            ("-,devices", "-,devices"),
            None,
            "manual",
            "one all-reduce over devices",
        ),
        Scenario(
            "S4",
            "2×4 mesh, P('x','y') → P('x')",
            "nd,nd->n",
            ((rows, cols),) * 2,
            grid,
            ("x,y", "x,y"),
            "x",
            "auto",
            "one all-reduce over y",
        ),
    ]


@dataclass(frozen=True, slots=True)
class Outcome:
    """What running one scenario gave."""

    scenario: Scenario
    explanation: Explanation
    check: Check
    sharding_ok: bool
    seconds: float
    compile_seconds: float

    @property
    def ok(self) -> bool:
        return self.check.ok and self.sharding_ok

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.scenario.name,
            "title": self.scenario.title,
            "ok": self.ok,
            "max_abs_error": self.check.max_abs_error,
            "tolerance": self.check.tolerance,
            "seconds": self.seconds,
            "compile_seconds": self.compile_seconds,
            "expect": self.scenario.expect,
            "explain": self.explanation.to_json(),
        }


def run_scenario(scenario: Scenario, repeat: int = 3, seed: int = 0) -> Outcome:
    """Compile, run and check one scenario; time is the median of ``repeat`` warm runs."""
    plan = scenario.plan()
    mesh = build_mesh(plan.mesh)
    rng = np.random.default_rng(seed)
    arrays = [rng.random(shape, dtype=np.float32) for shape in plan.shapes]
    start = time.perf_counter()
    compiled = compile_plan(plan, mesh, "highest")
    compile_seconds = time.perf_counter() - start
    placed = place(plan, mesh, arrays)
    jax.block_until_ready(placed)
    result = compiled(*placed).block_until_ready()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        compiled(*placed).block_until_ready()
        times.append(time.perf_counter() - start)
    expected_sharding = jax.sharding.NamedSharding(mesh, plan.out_spec.to_partition_spec())
    sharding_ok = result.sharding.is_equivalent_to(expected_sharding, len(plan.output_shape))
    return Outcome(
        scenario=scenario,
        explanation=explain_compiled(plan, compiled, mesh),
        check=check_einsum(plan.op, arrays, to_host(result)),
        sharding_ok=bool(sharding_ok),
        seconds=statistics.median(times),
        compile_seconds=compile_seconds,
    )


def run_s5(size: Size = "tutorial", seed: int = 0) -> dict[str, Any]:
    """S5, the tutorial's Dask workloads: ``data.mean()`` and ``dot(data, data).mean()`` of a
    chunked (10000, 10000) float64 array, each block run through JAX on the mesh, checked
    against Dask alone on the same data.

    shardwise writes ``dot(data, data).mean()`` as the one contraction ``ij,jk->`` divided
    by N²; summing each operand over the index only it has first makes it O(N²) where
    Dask's ``dot`` forms the N×N product in O(N³). Each is run once untimed first (it
    compiles the blocks' programs; reported as ``first_run_seconds``), as S1–S4 time runs
    after compilation; times are medians of 5 runs taking turns with Dask's (3 of ours and
    one of Dask's for the dot, whose O(N³) product is slow).
    """
    da = require("dask.array", "S5, the tutorial's Dask workloads,")

    from shardwise._api import einsum, mean

    n, chunk = (2000, 500) if size == "small" else (10000, 1000)
    data = da.random.default_rng(seed).random((n, n), chunks=(chunk, chunk)).persist()
    parts: list[dict[str, Any]] = []
    # (name, ours, Dask alone, terms per result, Dask's runs: its dot takes ~25 s, once)
    workloads: tuple[tuple[str, Callable[[], Any], Callable[[], Any], int, int], ...] = (
        ("data.mean()", lambda: mean(data), lambda: data.mean(), n * n, 5),
        (
            "dot(data, data).mean()",
            lambda: einsum("ij,jk->", data, data) / n**2,
            lambda: da.dot(data, data).mean(),
            n**3,
            1,
        ),
    )

    def timed(make: Callable[[], Any]) -> tuple[float, float]:
        start = time.perf_counter()
        value = float(make().compute())
        return value, time.perf_counter() - start

    for name, ours, theirs, terms, runs in workloads:
        value, first_s = timed(ours)  # the first run compiles each block's program
        ours_times, dask_times = [], []
        with warnings.catch_warnings():  # Dask's own note that its dot multiplies chunks
            warnings.simplefilter("ignore", da.PerformanceWarning)
            for _ in range(runs):  # taking turns, as the benchmarks do
                value, seconds = timed(ours)
                ours_times.append(seconds)
                reference, seconds = timed(theirs)
                dask_times.append(seconds)
        for _ in range(3 - runs):
            ours_times.append(timed(ours)[1])
        ours_s, dask_s = statistics.median(ours_times), statistics.median(dask_times)
        error = abs(value - reference)
        tolerance = (terms + 2) * float(np.finfo(np.float64).eps) * abs(reference)
        parts.append(
            {
                "name": name,
                "value": value,
                "dask_value": reference,
                "max_abs_error": error,
                "ok": error <= tolerance,
                "seconds": ours_s,
                "first_run_seconds": first_s,
                "dask_seconds": dask_s,
            }
        )
    return {
        "name": "S5",
        "title": f"the tutorial's Dask workloads on ({n}, {n}) float64, {chunk}×{chunk} chunks",
        "ok": all(p["ok"] for p in parts),
        "max_abs_error": max(p["max_abs_error"] for p in parts),
        "seconds": sum(p["seconds"] for p in parts),
        "dask_seconds": sum(p["dask_seconds"] for p in parts),
        "parts": parts,
        "explain": None,
    }


def run_demo(
    size: Size = "tutorial",
    repeat: int = 3,
    on_start: Callable[[Scenario], None] | None = None,
    pictures: Path | None = None,
    with_dask: bool | None = None,
) -> dict[str, Any]:
    """Run every scenario; the ``shardwise demo --json`` document.

    With ``pictures``, also draw each scenario's data flow to ``<pictures>/<name>.png`` and
    ``.svg`` (needs the ``pictures`` extra).
    """
    check_devices("the tutorial's scenarios")
    skipped = []
    if with_dask is None:
        # blocks run in whatever order Dask picks, but across processes every process must
        # run the same programs in the same order: S5 runs on one process only
        if multi_process():
            skipped.append({"name": "S5", "why": "the mesh spans several processes"})
        elif not (available("dask") and available("distributed")):
            why = f"Dask is not installed; install it with {install_hint('dask')}"
            skipped.append({"name": "S5", "why": why})
        with_dask = not skipped
    outcomes = []
    if pictures is not None:  # (the folder asked for; a picture's own path must exist)
        pictures.mkdir(parents=True, exist_ok=True)
    for scenario in scenarios(size):
        if on_start is not None:
            on_start(scenario)
        outcome = run_scenario(scenario, repeat=repeat)
        outcomes.append(outcome)
        if pictures is not None:
            from shardwise.render.figure import save

            for suffix in ("png", "svg"):
                save(outcome.explanation, pictures / f"{scenario.name}.{suffix}")
    found = [o.to_json() for o in outcomes]
    if with_dask:
        if on_start is not None:
            on_start(
                Scenario(
                    "S5",
                    "the tutorial's Dask workloads",
                    "ij->",
                    (),
                    MeshSpec.parse("devices=1"),
                    (),
                    None,
                    "auto",
                    "blocks on the mesh",
                )
            )
        found.append(run_s5(size))
    return {
        "devices": device_summary() | {"used": DEMO_DEVICES},
        "size": size,
        "ok": all(s["ok"] for s in found),
        "scenarios": found,
        "skipped": skipped,
    }
