"""Layer attributions at a channels-last module (timm's Swin stage: (batch, H, W, C)). captum's Layer*
methods weigh and sum axis 1 as the channels; hookrun hands them the map channels first. Checked against
Grad-CAM computed by hand from a raw forward hook and torch.autograd.grad (channels on the last axis),
and captum's LayerIntegratedGradients on the module itself (elementwise: its layout does not matter)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hookrun

timm = pytest.importorskip("timm")
captum_attr = pytest.importorskip("captum.attr")
N = 4
SWIN = {"embed_dim": 16, "depths": [1, 1], "num_heads": [1, 1], "img_size": 56, "window_size": 7, "num_classes": 3}


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    model = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False, **SWIN).eval()
    g = torch.Generator().manual_seed(1)
    x, y = torch.rand(N, 3, 56, 56, generator=g), torch.tensor([0, 2, 1, 2])
    return model, x, y, [(x[i], int(y[i])) for i in range(N)]


def run(tmp_path, model, data, **block):
    path = tmp_path / f"{block['method']}.h5"
    cfg = {"data": {"batch_size": N}, "device": "cpu", "progress": False, "output": {"path": str(path)},
           "attribution": {"at": "layers.1", **block}}
    hookrun.run(cfg, model=model, dataset=data)
    assert not model.layers[1]._forward_hooks  # the channels-first view is gone with the run
    return hookrun.open_run(path).attribution()


@pytest.mark.parametrize("relu", [False, True])
def test_grad_cam_at_a_swin_stage_weighs_its_channels(tmp_path, setup, relu):
    model, x, y, data = setup
    got = run(tmp_path, model, data, method="grad_cam", relu=relu)
    kept = {}
    h = model.layers[1].register_forward_hook(lambda m, a, out: kept.update(a=out) or None)
    (g,) = torch.autograd.grad(model(x).gather(1, y.view(-1, 1)).sum(), [kept["a"]])
    h.remove()
    a = kept["a"].detach()
    assert a.shape[1] == a.shape[2] != a.shape[3]  # (N, H, W, C)
    want = (g.mean(dim=(1, 2), keepdim=True) * a).sum(3)[:, None]  # (N, 1, H, W)
    want = torch.relu(want) if relu else want
    assert got.shape == tuple(want.shape)
    np.testing.assert_allclose(got.values, want.numpy(), rtol=1e-4, atol=1e-5 * float(want.abs().max()))


def test_layer_integrated_gradients_at_a_swin_stage_are_captums_channels_first(tmp_path, setup):
    model, x, y, data = setup
    got = run(tmp_path, model, data, method="integrated_gradients", steps=4)
    want, delta = captum_attr.LayerIntegratedGradients(model, model.layers[1]).attribute(
        x, target=y, n_steps=4, return_convergence_delta=True)
    want = want.detach().permute(0, 3, 1, 2)
    assert got.dims == ("sample", "channel", "height", "width") and got.shape == tuple(want.shape)
    np.testing.assert_allclose(got.values, want.numpy(), rtol=1e-4, atol=1e-5 * float(want.abs().max()))
    np.testing.assert_allclose(got["delta"].values, delta.detach().numpy(), rtol=1e-4, atol=1e-5)
