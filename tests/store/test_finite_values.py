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
