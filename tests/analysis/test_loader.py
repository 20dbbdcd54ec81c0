"""Run.loader: shuffled batches of a cache's rows, checked against the file's rows read with h5py/numpy."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

from hookrun import open_run
from hookrun.analysis import loader as loader_mod
from hookrun.errors import ConfigError, NotFoundError
from hookrun.store import columns as chunks
from hookrun.store.h5store import H5Store
from hookrun.store.records import Capture, CaptureKey, StepRecord

N, BATCH = 1000, 64  # rows, and rows per written batch (the last one short)


def write_cache(path, n=N, start=0, seed=0, expected=N, compression="none"):
    """A hookrun file written by the store: two per-row captures, float32 (16 wide) and float16 (8 wide)."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((n, 16), dtype=np.float32)
    b = rng.standard_normal((n, 8)).astype(np.float16)
    with H5Store(path, {"config": "{}"}, expected_samples=expected and n, compression=compression) as store:
        for step, lo in enumerate(range(0, n, BATCH)):
            hi = min(lo + BATCH, n)
            caps = [Capture(CaptureKey("res", "blocks.1", "forward", "output"), torch.from_numpy(a[lo:hi]), False),
                    Capture(CaptureKey("res", "blocks.2", "forward", "output"), torch.from_numpy(b[lo:hi]), False)]
            store.write(StepRecord(step, np.arange(start + lo, start + hi), None, None, caps))
    return a, b


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """Chunks of 37 rows (float32, 64-byte rows) and 148 rows (float16): many, the last ones partial."""
    monkeypatch.setattr(chunks, "CHUNK_BYTES", 37 * 64)
    monkeypatch.setattr(chunks, "MIN_CHUNK_BYTES", 1024)
    path = tmp_path / "cache.h5"
    a, b = write_cache(path, expected=None)
    with h5py.File(path, "r") as f:  # the reference: what h5py reads from the file
        ref_a, ref_b = f["captures/res/blocks.1/output"][:], f["captures/res/blocks.2/output"][:]
        assert f["captures/res/blocks.1/output"].chunks == (37, 16) and f["captures/res/blocks.2/output"].chunks == (148, 8)
    np.testing.assert_array_equal(ref_a, a)
    return path, ref_a, ref_b


SMALL = {"block_rows": 37, "buffer_bytes": 64 * 16 * 4 * 3}  # many blocks, windows of 3 batches


def collect(rows, with_rows=True):
    got = list(rows)
    x = torch.cat([g[0] for g in got]).numpy()
    ids = torch.cat([g[1] for g in got]).numpy()
    return x, ids, [len(g[1]) for g in got]


