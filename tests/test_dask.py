"""Dask arrays: each block through JAX on the mesh, locally and on dask.distributed workers."""

from __future__ import annotations

import numpy as np
import pytest

import shardwise

da = pytest.importorskip("dask.array")


@pytest.mark.parametrize(
    ("equation", "shapes", "chunks"),
    [
        ("ij,jk->ik", [(40, 30), (30, 20)], (10, 10)),
        ("ij,jk->", [(40, 30), (30, 20)], (10, 10)),
        ("nd,nd->n", [(64, 6), (64, 6)], (16, 3)),
        ("nd,nd->n", [(64, 100), (64, 100)], (16, 50)),  # long rows: the native kernel
        ("ij->", [(40, 30)], (10, 15)),
        ("ij->j", [(40, 30)], (10, 15)),
        ("i,j->ij", [(12,), (8,)], (4,)),
    ],
)
def test_dask_einsum_equals_numpy(equation, shapes, chunks):
    rng = np.random.default_rng(0)
    arrays = [rng.random(s) for s in shapes]
    lazy = [da.from_array(a, chunks=chunks[: a.ndim]) for a in arrays]
    result = shardwise.einsum(equation, *lazy, mesh="devices=8")
    assert hasattr(result, "compute")
    got = result.compute()
    np.testing.assert_allclose(got, np.einsum(equation, *arrays), rtol=1e-12)
    assert np.asarray(got).dtype == np.float64  # float64 blocks stay float64


def test_mean_of_numpy_jax_and_dask():
    x = np.random.default_rng(1).random((64, 16))
    assert float(shardwise.mean(x, mesh="devices=8")) == pytest.approx(x.mean(), rel=1e-12)
    d = da.from_array(x, chunks=(16, 8))
    assert float(shardwise.mean(d).compute()) == pytest.approx(x.mean(), rel=1e-12)


@pytest.mark.parametrize("dtype", ["int8", "uint8", "bool", "float16", "bfloat16", "int32"])
def test_a_mean_is_numpys_in_value_and_type_for_every_dtype(dtype):
    """An int8 mean had summed in int8 and wrapped (−2.5e−6 for 49.5), a bool mean had been
    a logical or, a float16 one inf; Dask's int8 mean had changed from run to run (each
    block's sum depended on its alignment)."""
    import ml_dtypes

    kind = np.dtype(getattr(ml_dtypes, dtype, dtype))
    x = (np.random.default_rng(0).random((800, 1000)) * 100).astype(kind)
    if dtype == "float16":
        x = np.full((1000, 100), 1000.0, kind)
    want = x.astype(np.float64).mean()  # (NumPy's own bfloat16 mean sums in bfloat16: 0.04)
    got = shardwise.mean(x, mesh="devices=8")
    assert np.dtype(got.dtype) == x.mean().dtype
    np.testing.assert_allclose(float(got), float(want), rtol=1e-2 if kind.itemsize < 4 else 1e-6)
    d = da.from_array(x, chunks=(100, 250))
    lazy = shardwise.mean(d)
    firsts = [float(lazy.compute()) for _ in range(2)]
    assert firsts[0] == firsts[1]
    np.testing.assert_allclose(firsts[0], float(want), rtol=1e-2 if kind.itemsize < 4 else 1e-6)
    if dtype == "int8":  # einsum keeps NumPy's einsum's type: its sum wraps alike
        assert int(shardwise.einsum("ij->", d).compute()) == int(np.einsum("ij->", x))


def test_mean_is_one_program_with_the_sum_and_the_division():
    import jax

    from shardwise._planner.layout import plan_arrays
    from shardwise._xla.lower import mean_program, place

    x = np.random.default_rng(3).random((64, 15)).astype(np.float32)
    plan, jm = plan_arrays("ij->", x, mesh="devices=8", layout="i=devices")
    (px,) = place(plan, jm, [x])
    hlo = mean_program(x.size, "float32", "float32").lower(px).compile().as_text()
    # XLA may turn the division by a constant into a product with its reciprocal
    assert hlo.count("all-reduce(") == 1 and '/div"' in hlo
    got = shardwise.mean(px, mesh=jm)
    assert isinstance(got, jax.Array) and got.sharding.is_fully_replicated
    assert float(got) == pytest.approx(x.mean(dtype=np.float64), rel=1e-6)
    # a second mean of another shape reuses nothing it should not
    y = np.arange(12.0).reshape(3, 4)
    assert float(shardwise.mean(y, mesh="devices=1")) == pytest.approx(5.5)


