"""LRP on a model that calls one module more than once per forward. zennit's rules keep one input per
module (BasicHook.forward: stored_tensors['input']), so a convolution used twice had its first call's
relevance computed with its second call's input: 70% off zennit's LRP on an untied copy of the same
weights, in silence. Such a module is one line before any batch; a reused ReLU (its rule keeps no input,
as in a torchvision BasicBlock) still equals zennit on the untied copy."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

import hookrun
from hookrun.errors import ConfigError

zennit = pytest.importorskip("zennit")


class Net(nn.Module):
    """conv2 is applied twice (`share_conv`), or a ReLU is (`share_relu`); `untie()` gives each call its own copy."""

    def __init__(self, share_conv: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv1, self.conv2 = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(4, 4, 3, padding=1)
        self.conv3 = self.conv2 if share_conv else nn.Conv2d(4, 4, 3, padding=1)
        self.relu = nn.ReLU()
        self.relu2 = self.relu3 = self.relu
        self.fc = nn.Linear(4 * 16, 3)

    def untie(self) -> Net:
        other = copy.deepcopy(self)
        other.conv3, other.relu2, other.relu3 = copy.deepcopy(self.conv3), nn.ReLU(), nn.ReLU()
        return other

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.relu(self.conv1(x))
        h = self.relu2(self.conv2(h))
        return self.fc(self.relu3(self.conv3(h)).flatten(1))


def data():
    g = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(torch.randn(8, 3, 4, 4, generator=g), torch.randint(0, 3, (8,), generator=g))


def lrp(tmp_path, model, composite="epsilon_plus_flat"):
    cfg = {"data": {"batch_size": 4}, "progress": False, "output": {"path": str(tmp_path / "a.h5"), "overwrite": True},
           "attribution": {"method": "lrp", "at": "input", "target": "label", "composite": composite,
                           "measure": None}}
    return hookrun.open_run(hookrun.run(cfg, model=model, dataset=data()).path).attribution().values


def zennit_lrp(model):
    from zennit.attribution import Gradient
    from zennit.composites import COMPOSITES

    x, y = data().tensors
    with Gradient(model=model, composite=COMPOSITES["epsilon_plus_flat"]()) as attributor:
        return np.concatenate([attributor(x[i:i + 4].clone(), torch.eye(3)[y[i:i + 4]])[1].numpy() for i in (0, 4)])


def test_a_convolution_used_twice_is_one_line_before_any_batch(tmp_path):
    with pytest.raises(ConfigError) as err:
        lrp(tmp_path, Net(share_conv=True).eval())
    assert str(err.value) == ("attribution.method=lrp: conv2 runs 2 times in one forward (a shared or looped layer), "
                              "and zennit's rule keeps one input per module, so its earlier calls would be attributed "
                              "with its last call's input; give each use a module of its own, or use another method "
                              "(integrated_gradients)")
    assert not (tmp_path / "a.h5").exists()


def test_a_relu_used_three_times_equals_zennit_on_an_untied_copy(tmp_path):
    model = Net(share_conv=False).eval()
    np.testing.assert_allclose(lrp(tmp_path, model), zennit_lrp(model.untie().eval()), rtol=1e-5, atol=1e-7)


class SmoothRelu(torch.autograd.Function):
    """ReLU whose gradient is sigmoid(10 x) at its own input: beta_smooth's rule (beta 10), by hand."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.clamp(min=0)

    @staticmethod
    def backward(ctx, grad):
        return torch.sigmoid(10 * ctx.saved_tensors[0]) * grad


@pytest.mark.parametrize("inplace", [False, True])
def test_beta_smooth_refuses_a_reused_relu_and_equals_the_smooth_gradient_where_each_runs_once(tmp_path, inplace):
    """beta_smooth's ReLU rule keeps its input: the shared ReLU is refused; untied, the map is the gradient with
    each ReLU's derivative replaced by sigmoid(10 x) of its own call's input (autograd, no zennit). With
    ReLU(inplace=True) (torchvision's) the kept input was the ReLU's output: 68% off."""
    with pytest.raises(ConfigError, match=r"^attribution.method=lrp: relu runs 3 times in one forward"):
        lrp(tmp_path, Net(share_conv=False).eval(), "beta_smooth")
    model = Net(share_conv=False).untie().eval()
    for m in (model.relu, model.relu2, model.relu3):
        m.inplace = inplace
    got = lrp(tmp_path, model, "beta_smooth")
    for m in (model.relu, model.relu2, model.relu3):
        m.forward = SmoothRelu.apply
    x, y = data().tensors
    x = x.clone().requires_grad_(True)
    (model(x) * torch.eye(3)[y]).sum().backward()
    np.testing.assert_allclose(got, x.grad.numpy(), rtol=1e-5, atol=1e-7)
