"""Hooks see keyword arguments: recorded as input.NAME, replaced by `arg: NAME`, compared with
raw `register_forward_pre_hook(with_kwargs=True)` hooks on the same model and items."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch
from kw_models import Scorer, Tokens

import hookrun
from hookrun.errors import RunError


def cfg(tmp_path, hooks, **over) -> dict:
    return {"data": {"batch_size": 4}, "device": "cpu", "progress": False, "hooks": hooks,
            "output": {"path": str(tmp_path / "c.h5"), "overwrite": True}, **over}


def raw_logits(model, ds, pre_hook=None) -> np.ndarray:
    handle = model.mix.register_forward_pre_hook(pre_hook, with_kwargs=True) if pre_hook else None
    try:
        with torch.no_grad():
            return torch.cat([model(ds.ids[i:i + 4], ds.mask[i:i + 4]) for i in range(0, len(ds), 4)]).numpy()
    finally:
        if handle:
            handle.remove()


LOGITS = {"name": "record", "what": "output"}


def test_keyword_inputs_are_recorded_as_input_name(tmp_path):
    torch.manual_seed(0)
    model, ds = Scorer().eval(), Tokens(n=9)
    seen = []
    handle = model.mix.register_forward_pre_hook(lambda m, a, kw: seen.append(kw["hidden_states"].clone()), with_kwargs=True)
    raw_logits(model, ds)
    handle.remove()
    hooks = {"mix_in": {"at": "mix", "type": "forward_pre", "actions": [{"name": "record", "what": ["input.hidden_states", "input.mask"]}]}}
    hookrun.run(cfg(tmp_path, hooks), model=model, dataset=ds)
    with h5py.File(tmp_path / "c.h5") as f:
        np.testing.assert_array_equal(f["captures/mix_in/mix/input.hidden_states"][:], torch.cat(seen).numpy())
        np.testing.assert_array_equal(f["captures/mix_in/mix/input.mask"][:], ds.mask.float().numpy())


@pytest.mark.parametrize("call", ["keyword", "positional"])
def test_replace_input_by_name_changes_the_output_as_a_raw_hook(tmp_path, call):
    torch.manual_seed(0)
    model, ds = Scorer().eval(), Tokens(n=9)

    def halve(module, args, kwargs):
        return args, {**kwargs, "hidden_states": kwargs["hidden_states"] * 0.5}

    clean, want = raw_logits(model, ds), raw_logits(model, ds, halve)
    hooks = {"halve": {"at": "mix", "type": "forward_pre", "actions": [{"name": "replace_input", "op": "scale", "factor": 0.5, "arg": "hidden_states"}]},
             "logits": {"at": "head", "type": "forward", "actions": [LOGITS]}}
    if call == "positional":  # the same module called positionally: arg: hidden_states still finds it
        model.forward = lambda input_ids, attention_mask=None: model.head(
            model.mix(model.embed(input_ids), attention_mask.float()).mean(dim=1))
        want = raw_logits_positional(model, ds)
    hookrun.run(cfg(tmp_path, hooks), model=model, dataset=ds)
    with h5py.File(tmp_path / "c.h5") as f:
        got = f["captures/logits/head/output"][:]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert not np.allclose(got, clean)


def raw_logits_positional(model, ds) -> np.ndarray:
    handle = model.mix.register_forward_pre_hook(lambda m, a: (a[0] * 0.5, *a[1:]))
    try:
        with torch.no_grad():
            return torch.cat([model.forward(ds.ids[i:i + 4], ds.mask[i:i + 4]) for i in range(0, len(ds), 4)]).numpy()
    finally:
        handle.remove()


def test_naming_an_input_the_module_never_gets_is_an_error(tmp_path):
    hooks = {"x": {"at": "mix", "type": "forward_pre", "actions": [{"name": "replace_input", "op": "zero", "arg": "position_ids"}]}}
    with pytest.raises(RunError, match=r"arg position_ids: mix receives no input.position_ids; it receives: input.hidden_states, input.mask"):
        hookrun.run(cfg(tmp_path, hooks), model=Scorer(), dataset=Tokens())
    hooks = {"x": {"at": "mix", "type": "forward", "actions": [{"name": "record", "what": "input.bias"}]}}
    with pytest.raises(RunError, match=r"record what='input.bias': mix receives no input.bias; it receives: input.hidden_states, input.mask, output"):
        hookrun.run(cfg(tmp_path, hooks), model=Scorer(), dataset=Tokens())


def test_backward_hook_on_a_keyword_only_module_says_what_to_use(tmp_path):
    hooks = {"g": {"at": "mix", "type": "backward", "actions": ["record"]}}
    with pytest.raises(RunError, match=r"gets its tensors as keywords \(hidden_states, mask\); use type: tensor on the same module"):
        hookrun.run(cfg(tmp_path, hooks, mode="grad", loss={"_target_": "hookrun.runner.losses.sum_output", "_partial_": True}),
                    model=Scorer(), dataset=Tokens())


def test_tensor_hook_on_a_keyword_module_matches_autograd(tmp_path):
    torch.manual_seed(0)
    model, ds = Scorer().eval(), Tokens(n=8)
    hooks = {"g": {"at": "mix", "type": "tensor", "actions": ["record"]}}
    hookrun.run(cfg(tmp_path, hooks, mode="grad", loss={"_target_": "hookrun.runner.losses.sum_output", "_partial_": True}),
                model=model, dataset=ds)
    want = []
    for i in range(0, 8, 4):
        h = model.embed(ds.ids[i:i + 4])
        mixed = model.mix(hidden_states=h, mask=ds.mask[i:i + 4].float())
        out = model.head(mixed.mean(dim=1)).sum()
        want.append(torch.autograd.grad(out, mixed)[0])
    with h5py.File(tmp_path / "c.h5") as f:
        np.testing.assert_allclose(f["captures/g/mix/grad"][:], torch.cat(want).numpy(), rtol=1e-6, atol=1e-7)


def test_replace_input_without_arg_leaves_keyword_inputs_alone(tmp_path):
    hooks = {"x": {"at": "mix", "type": "forward_pre", "actions": [{"name": "replace_input", "op": "zero"}]}}
    with pytest.raises(RunError, match=r"mix receives its inputs as keywords \(input.hidden_states, input.mask\); name the one to replace with arg: NAME"):
        hookrun.run(cfg(tmp_path, hooks), model=Scorer(), dataset=Tokens())
