"""Host memory for CPU devices: huge-page shards equal their host array and never alias it."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardwise
from shardwise._runtime.hostmem import (
    HUGE_PAGE,
    MIN_HUGE_BYTES,
    aligned_empty,
    put_cpu,
    staged,
)


@pytest.mark.parametrize("spec", [P("devices"), P(None, "devices"), P()])
def test_large_shards_land_in_aligned_private_buffers(spec):
    mesh = shardwise.mesh("devices=8")
    rows = 8 * MIN_HUGE_BYTES // (64 * 4)
    host = np.random.default_rng(0).random((rows, 64), dtype=np.float32)
    placed = put_cpu(host, NamedSharding(mesh, spec))
    assert placed.sharding == NamedSharding(mesh, spec)
    np.testing.assert_array_equal(np.asarray(placed), host)
    for shard in placed.addressable_shards:
        np.testing.assert_array_equal(np.asarray(shard.data), host[shard.index])
        # each device uses its own huge-page buffer in place (a copy would not be aligned so)
        assert shard.data.unsafe_buffer_pointer() % HUGE_PAGE == 0
    host[:] = -1  # the devices hold copies: changing the host array changes nothing
    assert float(np.asarray(placed).min()) >= 0


def test_staged_placements_reuse_the_buffers_of_the_arrays_recycled():
    """Placed one layout after another, the largest first, every later shard lands in a
    buffer of an earlier one, and holds its own values, not what was there."""
    mesh = shardwise.mesh("devices=8")
    rows = 8 * MIN_HUGE_BYTES // (64 * 4)
    rng = np.random.default_rng(1)
    first, second = (rng.random((rows, 64), dtype=np.float32) for _ in range(2))
    with staged() as staging:
        whole = put_cpu(first, NamedSharding(mesh, P()))
        used = {s.data.unsafe_buffer_pointer() for s in whole.addressable_shards}
        np.testing.assert_array_equal(np.asarray(whole), first)
        staging.recycle([whole])
        assert whole.is_deleted()
        for spec in (P("devices"), P(None, "devices"), P()):
            placed = put_cpu(second, NamedSharding(mesh, spec))
            pointers = {s.data.unsafe_buffer_pointer() for s in placed.addressable_shards}
            assert pointers <= used, spec  # no new buffer
            for shard in placed.addressable_shards:
                np.testing.assert_array_equal(np.asarray(shard.data), second[shard.index])
            staging.recycle([placed])
    # the block ended: buffers of its own (the staging, still held here, keeps its buffers)
    outside = put_cpu(second, NamedSharding(mesh, P()))
    assert not {s.data.unsafe_buffer_pointer() for s in outside.addressable_shards} & used


def test_a_replicated_array_is_judged_by_its_shard_size():
    # 2× the threshold in all: each device's shard is the whole array (replicated), so it is
    # large; split 8 ways its shards would be small
    mesh = shardwise.mesh("devices=8")
    host = np.ones((2 * MIN_HUGE_BYTES // (64 * 4), 64), dtype=np.float32)
    replicated = put_cpu(host, NamedSharding(mesh, P()))
    assert all(
        s.data.unsafe_buffer_pointer() % HUGE_PAGE == 0 for s in replicated.addressable_shards
    )
    split = put_cpu(host, NamedSharding(mesh, P("devices")))
    assert any(s.data.unsafe_buffer_pointer() % HUGE_PAGE for s in split.addressable_shards)
    np.testing.assert_array_equal(np.asarray(split), host)


def test_small_arrays_take_jax_device_put(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a small array must not get huge-page buffers")

    monkeypatch.setattr("shardwise._runtime.hostmem.aligned_empty", refuse)
    mesh = shardwise.mesh("devices=8")
    host = np.arange(64.0, dtype=np.float32).reshape(8, 8)
    placed = put_cpu(host, NamedSharding(mesh, P("devices")))
    np.testing.assert_array_equal(np.asarray(placed), host)


def test_einsum_places_host_arrays_in_huge_pages():
    from shardwise._planner.layout import plan_arrays
    from shardwise._xla.lower import place

    rows = 8 * MIN_HUGE_BYTES // (16 * 4)
    a = np.random.default_rng(1).random((rows, 16), dtype=np.float32)
    specs = ["devices", "devices"]
    plan, mesh = plan_arrays("nd,nd->n", a, a, mesh="devices=8", in_specs=specs)
    for placed in place(plan, mesh, [a, a]):
        assert all(
            s.data.unsafe_buffer_pointer() % HUGE_PAGE == 0 for s in placed.addressable_shards
        )
    out = shardwise.einsum("nd,nd->n", a, a, mesh="devices=8", in_specs=specs)
    np.testing.assert_allclose(np.asarray(out), np.einsum("nd,nd->n", a, a), rtol=1e-5)


def test_aligned_empty_is_aligned():
    for align in (64, 4096, HUGE_PAGE):
        assert aligned_empty((5, 7), np.float64, align=align).ctypes.data % align == 0
    assert jax.devices()[0].platform == "cpu"


def test_malloc_tuning_can_be_turned_off(monkeypatch):
    from shardwise._runtime import hostmem as _hostmem

    _hostmem.keep_freed_memory_warm.cache_clear()
    monkeypatch.setenv(_hostmem.MALLOC_ENV, "0")
    assert _hostmem.keep_freed_memory_warm() is False
    _hostmem.keep_freed_memory_warm.cache_clear()
    monkeypatch.delenv(_hostmem.MALLOC_ENV)
    import platform

    took = _hostmem.keep_freed_memory_warm()
    assert took == (platform.libc_ver()[0] == "glibc")


@pytest.mark.parametrize(
    ("environ", "libc", "thp", "expected"),
    [
        ({}, "glibc 2.36", "always [madvise] never", "glibc.malloc.hugetlb=1"),
        (
            {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"},
            "glibc 2.35",
            "always [madvise] never",
            "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1",
        ),
        (
            {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"},
            "glibc 2.36",
            "always [madvise] never",
            None,
        ),
        ({"SHARDWISE_MALLOC_TUNING": "0"}, "glibc 2.36", "always [madvise] never", None),
        ({}, "glibc 2.34", "always [madvise] never", None),  # no such tunable yet
        ({}, None, "always [madvise] never", None),  # not glibc (musl answers no version)
        ({}, "glibc 2.36", "[always] madvise never", None),  # huge pages without asking
        ({}, "glibc 2.36", "always madvise [never]", None),
        ({}, "glibc 2.36", None, None),
    ],
)
def test_huge_page_environ(environ, libc, thp, expected):
    from shardwise._runtime.hostmem import huge_page_environ

    env = huge_page_environ(environ, libc, thp)
    if expected is None:
        assert env is None
    else:
        assert env == {**environ, "GLIBC_TUNABLES": expected}


def test_the_command_reruns_itself_once_with_huge_pages():
    import os
    import subprocess
    import sys

    from shardwise._runtime.hostmem import huge_page_environ, huge_page_facts

    code = (
        "import os\n"
        "print('start', os.environ.get('GLIBC_TUNABLES'), flush=True)\n"
        "from shardwise._runtime.hostmem import rerun_with_huge_pages\n"
        "rerun_with_huge_pages()\n"
        "print('ran', flush=True)\n"
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("GLIBC_TUNABLES", "SHARDWISE_MALLOC_TUNING")
    }
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    if huge_page_environ(env, *huge_page_facts()) is None:
        assert lines == ["start None", "ran"]
    else:  # once as started, once with the setting; then it runs on
        assert lines == ["start None", "start glibc.malloc.hugetlb=1", "ran"]
    # asked not to: runs on as it is
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "SHARDWISE_MALLOC_TUNING": "0"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.stdout.splitlines() == ["start None", "ran"]


def test_the_command_restarts_before_it_imports_jax():
    """Restarted with huge pages, the command had imported itself and JAX (a second) first,
    and did it all again after the restart."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "shardwise", "--version"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("shardwise")
    imported = [line for line in done.stderr.splitlines() if line.split("|")[-1].strip() == "jax"]
    assert len(imported) == 1, imported