def test_dask_rejects_explicit_layouts():
    d = da.ones((8, 8), chunks=(4, 4))
    with pytest.raises(shardwise.ArgumentError, match="planner's best layout"):
        shardwise.einsum("ij->", d, mesh="devices=8", layout="i=devices")


def test_blocks_run_on_distributed_workers():
    distributed = pytest.importorskip("distributed")
    with (
        distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            env={"SHARDWISE_CPU_DEVICES": "2"},
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        x = np.random.default_rng(2).random((400, 300))
        d = da.from_array(x, chunks=(100, 100))
        from shardwise._data.dask import _local_mesh

        _local_mesh.cache_clear()
        got = shardwise.einsum("ij,jk->ik", d, d.T).compute()
        np.testing.assert_allclose(got, x @ x.T, rtol=1e-12)
        # each block built its mesh, and ran, in a worker process, not here
        built = client.run(lambda: _local_mesh.cache_info().misses)
        assert sum(built.values()) >= 1
        assert _local_mesh.cache_info().misses == 0
        devices = client.run(lambda: _local_mesh(None).devices.size)
        assert set(devices.values()) == {2}
        # with a cluster, a mean is not grouped (that would move blocks between workers)
        from shardwise._data.dask import _client_active, _grouped_sum

        assert _client_active()
        assert _grouped_sum(d, None, d.dtype) is None
        assert float(shardwise.mean(d).compute()) == pytest.approx(x.mean(), rel=1e-12)


@pytest.mark.parametrize("split", [True, False])
def test_large_blocks_split_over_the_mesh_small_ones_run_whole(monkeypatch, split):
    from shardwise._data import dask as _dask

    if split:  # every block counts as large: sharded over the whole mesh
        monkeypatch.setattr(_dask, "SPLIT_MIN_BYTES", 0)
    calls = []
    real = _dask._program
    monkeypatch.setattr(_dask, "_program", lambda *a: calls.append(a) or real(*a))
    rng = np.random.default_rng(3)
    x, y = rng.random((64, 48)), rng.random((48, 32))
    got = shardwise.einsum(
        "ij,jk->ik", da.from_array(x, chunks=(16, 16)), da.from_array(y, chunks=(16, 16))
    )
    np.testing.assert_allclose(got.compute(), x @ y, rtol=1e-12)
    assert bool(calls) is not split  # whole blocks on single devices use _program


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int32])
@pytest.mark.parametrize("offset", range(0, 9))
def test_sums_in_place_at_any_alignment(dtype, offset):
    import jax

    from shardwise._data.dask import _sum_in_place

    raw = np.arange(1, 2000, dtype=dtype)
    block = raw[offset : offset + 1500]  # starts 0..8 elements past an allocation's start
    with jax.enable_x64(True):
        got = np.asarray(_sum_in_place(block, jax.devices()[offset % 8], 2))
    assert got.shape == (1, 1)
    assert got[0, 0] == pytest.approx(block.sum(dtype=np.float64), rel=1e-6)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("chunks", [(10, 15), (7, 9), (40, 30)])
def test_full_sums_run_as_groups_of_blocks(monkeypatch, dtype, chunks):
    from shardwise._data import dask as _dask

    groups = []
    real = _dask._sum_group
    monkeypatch.setattr(
        _dask, "_sum_group", lambda *b, spec: groups.append(len(b)) or real(*b, spec=spec)
    )
    x = np.random.default_rng(4).random((40, 30)).astype(dtype)
    d = da.from_array(x, chunks=chunks)
    got = float(shardwise.einsum("ij->", d, mesh="devices=8").compute())
    assert got == pytest.approx(
        float(x.sum(dtype=np.float64)), rel=1e-12 if dtype == np.float64 else 1e-5
    )
    if d.npartitions > 1:  # every block summed once, in groups of at most two per device
        assert sum(groups) == d.npartitions and max(groups) <= 16
    else:
        assert not groups


