"""Run.iter with a batch_size below 1 or not whole: -5 yielded nothing at all (range() with a negative
step), as if the capture were empty, and 0 raised range()'s ValueError. Now one ConfigError line;
a whole batch_size reads every row. Reference: the dataset read with plain h5py, and the model called
directly."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

import hookrun
from hookrun.errors import ConfigError

torch.manual_seed(0)
MODEL = torch.nn.Sequential(torch.nn.Linear(4, 3))
ITEMS = [torch.randn(4) for _ in range(7)]


def test_iter_reads_every_row_and_refuses_a_batch_size_below_one(tmp_path):
    path = tmp_path / "c.h5"
    hookrun.run({"hooks": {"h": {"at": "0", "type": "forward"}}, "progress": False, "data": {"batch_size": 2},
                 "output": {"path": str(path)}}, model=MODEL, dataset=ITEMS)
    with hookrun.open_run(path) as run:
        got = np.concatenate(list(run.iter("h", "0", "output", batch_size=3)))
        with torch.no_grad():
            np.testing.assert_allclose(got, MODEL(torch.stack(ITEMS)).numpy(), rtol=1e-6)
        with h5py.File(path, "r", locking=False) as f:
            np.testing.assert_array_equal(got, f["captures/h/0/output"][:])
        for bad in (-5, 0, 2.5):
            with pytest.raises(ConfigError) as exc:
                list(run.iter("h", "0", "output", batch_size=bad))
            assert str(exc.value) == f"iter: batch_size must be a whole number of rows, at least 1, got {bad!r}"
