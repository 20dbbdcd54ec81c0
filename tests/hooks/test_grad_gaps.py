"""Gradients asked where none exists, and the gradient hooks' tricky modules: a record of a backward
hook's grad_input that PyTorch hands as None (an embedding's, integer ids in). References: a raw
register_full_backward_hook on the same module, torch.autograd.grad on the same weights and inputs."""

from __future__ import annotations

import h5py
import pytest
import torch
from kw_models import Scorer, Tokens

import hookrun
from hookrun.errors import RunError


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
