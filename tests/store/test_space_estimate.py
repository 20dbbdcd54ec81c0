"""The room a run asks for before a batch is what the batch's chunks and the file's metadata really take:
a run of one scalar per sample (a file of ~22 KB) runs on a disk with 300 KB free, and a run whose file is
~520 KB is still refused there before its first batch. Before: every capture's first batch was counted as
1 MiB, plus 1 MiB kept free, so the scalar run was refused ('the batch needs about 2097160')."""

from __future__ import annotations

import shutil
from collections import namedtuple

import h5py
import numpy as np
import pytest
import torch
from toy_runs import lin_cfg

import hookrun
from hookrun.errors import RunError
from hookrun.store import h5store

FREE = 300 << 10
Usage = namedtuple("Usage", "total used free")


class Items(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        self.x = torch.randn(n, 4, generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.x[i]


def model(width: int) -> torch.nn.Module:
    torch.manual_seed(0)
    m = torch.nn.Sequential()
    m.add_module("lin", torch.nn.Linear(4, width))
    return m


def disk_of(monkeypatch, free: int) -> None:
    """The run's disk, as the store sees it, with `free` bytes free."""
    monkeypatch.setattr(h5store.shutil, "disk_usage", lambda path: Usage(1 << 30, (1 << 30) - free, free))


def on_disk(path) -> int:
    return path.stat().st_blocks * 512


def test_a_run_of_one_scalar_per_sample_runs_where_its_file_fits(tmp_path, monkeypatch):
    disk_of(monkeypatch, FREE)
    m, items = model(1), Items(8)
    hookrun.run(lin_cfg(tmp_path), model=m, dataset=items)
    path = tmp_path / "c.h5"
    assert on_disk(path) < FREE  # the disk could hold it
    with h5py.File(path, "r") as f:  # plain h5py against the Linear called directly
        assert f.attrs["status"] == "complete"
        with torch.no_grad():
            np.testing.assert_allclose(f["captures/r/lin/output"][()], m.lin(items.x).numpy(), rtol=1e-6)


def test_a_run_whose_file_does_not_fit_is_still_refused_before_its_first_batch(tmp_path, monkeypatch):
    m, items = model(300), Items(400)  # 400 x 300 float32: 480 KB of rows in one chunk
    hookrun.run(lin_cfg(tmp_path / "room"), model=m, dataset=items)
    assert on_disk(tmp_path / "room" / "c.h5") > FREE  # what the disk would have to hold
    disk_of(monkeypatch, FREE)
    with pytest.raises(RunError, match=r"stopped before batch 0: no space left on the device \(307200 bytes free"):
        hookrun.run(lin_cfg(tmp_path / "full"), model=m, dataset=items)
    with h5py.File(tmp_path / "full" / "c.h5", "r") as f:
        assert f.attrs["status"] != "complete" and f["samples/index"].shape[0] == 0


def test_the_estimate_covers_the_file_it_was_made_for(tmp_path, monkeypatch):
    """The first batch's estimate, against the whole file's size on disk once the run ends (every row fits the
    first batch's chunks here): never below it, and not far above."""
    needs = []
    real = h5store.batch_bytes
    monkeypatch.setattr(h5store, "batch_bytes", lambda store, rec, chunk: needs.append(real(store, rec, chunk)) or needs[-1])
    for n, width in ((8, 1), (64, 2000), (400, 300)):
        needs.clear()
        folder = tmp_path / f"{n}x{width}"
        hookrun.run(lin_cfg(folder), model=model(width), dataset=Items(n))
        size = on_disk(folder / "c.h5")
        assert size <= needs[0] <= size + (128 << 10), (n, width, size, needs[0])
    assert shutil.disk_usage(tmp_path).free > 0
