"""capture on a model whose hooked submodule is called on its own in the block: one warning naming
the module and what to do; calls of the model itself give a raw forward hook's values, no warning.
A gradient hook that never fired under no_grad, and a capture entered twice: one line each."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

import hookrun
from hookrun.errors import ConfigError

HOOKS = {"f": {"at": "a", "type": "forward", "actions": ["record"]}}


class Two(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 2)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def test_a_submodule_called_outside_the_model_warns_once(caplog) -> None:
    torch.manual_seed(0)
    model, x = Two(), torch.randn(5, 4)
    seen = []
    handle = model.a.register_forward_hook(lambda m, i, o: seen.append(o.detach().clone()))
    with torch.no_grad():
        model(x)
    handle.remove()
    with caplog.at_level(logging.WARNING), torch.no_grad(), hookrun.capture(model, HOOKS) as cap:
        model(x)
    assert not [r for r in caplog.records if "outside" in r.getMessage()]
    torch.testing.assert_close(cap["a", "output"], seen[0])
    caplog.clear()
    with caplog.at_level(logging.WARNING), torch.no_grad(), hookrun.capture(model, HOOKS):
        model(x)
        model.a(x[:2])
        model.a(x[:3])
    assert [r.getMessage() for r in caplog.records if "outside" in r.getMessage()] == [
        "capture: module 'a' ran outside a call of the model given to capture (Two), so its captures share no step "
        "with the model's (their rows and shapes are not a run's); call that model inside the block, or pass the "
        "submodule as the model: hookrun.capture(model.a, ...)"]


def test_a_gradient_hook_under_no_grad_says_no_backward_reached_it(caplog) -> None:
    """Under no_grad the module's output needs no gradient (torch: requires_grad False), so no
    tensor hook can fire: the warning says so, besides the module not running."""
    model, x = Two(), torch.randn(5, 4)
    with torch.no_grad():
        assert not model.a(x).requires_grad
    with caplog.at_level(logging.WARNING), torch.no_grad(), hookrun.capture(model, {"g": {"at": "a", "type": "tensor"}}):
        model(x)
    assert ("hook 'g' never fired: module 'a' did not run in the block, or no backward() reached it (under no_grad, "
            "or no backward() called) (so cap has no capture from it)") in caplog.text


def test_a_capture_entered_twice_is_one_line() -> None:
    model, x = Two(), torch.randn(5, 4)
    block = hookrun.capture(model, HOOKS)
    with torch.no_grad(), block:
        model(x)
    with pytest.raises(ConfigError, match=r"^capture: this hookrun.capture\(...\) was used by a block already; a "
                                          r"capture is used once: call hookrun.capture\(model, hooks\) again"):
        with block:
            pass
    assert not model.a._forward_hooks and not model.a._forward_pre_hooks and not model._forward_pre_hooks
