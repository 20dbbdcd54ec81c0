"""A tensor whose dtype changes from batch to batch (a model under autocast on some batches): its capture's
column takes the first batch's dtype, and a later batch's rows it cannot hold were cast into it without
a word (float64 values of 1e6 stored as inf in a float16 column). Now such a batch ends the run failed in
one line naming both dtypes and the setting that stores one; rows it can hold (float16 into float32) are
stored exactly. Reference: the model's outputs from a raw forward hook."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

import hookrun
from hookrun.errors import RunError


class Switching(torch.nn.Module):
    """Its output's dtype: `dtypes[k]` at its k-th call, scaled by `scale`."""

    def __init__(self, dtypes, scale):
        super().__init__()
        torch.manual_seed(0)
        self.lin, self.dtypes, self.scale, self.calls = torch.nn.Linear(4, 4), dtypes, scale, 0

    def forward(self, x):
        self.calls += 1
        return self.lin(x).to(self.dtypes[min(self.calls, len(self.dtypes)) - 1]) * self.scale


def run(tmp_path, model):
    data = [torch.randn(4, generator=torch.Generator().manual_seed(i)) for i in range(8)]
    path = tmp_path / "d.h5"
    hookrun.run({"hooks": {"r": {"at": "", "type": "forward", "actions": ["record"]}}, "data": {"batch_size": 4},
                 "device": "cpu", "progress": False, "output": {"path": str(path)}}, model=model, dataset=data)
    return path, torch.stack(data)


def test_rows_a_capture_cannot_hold_end_the_run_failed_in_one_line(tmp_path):
    with pytest.raises(RunError) as err:
        run(tmp_path, Switching([torch.float16, torch.float64], 1.0))
    assert str(err.value) == ("captures/r/__model__/output: batch 1 gives float64 rows, earlier batches float16 (the capture's "
                              "dtype, which cannot hold them); store one dtype: the record's dtype: float64, or "
                              "output.dtype=float64")
    with h5py.File(tmp_path / "d.h5", "r") as f:
        assert f.attrs["status"] == "failed"


def test_rows_a_capture_can_hold_are_stored_exactly(tmp_path):
    model = Switching([torch.float32, torch.float16], 1.0)
    path, x = run(tmp_path, model)
    want = []
    model.calls = 0
    h = model.register_forward_hook(lambda m, a, o: want.append(o.detach().clone()))
    with torch.no_grad():
        model(x[:4]), model(x[4:])
    h.remove()
    with h5py.File(path, "r") as f:
        got = f["captures/r/__model__/output"]
        assert got.dtype == np.float32 and f.attrs["status"] == "complete"
        np.testing.assert_array_equal(got[:], torch.cat([w.float() for w in want]).numpy())