def test_every_row_once_with_the_files_values(cache):
    path, ref_a, _ = cache
    with open_run(path) as run:
        rows = run.loader(("blocks.1", "output"), batch_size=BATCH, seed=3, with_rows=True, **SMALL)
        x, ids, sizes = collect(rows)
    assert sorted(ids.tolist()) == list(range(N))
    np.testing.assert_array_equal(x, ref_a[ids])
    assert sizes == [BATCH] * (N // BATCH) + [N % BATCH] and len(rows) == len(sizes)
    assert x.dtype == np.float32
    # shuffled across the whole file, not block by block: rows that follow each other in a batch
    # are rarely neighbours in the file, and the first batch spans the file
    assert np.mean(np.abs(np.diff(ids)) == 1) < 0.1
    assert ids[:BATCH].max() - ids[:BATCH].min() > N / 2


def test_order_depends_only_on_seed_and_epoch(cache):
    path = cache[0]
    with open_run(path) as run:
        def order(seed, epoch=0, **kw):
            rows = run.loader("res/blocks.1/output", batch_size=BATCH, seed=seed, with_rows=True, **{**SMALL, **kw})
            rows.set_epoch(epoch)
            return collect(rows)[1]
        first = order(0)
        assert np.array_equal(first, order(0))
        assert np.array_equal(first, order(0, buffer_bytes=SMALL["buffer_bytes"]))
        assert not np.array_equal(first, order(1))
        assert not np.array_equal(first, order(0, epoch=1))
        assert sorted(order(0, epoch=1).tolist()) == list(range(N))


def test_in_order_read_is_the_file(cache):
    path, ref_a, _ = cache
    with open_run(path) as run:
        x, ids, _ = collect(run.loader(("blocks.1", "output"), batch_size=100, shuffle=False, with_rows=True, **SMALL))
    np.testing.assert_array_equal(ids, np.arange(N))
    np.testing.assert_array_equal(x, ref_a)


def test_whole_file_in_one_window_is_a_uniform_permutation(cache):
    path, ref_a, _ = cache
    with open_run(path) as run:
        rows = run.loader(("blocks.1", "output"), batch_size=N, seed=5, with_rows=True)  # default buffer: whole file
        (x, ids), = list(rows)
    assert rows.window_rows >= N and sorted(ids.tolist()) == list(range(N))
    np.testing.assert_array_equal(x.numpy(), ref_a[ids.numpy()])
    assert abs(np.corrcoef(np.arange(N), ids.numpy())[0, 1]) < 0.15


def test_memory_is_one_window(cache, monkeypatch):
    path = cache[0]
    reads = []
    real = loader_mod._Source.read
    monkeypatch.setattr(loader_mod._Source, "read", lambda self, segs, n, buf=None: (reads.append(n), real(self, segs, n, buf))[1])
    with open_run(path) as run:
        rows = run.loader(("blocks.1", "output"), batch_size=BATCH, **SMALL)
        list(rows)
    assert rows.window_rows == 3 * BATCH and max(reads) == 3 * BATCH and sum(reads) == N


def test_window_buffers_reused_across_epochs_leave_kept_batches_intact(cache, monkeypatch):
    """A shuffled pass reads into the last pass's window buffers; the batches handed out before are
    copies, so keeping every batch of epoch 0 while epoch 1 runs must leave them equal to the file."""
    path, ref_a, ref_b = cache
    fresh = []
    real = loader_mod._Source.read
    monkeypatch.setattr(loader_mod._Source, "read",
                        lambda self, segs, n, buf=None: (fresh.append(buf is None), real(self, segs, n, buf))[1])
    with open_run(path) as run:
        rows = run.loader([("blocks.1", "output"), ("blocks.2", "output")], batch_size=BATCH, concat=False,
                          with_rows=True, **SMALL)
        kept = [(a.clone(), b.clone(), ids.clone(), (a, b)) for (a, b), ids in rows]
        first_pass = len(fresh)
        rows.set_epoch(1)
        again = list(rows)
    assert not any(fresh[first_pass:first_pass + 4]), "epoch 1 allocated its first windows again"
    for a0, b0, ids, (a, b) in kept:
        np.testing.assert_array_equal(a.numpy(), ref_a[ids.numpy()])  # the tensors handed out in epoch 0
        np.testing.assert_array_equal(b.numpy(), ref_b[ids.numpy()])
        assert torch.equal(a, a0) and torch.equal(b, b0)
    ids1 = torch.cat([g[1] for g in again]).numpy()
    assert sorted(ids1.tolist()) == list(range(N))
    np.testing.assert_array_equal(torch.cat([g[0][0] for g in again]).numpy(), ref_a[ids1])


def test_several_captures_concatenated_or_together(cache):
    path, ref_a, ref_b = cache
    with open_run(path) as run:
        x, ids, _ = collect(run.loader([("blocks.1", "output"), "res/blocks.2/output"], batch_size=BATCH,
                                       with_rows=True, **SMALL))
        np.testing.assert_array_equal(x, np.concatenate([ref_a, ref_b.astype(np.float32)], axis=1)[ids])
        (a, b), ids = next(iter(run.loader([("blocks.1", "output"), ("blocks.2", "output")], batch_size=BATCH,
                                           concat=False, with_rows=True, **SMALL)))
        assert a.dtype == torch.float32 and b.dtype == torch.float16
        np.testing.assert_array_equal(b.numpy(), ref_b[ids.numpy()])
        x = next(iter(run.loader(("blocks.2", "output"), batch_size=BATCH, dtype=torch.float32)))
        assert x.dtype == torch.float32 and x.shape == (BATCH, 8)


def test_compressed_file_is_read_through_hdf5(tmp_path):
    path = tmp_path / "gzip.h5"
    a, b = write_cache(path, 300, compression="gzip")
    with open_run(path) as run:
        x, ids, _ = collect(run.loader([("blocks.1", "output"), ("blocks.2", "output")], batch_size=BATCH,
                                       with_rows=True, block_rows=50))
    assert sorted(ids.tolist()) == list(range(300))
    np.testing.assert_array_equal(x, np.concatenate([a, b.astype(np.float32)], axis=1)[ids])


def test_drop_last(cache):
    path = cache[0]
    with open_run(path) as run:
        rows = run.loader(("blocks.1", "output"), batch_size=BATCH, drop_last=True, with_rows=True, **SMALL)
        _, ids, sizes = collect(rows)
    assert sizes == [BATCH] * (N // BATCH) == [BATCH] * len(rows) and len(set(ids.tolist())) == len(ids)


def test_rank_splits_are_disjoint_and_cover(cache):
    path, ref_a, _ = cache
    with open_run(path) as run:
        parts = []
        for rank in range(3):
            x, ids, _ = collect(run.loader(("blocks.1", "output"), batch_size=BATCH, seed=2, rank=rank,
                                           world_size=3, with_rows=True, **SMALL))
            np.testing.assert_array_equal(x, ref_a[ids])
            parts.append(set(ids.tolist()))
    assert sorted(len(p) for p in parts) == [333, 333, 334]
    assert set.union(*parts) == set(range(N)) and sum(len(p) for p in parts) == N


def test_dataloader_workers_share_the_rows(cache):
    path, ref_a, _ = cache
    with open_run(path) as run:
        rows = run.loader(("blocks.1", "output"), batch_size=BATCH, seed=4, with_rows=True, **SMALL)
        alone = list(rows)
        workers = list(torch.utils.data.DataLoader(rows, batch_size=None, num_workers=2))
    x = torch.cat([w[0] for w in workers]).numpy()
    ids = torch.cat([w[1] for w in workers]).numpy()
    assert sorted(ids.tolist()) == list(range(N))
    np.testing.assert_array_equal(x, ref_a[ids])
    # the same batches, handed out in another order
    assert sorted(tuple(b[1].tolist()) for b in alone) == sorted(tuple(b[1].tolist()) for b in workers)


def test_merged_view_of_several_files(tmp_path):
    """A merged view built with h5py virtual datasets over two caches reads as one file."""
    parts = [tmp_path / "part0.h5", tmp_path / "part1.h5"]
    (a0, _), (a1, _) = write_cache(parts[0], 300, 0, seed=1), write_cache(parts[1], 200, 300, seed=2)
    merged = tmp_path / "merged.h5"
    with h5py.File(merged, "w") as f:
        f.attrs["format_version"] = "1"
        f.attrs["status"] = "complete"
        f.attrs["config"] = "{}"
        for name, shape, dtype in (("captures/res/blocks.1/output", 16, np.float32), ("samples/index", None, np.int64)):
            layout = h5py.VirtualLayout(shape=(500, shape) if shape else (500,), dtype=dtype)
            at = 0
            for part, n in zip(parts, (300, 200), strict=True):
                layout[at : at + n] = h5py.VirtualSource(part.name, name, shape=(n, shape) if shape else (n,))
                at += n
            ds = f.create_virtual_dataset(name, layout, fillvalue=0)
            if shape:
                ds.attrs.update(hook="res", module="blocks.1", type="forward", role="output", call=0, rows="samples", index="")
    ref = np.concatenate([a0, a1])
    with open_run(merged) as run:
        x, ids, _ = collect(run.loader(("blocks.1", "output"), batch_size=32, seed=1, with_rows=True, **SMALL))
        assert sorted(ids.tolist()) == list(range(500))
        np.testing.assert_array_equal(x, ref[ids])
        parts[1].unlink()  # HDF5 would read its rows as zeros
        with pytest.raises(NotFoundError, match="missing source file.*part1.h5"):
            run.loader(("blocks.1", "output"))


def test_bad_requests_are_refused_in_one_line(cache, tmp_path):
    path = cache[0]
    with open_run(path) as run:
        with pytest.raises(NotFoundError, match="closest"):
            run.loader(("blocks.3", "output"))
        with pytest.raises(ConfigError, match="batch_size"):
            run.loader(("blocks.1", "output"), batch_size=0)
        with pytest.raises(ConfigError, match="rank"):
            run.loader(("blocks.1", "output"), rank=2, world_size=2)
    other = tmp_path / "short.h5"
    write_cache(other, 900)
    with h5py.File(path, "a") as f, h5py.File(other, "r") as g:
        f.create_dataset("captures/res/blocks.9/output", data=g["captures/res/blocks.1/output"][:])
        f["captures/res/blocks.9/output"].attrs.update(hook="res", module="blocks.9", type="forward", role="output",
                                                        call=0, rows="samples", index="")
    with open_run(path) as run, pytest.raises(ConfigError, match="need the same rows"):
        run.loader([("blocks.1", "output"), ("blocks.9", "output")])
