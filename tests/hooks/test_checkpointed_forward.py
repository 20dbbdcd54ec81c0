"""A hooked module whose forward activation checkpointing runs again inside the backward pass
(torch.utils.checkpoint, reentrant or not): refused in one line, where it used to be numbered as a
second call (a phantom `output@1`) and, with `op: noise`, to draw other noise in the recomputed
forward than in the forward the loss came from (a weight gradient off by 0.022 where it reaches 0.080).
Reference: the same model without checkpointing, gradients by torch.autograd.grad."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import hookrun
from hookrun.errors import RunError


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(5, 5)
        self.l2 = nn.Linear(5, 5)

    def forward(self, x):
        return self.l2(torch.tanh(self.l1(x)))


class Net(nn.Module):
    def __init__(self, reentrant=None):
        super().__init__()
        self.a, self.block, self.fc = nn.Linear(6, 5), Block(), nn.Linear(5, 3)
        self.reentrant = reentrant  # None: no checkpointing

    def forward(self, x):
        h = self.a(x)
        if self.reentrant is None:
            return self.fc(self.block(h))
        return self.fc(checkpoint(self.block, h, use_reentrant=self.reentrant))


def config(path, hook):
    return {"mode": "grad", "loss": {"_target_": "hookrun.runner.losses.cross_entropy", "_partial_": True},
            "hooks": {"m": hook, "p": {"at": "a.weight", "type": "param"}},
            "data": {"batch_size": 4}, "progress": False, "output": {"path": str(path), "overwrite": True}}


@pytest.fixture
def data():
    g = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g))


SCALE = {"at": "block.l1", "type": "forward", "actions": [{"name": "modify_output", "op": "scale", "factor": 0.5}]}
HOOKS = [SCALE, {"at": "block.l1", "type": "forward", "actions": [{"name": "modify_output", "op": "noise", "std": 0.5}]},
         {"at": "block.l1", "type": "forward"}, {"at": "block.l1", "type": "backward"}, {"at": "block.l1", "type": "tensor"},
         {"at": "block/tanh", "type": "forward"}]


@pytest.mark.parametrize("reentrant", [False, True])
@pytest.mark.parametrize("hook", HOOKS, ids=["scale", "noise", "forward", "backward", "tensor", "site"])
def test_a_forward_recomputed_in_the_backward_is_refused_in_one_line(tmp_path, data, reentrant, hook):
    torch.manual_seed(0)
    with pytest.raises(RunError) as err:
        hookrun.run(config(tmp_path / "c.h5", hook), model=Net(reentrant), dataset=data)
    assert str(err.value) == (
        f"hooks.m: {hook['at']} "
        "ran its forward again inside the backward pass (activation checkpointing recomputes it: torch.utils.checkpoint, "
        "transformers' gradient_checkpointing_enable()), which the hooks would take for another call; run without "
        "checkpointing (model.gradient_checkpointing_disable(), or call the checkpointed modules directly)")
    assert "\n" not in str(err.value)


def test_the_same_hooks_without_checkpointing_give_torchs_gradients(tmp_path, data):
    torch.manual_seed(0)
    net = Net()
    path = hookrun.run(config(tmp_path / "c.h5", SCALE), model=net, dataset=data).path
    net.block.l1.register_forward_hook(lambda m, i, o: o * 0.5)
    x, y = data.tensors
    ref = [torch.autograd.grad(nn.functional.cross_entropy(net(x[s:s + 4]), y[s:s + 4]), net.a.weight)[0] for s in (0, 4)]
    with h5py.File(path) as f:
        assert f.attrs["status"] == "complete"
        np.testing.assert_allclose(f["captures/p/a.weight/grad"][:], torch.stack(ref).numpy(), rtol=1e-6, atol=1e-8)