@pytest.mark.parametrize("split", [True, False])
def test_blocks_of_mixed_dtypes_give_numpys_dtype(monkeypatch, split):
    from shardwise._data import dask as sw_dask

    # large blocks run split over the mesh; small ones whole on one device
    monkeypatch.setattr(sw_dask, "SPLIT_MIN_BYTES", 0 if split else 1 << 40)
    big = np.full((4, 8), 2**31 - 1, np.int32)
    wide = np.full((8, 4), 2**32 - 1, np.uint32)
    got = shardwise.einsum(
        "ij,jk->ik", da.from_array(big, chunks=(2, 4)), da.from_array(wide, chunks=(4, 2))
    ).compute()
    want = np.einsum("ij,jk->ik", big, wide)  # int64: int32 would wrap around
    assert got.dtype == want.dtype == np.int64
    np.testing.assert_array_equal(got, want)
    x = np.arange(32, dtype=np.int32).reshape(4, 8)
    y = np.linspace(0, 1, 32, dtype=np.float32).reshape(8, 4) + np.float32(1e-7)
    got = shardwise.einsum(
        "ij,jk->ik", da.from_array(x, chunks=(2, 4)), da.from_array(y, chunks=(4, 2))
    ).compute()
    want = np.einsum("ij,jk->ik", x, y)
    assert got.dtype == want.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=1e-12)


@pytest.mark.parametrize(
    ("equation", "shapes", "dtype", "fill"),
    [
        ("ij,jk->ik", [(40, 30), (30, 20)], np.int8, 3),  # 270 per element: wraps in int8
        ("ij,jk->ik", [(40, 30), (30, 20)], np.bool_, True),
        ("ij->", [(40, 30)], np.bool_, True),
        ("ij->", [(40, 30)], np.uint8, 200),
        ("ij->i", [(40, 30)], np.int8, 100),
    ],
)
def test_small_integer_and_bool_blocks_keep_numpys_dtype(equation, shapes, dtype, fill):
    """The partial sums over blocks are added in the result's dtype, as NumPy's einsum adds:
    adding them with a plain ``sum`` widened int8, uint8 and bool to 64-bit integers."""
    arrays = [np.full(s, fill, dtype) for s in shapes]
    lazy = [da.from_array(a, chunks=10) for a in arrays]
    got = np.asarray(shardwise.einsum(equation, *lazy, mesh="x=2,y=4").compute())
    want = np.einsum(equation, *arrays)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    np.testing.assert_array_equal(got, want)


def test_a_dask_array_of_unknown_chunk_sizes_says_how_to_know_them():
    """A masked selection's chunks are NaN long: a raw "cannot convert float NaN to integer"
    had escaped from the einsum's sizes."""
    x = da.from_array(np.random.default_rng(0).random((64, 8)), chunks=(16, 8))
    y = x[x[:, 0] > 0.5]
    for call in (lambda: shardwise.mean(y), lambda: shardwise.einsum("ij,ij->", y, y)):
        with pytest.raises(shardwise.ShapeError, match=r"compute_chunk_sizes\(\)"):
            call()
    y.compute_chunk_sizes()
    np.testing.assert_allclose(float(shardwise.mean(y).compute()), float(y.mean().compute()))


@pytest.mark.parametrize(
    ("equation", "arrays"),
    [
        ("l,->", [np.array([True, True, True, False]), np.float64(2.0)]),
        ("ij,j->", [np.ones((4, 3), bool), np.ones(3)]),
        ("ij,jk->", [np.ones((4, 3), np.int8) * 100, np.ones((3, 2), np.int32)]),
    ],
    ids=["bool-scalar", "bool-float", "int8-int32"],
)
def test_an_operand_summed_on_its_own_is_summed_in_the_products_type(equation, arrays):
    # each operand is summed over the indices only it has first: in its own type a bool
    # sum had been a logical or (2.0 for NumPy's 6.0) and an int8 one would wrap
    lazy = [da.from_array(a, chunks=2) if a.ndim else a for a in arrays]
    got = shardwise.einsum(equation, *lazy, mesh="x=8").compute()
    want = np.einsum(equation, *arrays)
    assert np.asarray(got).dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_a_list_beside_a_dask_array_is_refused_as_without_dask():
    with pytest.raises(shardwise.ArgumentTypeError, match="operand 0 is a list"):
        shardwise.einsum("n,n->", [1.0, 2.0], da.ones(2, chunks=1), mesh="x=2")


@pytest.mark.parametrize("shape", [(5, 3), (7,), (3, 5, 16), (1, 1)])
def test_a_mean_of_a_shape_the_mesh_does_not_divide_is_numpys(shape):
    # the first dimension split over all 8 devices does not divide these: mean takes the
    # planner's layout (it had refused them, advising a spec mean takes no argument for)
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    np.testing.assert_allclose(float(shardwise.mean(x, mesh="x=8")), np.mean(x), rtol=1e-6)
