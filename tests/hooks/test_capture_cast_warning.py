"""hookrun.capture(model, hooks, dtype="float16"): values float16 cannot hold (above 65504: inf; nonzero
below its smallest subnormal: 0) are said in one warning per capture at the block's end, with the
count a file run's end report gives; they were stored as inf and 0 without a word. Reference: the
module called directly, and numpy's count of the values beyond float16's range."""

from __future__ import annotations

import logging

import numpy as np
import torch

import hookrun


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8))
    with torch.no_grad():
        model[0].weight.mul_(torch.tensor([1e6] * 3 + [1e-9] * 2 + [1.0] * 3)[:, None])  # rows: big, tiny, plain
        model[0].bias.zero_()
    return model.eval()


def test_capture_in_float16_says_how_many_values_became_inf_or_0(caplog):
    model, x = _model(), torch.randn(5, 6)
    with torch.no_grad():
        ref = model[0](x).numpy()  # the submodule called directly, float32
    hooks = {"f": {"at": "0", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
    with caplog.at_level(logging.WARNING, logger="hookrun"), torch.no_grad(), \
            hookrun.capture(model, hooks, dtype="float16") as cap:
        model(x[:3])
        model(x[3:])
    got = cap["0", "output"].numpy()
    over = int((np.abs(ref) > 65504).sum())
    under = int(((ref != 0) & (np.abs(ref) < 2.0 ** -25)).sum())
    assert over > 0 and under > 0
    assert int(np.isinf(got).sum()) == over and np.array_equal(got, ref.astype(np.float16))
    text = caplog.text
    assert f"hook 'f' at 0: {over} value(s) of output became inf when stored as the record dtype" in text
    assert f"hook 'f' at 0: {under} nonzero value(s) of output became 0 when stored as the record dtype" in text


def test_capture_that_keeps_the_dtype_says_nothing(caplog):
    model, x = _model(), torch.randn(5, 6)
    hooks = {"f": {"at": "0", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
    with caplog.at_level(logging.WARNING, logger="hookrun"), torch.no_grad(), hookrun.capture(model, hooks) as cap:
        model(x)
    with torch.no_grad():
        assert torch.equal(cap["0", "output"], model[0](x))
    assert "record dtype" not in caplog.text
