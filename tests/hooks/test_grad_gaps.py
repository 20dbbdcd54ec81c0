"""Gradients asked where none exists, and the gradient hooks' tricky modules: a record of a backward
hook's grad_input that PyTorch hands as None (an embedding's, integer ids in). References: a raw
register_full_backward_hook on the same module, torch.autograd.grad on the same weights and inputs."""

from __future__ import annotations

import logging

import h5py
import pytest
import torch
from kw_models import Scorer, Tokens

import hookrun
from hookrun.errors import ConfigError, RunError


def grad_cfg(tmp_path, hooks) -> dict:
    return {"data": {"batch_size": 4}, "device": "cpu", "progress": False, "hooks": hooks, "mode": "grad",
            "loss": {"_target_": "hookrun.runner.losses.sum_output", "_partial_": True},
            "output": {"path": str(tmp_path / "c.h5")}}


def test_raw_torch_hands_the_embedding_a_none_grad_input():
    model, ds, seen = Scorer(), Tokens(n=4), []
    model.embed.register_full_backward_hook(lambda m, gi, go: seen.append(gi))
    model(ds.ids, ds.mask).sum().backward()
    assert seen == [(None,)]


def test_recording_a_none_grad_input_is_one_line_not_a_complete_file_without_it(tmp_path):
    """It ended `complete`, exit 0, with no capture at all and not a word."""
    hooks = {"g": {"at": "embed", "type": "backward", "actions": [{"name": "record", "what": "grad_input"}]}}
    with pytest.raises(RunError) as err:
        hookrun.run(grad_cfg(tmp_path, hooks), model=Scorer(), dataset=Tokens(n=8))
    assert str(err.value) == (
        "hooks.g.actions.0: record what='grad_input': the grad_input of embed is None in the backward (no input of it needs a "
        "gradient: an embedding's input is integer ids, or its input comes from frozen layers or torch.no_grad); it "
        "has: grad_output; record grad_output, or the gradient of the module before with type: tensor")
    with h5py.File(tmp_path / "c.h5") as f:
        assert f.attrs["status"] == "failed" and "captures" not in f


def test_a_grad_input_position_the_module_lacks_is_one_line_too():
    lin = torch.nn.Linear(3, 2)
    hooks = {"g": {"at": "", "type": "backward", "actions": [{"name": "record", "what": "grad_input.1"}]}}
    with pytest.raises(RunError, match=r"^hooks.g.actions.0: record what='grad_input.1': the backward of \(model\) has no "
                                       r"grad_input.1 \(or it is None: that input needs no gradient\); it has: "
                                       r"grad_input, grad_output$"):
        with hookrun.capture(lin, hooks):
            lin(torch.randn(2, 3, requires_grad=True)).sum().backward()


def test_the_grad_input_that_exists_is_autograds():
    torch.manual_seed(0)
    lin, x = torch.nn.Linear(3, 2), torch.randn(4, 3, requires_grad=True)
    hooks = {"g": {"at": "", "type": "backward", "actions": [{"name": "record", "what": "grad_input"}]}}
    with hookrun.capture(lin, hooks) as cap:
        lin(x).pow(2).sum().backward()
    torch.testing.assert_close(cap["", "grad_input"], torch.autograd.grad(lin(x).pow(2).sum(), x)[0], rtol=0, atol=0)


class Frozen(torch.nn.Module):
    """A frozen first layer (fine-tuning a head): `a` requires no grad."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 6), torch.nn.Linear(6, 3)
        self.a.requires_grad_(False)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


def test_raw_torch_refuses_a_hook_on_a_frozen_parameter():
    with pytest.raises(RuntimeError, match="cannot register a hook on a tensor that doesn't require gradient"):
        Frozen().a.weight.register_hook(lambda g: None)


def test_a_param_hook_on_a_frozen_parameter_is_one_line_before_any_batch(tmp_path):
    """It was PyTorch's RuntimeError, naming no hook and no parameter."""
    hooks = {"p": {"at": "a.weight", "type": "param", "actions": ["record"]}}
    with pytest.raises(ConfigError) as err:
        hookrun.run(grad_cfg(tmp_path, hooks), model=Frozen(), dataset=torch.randn(8, 4))
    assert str(err.value) == (
        "hooks.p.at: parameter 'a.weight' is frozen (requires_grad=False), so no gradient reaches it and a param hook "
        "cannot be set; unfreeze it (.requires_grad_(True)) or hook one that trains; the gradient of a module's "
        "output: type: tensor")
    assert not (tmp_path / "c.h5").exists()


