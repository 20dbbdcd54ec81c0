"""early_stop learns where to stop from a one-sample probe, so no batch (the first included)
computes what the cache does not need; a batch that runs otherwise than the probe is refused.
References: the same model called directly, a hand count of what its head sees, plain h5py."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch
from torch import nn
from toy_runs import toy_cfg

import hookrun
from hookrun.errors import RunError


class HeadSizes(nn.Module):
    """Notes the batch size of every call of its head (the part early_stop should skip)."""

    seen: list[int] = []

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Linear(4, 8)
        self.head = nn.Linear(8, 3)
        self.head.register_forward_pre_hook(lambda m, args: HeadSizes.seen.append(int(args[0].shape[0])))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.body(x)))


def test_no_batch_runs_the_head_only_the_one_sample_probe(tmp_path):
    model = HeadSizes()
    data = torch.utils.data.TensorDataset(torch.randn(10, 4), torch.zeros(10, dtype=torch.long))
    cfg = {"data": {"batch_size": 4}, "device": "cpu", "early_stop": True, "progress": False,
           "hooks": {"b": {"at": "body", "type": "forward", "actions": [{"name": "record", "what": "output"}]}},
           "output": {"path": str(tmp_path / "c.h5")}}
    HeadSizes.seen = []
    hookrun.run(cfg, model=model, dataset=data)
    assert HeadSizes.seen == [1]  # the probe's one sample; batches 0, 1 and 2 stop after body
    with h5py.File(tmp_path / "c.h5") as f:
        np.testing.assert_array_equal(f["samples/index"][:], np.arange(10))  # the probe adds no row
        with torch.no_grad():
            want = model.body(data.tensors[0]).numpy()
        np.testing.assert_allclose(f["captures/b/body/output"][:], want, rtol=1e-6, atol=1e-7)
        assert f.attrs["status"] == "complete"


def test_early_stop_refuses_a_module_that_runs_again_after_the_stop_point(tmp_path):
    hooks = {"m": {"at": "m", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
    cfg = toy_cfg(tmp_path, "toy_models.RepeatWhenNegative", hooks, early_stop=True)
    with pytest.raises(RunError, match=r"early_stop: in batch 1 the forward goes on to a Linear after the stop point"):
        hookrun.run(cfg)
    with h5py.File(tmp_path / "captures.h5") as f:
        assert f.attrs["status"] == "failed" and f.attrs["steps_complete"] == 1


def test_early_stop_refuses_a_batch_that_fires_fewer_calls(tmp_path):
    hooks = {"m": {"at": "m", "type": "forward", "actions": [{"name": "record", "what": "output"}]},
             "h": {"at": "head", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
    cfg = toy_cfg(tmp_path, "toy_models.RepeatWhenNegative", hooks, early_stop=True)
    cfg["data"]["dataset"] = {"_target_": "toy_models.SignedRows"}
    cfg["data"]["batch_size"] = 4
    with pytest.raises(RunError, match=r"early_stop: batch 1 fires hook 'm' at m \(call 1\) where the probe \(the dataset's first sample\) fired hook 'h' at head"):
        hookrun.run(cfg)
