"""hookrun.attribute hands the model back as it came in, each module's mode too (a model fine-tuned in
train mode with its BatchNorm frozen in eval came back with the BatchNorm in train mode: attribute set
every module to the top module's flag), and runs under a notebook's torch.inference_mode() (it failed
with torch's 'element 0 of tensors does not require grad'). Reference: |d logit / d input| by
torch.autograd.grad on the model in eval mode (captum's Saliency, abs=True)."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch import nn

import hookrun


def _model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))
    with torch.no_grad():
        model[1].running_mean.uniform_(-0.3, 0.3)
        model[1].running_var.uniform_(0.5, 1.5)
    model.train()
    model[1].eval()  # a frozen BatchNorm in a model being fine-tuned
    return model


@pytest.mark.parametrize("mode", [torch.inference_mode, torch.no_grad, contextlib.nullcontext])
def test_attribute_keeps_each_modules_mode_and_takes_gradients_under_any_caller_mode(mode):
    model = _model()
    x = torch.randn(5, 3, 6, 6, generator=torch.Generator().manual_seed(1))
    flags = {n: m.training for n, m in model.named_modules()}
    stats = model[1].running_mean.clone()
    with mode():
        rows = hookrun.attribute(model, x, method="saliency", target=2, batch_size=2)
    assert {n: m.training for n, m in model.named_modules()} == flags and torch.equal(model[1].running_mean, stats)
    assert all(p.grad is None for p in model.parameters())

    ref_model = _model().eval()
    xr = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(ref_model(xr)[:, 2].sum(), xr)
    torch.testing.assert_close(torch.from_numpy(rows["attribution"]), grad.abs(), rtol=1e-5, atol=1e-7)
