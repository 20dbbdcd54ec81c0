"""Values as stored: check_finite checks the value after the cast, and an overflow in the cast is
counted in the log and the capture. References: numpy on the toy model's rows."""

from __future__ import annotations

import logging

import h5py
import numpy as np
import pytest
import torch
from toy_runs import toy_cfg

import hookrun
from hookrun.errors import RunError

BIG = {"big": {"at": "big", "type": "forward", "actions": [{"name": "record", "what": "output", "dtype": "float16"}]}}


def test_check_finite_checks_the_value_as_stored(tmp_path):
    hooks = {"big": {"at": "big", "type": "forward",
                     "actions": [{"name": "record", "what": "output", "dtype": "float16", "check_finite": True}]}}
    with pytest.raises(RunError, match=r"hook 'big' at big: output has \d+ non-finite value\(s\) at step 0 as stored, in float16"):
        hookrun.run(toy_cfg(tmp_path, "toy_models.Amplify", hooks))


def test_overflow_in_the_cast_is_counted_in_the_log_and_the_capture(tmp_path, caplog):
    from toy_models import Amplify, SignedRows

    cfg = toy_cfg(tmp_path, "toy_models.Amplify", BIG)
    with caplog.at_level(logging.WARNING, logger="hookrun"):
        path = hookrun.run(cfg).path
    torch.manual_seed(cfg.get("seed", 0))  # hookrun seeds before building: the same weights
    model = Amplify().eval()
    data = torch.stack([SignedRows()[i][0] for i in range(12)])
    with torch.no_grad(), np.errstate(over="ignore"):
        want = int(np.isinf(model(data).numpy().astype(np.float16)).sum())  # numpy's own cast
    assert want > 0
    with h5py.File(path) as f:
        ds = f["captures/big/big/output"]
        assert f.attrs["status"] == "complete" and ds.attrs["overflow_values"] == want
        assert int(np.isinf(ds[:]).sum()) == want
    assert f"hook 'big' at big: {want} value(s) of output became inf" in caplog.text


def test_underflow_to_zero_in_the_cast_is_counted_in_the_log_and_the_capture(tmp_path, caplog):
    """float16 flushes magnitudes below its smallest subnormal (6e-8) to 0: a gradient's scale. They were
    stored as 0 without a word (only inf was counted). Reference: numpy's own cast of the same outputs."""
    from toy_models import Scale

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), Scale(1e-7)).eval()
    x = torch.randn(6, 4)
    hooks = {"s": {"at": "1", "type": "forward", "actions": [{"name": "record", "what": "output", "dtype": "float16"}]}}
    cfg = {"data": {"batch_size": 3}, "device": "cpu", "progress": False, "hooks": hooks,
           "output": {"path": str(tmp_path / "u.h5")}}
    with caplog.at_level(logging.WARNING, logger="hookrun"):
        path = hookrun.run(cfg, model=model, dataset=[x[i] for i in range(6)]).path
    with torch.no_grad():
        out = model(x).numpy()
    want = int(((out.astype(np.float16) == 0) & (out != 0)).sum())
    assert 0 < want < out.size
    with h5py.File(path) as f:
        ds = f["captures/s/1/output"]
        assert ds.attrs["underflow_values"] == want and "overflow_values" not in ds.attrs
        assert int(((ds[:] == 0) & (out != 0)).sum()) == want
    assert f"hook 's' at 1: {want} nonzero value(s) of output became 0" in caplog.text


def test_the_underflow_count_carries_over_a_resume(tmp_path):
    """A run stopped after two of its four batches and resumed counts the underflow of all twelve rows
    once (the kept batches' count is carried over, not lost or counted twice). Reference: numpy's cast."""
    from toy_models import STOP_AT, Scale

    from hookrun.output.process import Interrupted

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), Scale(1e-7)).eval()
    x = torch.randn(12, 4)
    hooks = {"s": {"at": "1", "type": "forward", "actions": [{"name": "record", "what": "output", "dtype": "float16"}]},
             "stop": {"at": "0", "type": "forward",
                      "actions": [{"_target_": "toy_models.signal_when_told", "_partial_": True}]}}
    cfg = {"data": {"batch_size": 3}, "device": "cpu", "progress": False, "hooks": hooks,
           "output": {"path": str(tmp_path / "r.h5")}}
    STOP_AT[:] = [2]
    with pytest.raises(Interrupted):
        hookrun.run(cfg, model=model, dataset=[x[i] for i in range(12)])
    with h5py.File(tmp_path / "r.h5", "r", locking=False) as f:
        assert f.attrs["status"] == "interrupted"
    assert hookrun.run({**cfg, "resume": True}, model=model, dataset=[x[i] for i in range(12)]).status == "complete"
    with torch.no_grad():
        out = model(x).numpy()
    want = int(((out.astype(np.float16) == 0) & (out != 0)).sum())
    assert 0 < want < out.size
    with h5py.File(tmp_path / "r.h5") as f:
        ds = f["captures/s/1/output"]
        assert ds.shape == (12, 8) and ds.attrs["underflow_values"] == want
