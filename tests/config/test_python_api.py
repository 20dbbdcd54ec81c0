"""hookrun.run and hookrun.compose from Python: a live model comes back as it went in, and compose gives
the config the CLI runs. References: the model's own flags and the CLI's composed config."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from conftest import ROOT, small_resnet

import hookrun
from hookrun.errors import ConfigError


def test_run_with_a_live_model_restores_its_mode_and_flags(tmp_path, checkpoint, dataset):
    model = small_resnet()
    model.load_state_dict(torch.load(checkpoint, weights_only=True))
    model.train()
    model.layer1[0].relu.inplace = True
    before = {n: (m.training, getattr(m, "inplace", None)) for n, m in model.named_modules()}
    grads = {n: p.requires_grad for n, p in model.named_parameters()}
    hooks = {"g": {"at": "layer1", "type": "tensor", "actions": ["record"]}}
    cfg = {"data": {"batch_size": 4}, "device": "cpu", "mode": "grad", "progress": False, "hooks": hooks,
           "loss": {"_target_": "hookrun.runner.losses.cross_entropy", "_partial_": True},
           "output": {"path": str(tmp_path / "c.h5")}}
    hookrun.run(cfg, model=model, dataset=dataset)
    assert {n: (m.training, getattr(m, "inplace", None)) for n, m in model.named_modules()} == before
    assert {n: p.requires_grad for n, p in model.named_parameters()} == grads
    assert all(not m._forward_hooks and not m._forward_pre_hooks and not m._backward_hooks for m in model.modules())
    assert all(p.grad is None for p in model.parameters())
    with h5py.File(tmp_path / "c.h5") as f:
        assert np.isfinite(f["captures/g/layer1/grad"][:]).all()


def test_a_gradient_the_model_came_with_comes_back_unchanged_and_is_not_in_the_first_batch(tmp_path, checkpoint, dataset):
    """mode=grad's first backward added into the .grad the model already held (ones + batch 0's gradient came
    back), and a param grad recorded at batch 0 held the ones too. Reference: torch.autograd.grad of the
    same loss on the same batch, on a copy of the model with no .grad."""
    model = small_resnet()
    model.load_state_dict(torch.load(checkpoint, weights_only=True))
    model.eval()
    ones = torch.ones_like(model.fc.weight)
    model.fc.weight.grad = ones.clone()
    hooks = {"g": {"at": "fc.weight", "type": "param", "actions": ["record"]}}
    cfg = {"data": {"batch_size": 4}, "device": "cpu", "mode": "grad", "progress": False, "hooks": hooks,
           "loss": {"_target_": "hookrun.runner.losses.cross_entropy", "_partial_": True},
           "output": {"path": str(tmp_path / "c.h5")}}
    hookrun.run(cfg, model=model, dataset=dataset)
    torch.testing.assert_close(model.fc.weight.grad, ones, rtol=0, atol=0)
    x = torch.stack([dataset[i][0] for i in range(4)])
    y = torch.tensor([int(dataset[i][1]) for i in range(4)])
    want = torch.autograd.grad(torch.nn.functional.cross_entropy(model(x), y), model.fc.weight)[0]
    with h5py.File(tmp_path / "c.h5") as f:
        np.testing.assert_allclose(f["captures/g/fc.weight/grad"][0], want.numpy(), rtol=1e-4, atol=1e-6)


def test_compose_gives_the_config_the_cli_runs(tmp_path, monkeypatch):
    import yaml

    monkeypatch.chdir(tmp_path)
    cfg = hookrun.compose("experiment=resnet_layer1", "data.batch_size=4", "data.limit=1", "device=cpu", "progress=false")
    assert cfg["data"]["batch_size"] == 4 and cfg["hooks"]["blocks"]["at"] == "layer1.*"
    assert cfg["output"]["path"].startswith("outputs/") and cfg["output"]["path"].endswith("/captures.h5")
    want = yaml.safe_load((ROOT / "conf/experiment/resnet_layer1.yaml").read_text())["hooks"]
    assert cfg["hooks"] == want  # the experiment's own hooks, as the CLI composes them
    result = hookrun.run(cfg)
    with h5py.File(result.path) as f:
        assert f.attrs["status"] == "complete" and f["captures/blocks/layer1.0/output"].shape[0] == 4
    now = dt.datetime.now()  # every second the next compose could fall in holds an earlier run: it takes TIME-2
    for s in range(60):
        (tmp_path / "outputs" / (now + dt.timedelta(seconds=s)).strftime("%Y-%m-%d/%H-%M-%S")).mkdir(parents=True, exist_ok=True)
    again = Path(hookrun.compose("experiment=resnet_layer1")["output"]["path"])
    assert again.parent.name.endswith("-2") and not (tmp_path / again.parent).exists()
    with pytest.raises(ConfigError, match=r"model=custom model\._target_=torchvision\.models\.resnet34"):
        hookrun.compose("model=resnet34")
