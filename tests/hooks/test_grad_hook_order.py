"""A gradient hook (backward, tensor; a module's or an op site's) beside a forward hook that edits the
same module's output or input: its gradients are those of the output the rest of the model sees and
of the input the module got, whichever of the two hooks the config lists first. Listed first, the
gradient hook used to wrap the tensor before the edit: a `scale 2` made grad_output twice the
gradient of what the model saw (a `zero` made it 0). Reference: the edit written out in plain torch
and torch.autograd.grad on the same weights and inputs."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch
from torch import nn

import hookrun


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.mid, self.fc = nn.Linear(6, 5), nn.Linear(5, 5), nn.Linear(5, 3)

    def forward(self, x):
        return self.fc(torch.tanh(self.mid(torch.tanh(self.a(x)))))


EDITS = {"output": {"type": "forward", "actions": [{"name": "modify_output", "op": "scale", "factor": 2.0}]},
         "input": {"type": "forward_pre", "actions": [{"name": "replace_input", "op": "scale", "factor": 2.0}]}}


def run(tmp_path, hooks, net, x, y):
    cfg = {"mode": "grad", "loss": {"_target_": "hookrun.runner.losses.cross_entropy", "_partial_": True},
           "hooks": hooks, "data": {"batch_size": 8}, "progress": False,
           "output": {"path": str(tmp_path / "c.h5"), "overwrite": True}}
    return h5py.File(hookrun.run(cfg, model=net, dataset=torch.utils.data.TensorDataset(x, y)).path)


@pytest.fixture
def weights():
    torch.manual_seed(0)
    net = Net()
    g = torch.Generator().manual_seed(1)
    return net, torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)


@pytest.mark.parametrize("grad_first", [True, False])
@pytest.mark.parametrize("edit", ["output", "input"])
def test_grad_output_and_input_are_those_of_the_edited_module_in_either_order(tmp_path, weights, edit, grad_first):
    net, x, y = weights
    grads = {"g": {"at": "mid", "type": "backward"}, "t": {"at": "mid", "type": "tensor"}}
    change = {"e": {"at": "mid", **EDITS[edit]}}
    f = run(tmp_path, {**grads, **change} if grad_first else {**change, **grads}, net, x, y)
    h = torch.tanh(net.a(x))
    into = h * 2.0 if edit == "input" else h  # what mid gets
    out = net.mid(into) * (2.0 if edit == "output" else 1.0)  # what the model sees of it
    g_into, g_out = torch.autograd.grad(nn.functional.cross_entropy(net.fc(torch.tanh(out)), y), [into, out])
    np.testing.assert_allclose(f["captures/g/mid/grad_output"][:], g_out.numpy(), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(f["captures/t/mid/grad"][:], g_out.numpy(), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(f["captures/g/mid/grad_input"][:], g_into.numpy(), rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("grad_first", [True, False])
def test_an_op_sites_grad_is_that_of_its_edited_result_in_either_order(tmp_path, weights, grad_first):
    net, x, y = weights
    grads = {"t": {"at": "/tanh", "type": "tensor"}}
    change = {"e": {"at": "/tanh", **EDITS["output"]}}
    f = run(tmp_path, {**grads, **change} if grad_first else {**change, **grads}, net, x, y)
    first = torch.tanh(net.a(x)) * 2.0
    second = torch.tanh(net.mid(first)) * 2.0
    g = torch.autograd.grad(nn.functional.cross_entropy(net.fc(second), y), [first, second])
    np.testing.assert_allclose(f["captures/t/%2Ftanh.0/grad"][:], g[0].numpy(), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(f["captures/t/%2Ftanh.1/grad"][:], g[1].numpy(), rtol=1e-6, atol=1e-9)