def test_a_glob_leaves_the_frozen_out_and_records_the_rest_as_autograd(caplog):
    torch.manual_seed(0)
    model, x = Frozen(), torch.randn(5, 4)
    with caplog.at_level(logging.WARNING, logger="hookrun"), \
            hookrun.capture(model, {"p": {"at": "*.weight", "type": "param", "actions": ["record"]}}) as cap:
        model(x).pow(2).sum().backward()
    assert "hooks.p: 1 frozen parameter(s) (requires_grad=False) that a glob of `at:` reached left out, as no " \
           "gradient reaches them: a.weight" in caplog.text
    assert sorted(k[1] for k in cap) == ["b.weight"]
    want = torch.autograd.grad(model(x).pow(2).sum(), model.b.weight)[0]
    torch.testing.assert_close(cap["b.weight", "grad"][0], want, rtol=0, atol=0)


class NoGradFirst(torch.nn.Module):
    """`a` runs under torch.no_grad (a frozen feature extractor): no gradient ever reaches it."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 6), torch.nn.Linear(6, 3)

    def forward(self, x):
        with torch.no_grad():
            h = self.a(x)
        return self.b(h)


def test_a_gradient_hook_on_a_module_under_no_grad_is_not_said_to_have_not_run(tmp_path, caplog):
    """The file run's end said "module 'a' did not run in any batch": it ran, every batch."""
    model, seen = NoGradFirst(), []
    handle = model.a.register_forward_hook(lambda m, i, out: seen.append(out.requires_grad))
    model(torch.randn(2, 4, requires_grad=True)).sum().backward()
    handle.remove()
    assert seen == [False]  # it runs, and its output has no gradient to hook
    hooks = {"t": {"at": "a", "type": "tensor", "actions": ["record"]}}
    with caplog.at_level(logging.WARNING, logger="hookrun"):
        path = hookrun.run(grad_cfg(tmp_path, hooks), model=model, dataset=torch.randn(8, 4)).path
    assert "hook 't' never fired: module 'a' did not run in any batch, or no backward() reached it (under no_grad" \
           in caplog.text
    with h5py.File(path) as f:
        assert f.attrs["hooks_not_fired"] == "t@a"


class InPlace(torch.nn.Module):
    """conv -> ReLU(inplace=True), as torchvision's ResNet stem."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.relu, self.fc = torch.nn.Conv2d(2, 3, 3, padding=1), torch.nn.ReLU(inplace=True), torch.nn.Linear(48, 2)

    def forward(self, x):
        return self.fc(self.relu(self.conv(x)).flatten(1))


def test_raw_torch_refuses_a_full_backward_hook_on_an_inplace_relu():
    model = InPlace()
    model.relu.register_full_backward_hook(lambda *a: None)
    with pytest.raises(RuntimeError, match="is a view and is being modified inplace"):
        model(torch.randn(2, 2, 4, 4, requires_grad=True))


@pytest.mark.parametrize("kind", ["backward", "backward_pre"])
def test_capture_of_a_backward_hook_on_an_inplace_relu_is_autograds(kind):
    """capture() stopped in the forward with PyTorch's view+inplace RuntimeError (a file run turns
    inplace off; the notebook did not)."""
    torch.manual_seed(0)
    model, x = InPlace(), torch.randn(2, 2, 4, 4, requires_grad=True)
    with hookrun.capture(model, {"g": {"at": "relu", "type": kind, "actions": ["record"]}}) as cap:
        model(x).pow(2).sum().backward()
    assert model.relu.inplace is True  # back as it went in
    ref = InPlace()
    ref.load_state_dict(model.state_dict())
    ref.relu.inplace = False
    seen = {}
    ref.relu.register_forward_hook(lambda m, i, out: seen.update(i=i[0], o=out))
    want_out, want_in = torch.autograd.grad(ref(x).pow(2).sum(), [seen["o"], seen["i"]])
    torch.testing.assert_close(cap["relu", "grad_output"], want_out, rtol=0, atol=0)
    if kind == "backward":
        torch.testing.assert_close(cap["relu", "grad_input"], want_in, rtol=0, atol=0)


def test_a_backward_hook_on_a_block_whose_first_child_works_in_place_is_autograds():
    """The in-place child overwrites the block's input, the view the block's hook made: the same error."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Sequential(torch.nn.ReLU(inplace=True), torch.nn.Linear(4, 2)))
    x = torch.randn(3, 4)
    with hookrun.capture(model, {"b": {"at": "1", "type": "backward", "actions": ["record"]}}) as cap:
        model(x).pow(2).sum().backward()
    assert model[1][0].inplace is True
    model[1][0].inplace = False
    h = model[0](x)
    torch.testing.assert_close(cap["1", "grad_input"], torch.autograd.grad(model[1](h).pow(2).sum(), h)[0], rtol=0, atol=0)
