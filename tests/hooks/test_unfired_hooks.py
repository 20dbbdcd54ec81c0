"""Hooks that never fire are named (the log, the file, capture's warning), and a glob over every
module skips, and lists, a module whose output holds no tensor. Reference: the toy models' own structure."""

from __future__ import annotations

import logging

import h5py
import numpy as np
import pytest
import torch
from toy_runs import RECORD_BODY, lin_cfg, toy_cfg

import hookrun


def test_a_hook_that_never_fires_is_named_in_the_log_and_the_file(tmp_path, caplog):
    hooks = {**RECORD_BODY, "idle": {"at": "spare", "type": "forward", "actions": ["record"]}}
    with caplog.at_level(logging.WARNING, logger="hookrun"):
        path = hookrun.run(toy_cfg(tmp_path, "toy_models.WithSpare", hooks)).path
    assert "hook 'idle' never fired: module 'spare' did not run in any batch" in caplog.text
    with h5py.File(path) as f:
        assert f.attrs["hooks_not_fired"] == "idle@spare"


def test_capture_warns_about_a_hook_that_never_fired(reference_model, caplog):
    hooks = {"f": {"at": "layer1.0", "type": "forward", "actions": ["record"]}}
    reference_model.layer1[0].forward = lambda x: x  # noqa: ARG005  (never runs its children)
    hooks["g"] = {"at": "layer1.0.conv1", "type": "forward", "actions": ["record"]}
    with caplog.at_level(logging.WARNING, logger="hookrun"), torch.no_grad(), hookrun.capture(reference_model, hooks):
        reference_model(torch.zeros(1, 3, 32, 32))
    assert "hook 'g' never fired: module 'layer1.0.conv1' did not run in the block" in caplog.text
    assert "hook 'f'" not in caplog.text


class Boxed:
    """Not a tensor (as torchvision detection's ImageList is not)."""

    def __init__(self, t):
        self.t = t


class Wrap(torch.nn.Module):
    def forward(self, x):
        return Boxed(x)


class WithWrapper(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.wrap = Wrap()
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, x):
        return self.lin(self.wrap(x).t)


def test_a_glob_over_every_module_skips_one_without_a_tensor_and_lists_it(tmp_path, caplog):
    data = torch.utils.data.TensorDataset(torch.randn(4, 4), torch.zeros(4, dtype=torch.long))
    model = WithWrapper()
    cfg = lin_cfg(tmp_path, hooks={"all": {"at": "**", "type": "forward", "actions": [{"name": "record", "what": "output"}]}})
    with caplog.at_level(logging.WARNING, logger="hookrun"):
        path = hookrun.run(cfg, model=model, dataset=data).path
    with h5py.File(path) as f, torch.no_grad():
        assert f.attrs["status"] == "complete"
        assert "all@wrap (wrap receives no output" in f.attrs["hooks_skipped"]
        np.testing.assert_allclose(f["captures/all/lin/output"][:], model.lin(data.tensors[0]).numpy(), rtol=1e-6)
        assert "wrap" not in f["captures/all"]
    assert "skipped wrap" in caplog.text
    cfg = lin_cfg(tmp_path / "named", hooks={"w": {"at": "wrap", "type": "forward", "actions": [{"name": "record", "what": "output"}]}})
    with pytest.raises(hookrun.errors.RunError, match="record what='output': wrap receives no output"):
        hookrun.run(cfg, model=model, dataset=data)
