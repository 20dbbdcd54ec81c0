"""Op sites (issue 21): `at: MODULE/FN` hooks the torch calls a module's own forward makes.
References independent of hookrun: transformers' output_attentions, raw module hooks, a
TorchFunctionMode written here, torch.autograd.grad, and torchvision's avgpool called directly."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch
import torchvision
from torch.overrides import TorchFunctionMode

import hookrun
from hookrun.errors import ConfigError

transformers = pytest.importorskip("transformers")


def gpt2():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, n_positions=16, vocab_size=50, bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel._from_config(cfg, attn_implementation="eager").eval()


def batch():
    ids = torch.randint(0, 50, (3, 8), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(3, 8, dtype=torch.long)
    mask[0, 5:] = 0  # a padded sample
    return ids, mask


def test_softmax_sites_equal_output_attentions_in_memory_and_in_the_file(tmp_path):
    model, (ids, mask) = gpt2(), batch()
    hooks = {"p": {"at": "transformer.h.*.attn/softmax", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
        with hookrun.capture(model, hooks) as cap:
            model(input_ids=ids, attention_mask=mask)
    for i in range(2):
        torch.testing.assert_close(cap[f"transformer.h.{i}.attn/softmax.0", "output"], want[i])
    data = [{"input_ids": ids[i], "attention_mask": mask[i]} for i in range(3)]
    path = hookrun.run({"hooks": hooks, "data": {"batch_size": 3}, "device": "cpu", "progress": False,
                        "output": {"path": str(tmp_path / "c.h5")}}, model=model, dataset=data).path
    with h5py.File(path) as f:
        ds = f["captures/p/transformer.h.1.attn%2Fsoftmax.0/output"]
        assert ds.attrs["module"] == "transformer.h.1.attn/softmax.0"
        np.testing.assert_allclose(ds[:], want[1].numpy(), rtol=1e-5, atol=1e-6)
    with hookrun.open_run(path) as run:
        assert run.find("transformer.h.0.attn/softmax.0", "output").label == "p/transformer.h.0.attn/softmax.0/output"


def test_the_residual_midpoint_is_the_blocks_input_plus_its_attention_output():
    model, (ids, mask) = gpt2(), batch()
    seen = {}
    block = model.transformer.h[0]
    block.register_forward_pre_hook(lambda m, args, kwargs: seen.update({"in": args[0] if args else kwargs["hidden_states"]}), with_kwargs=True)
    block.attn.register_forward_hook(lambda m, i, o: seen.update({"attn": o[0] if isinstance(o, tuple) else o}))
    hooks = {"mid": {"at": "transformer.h.0/add.0", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
    with torch.no_grad(), hookrun.capture(model, hooks) as cap:
        model(input_ids=ids, attention_mask=mask)
    torch.testing.assert_close(cap["transformer.h.0/add.0", "output"], seen["in"] + seen["attn"])


class ScaleSoftmax(TorchFunctionMode):
    """The test's own interception: every softmax called while it is entered, times 0.5."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        return out * 0.5 if getattr(func, "__name__", "") == "softmax" else out


def test_a_modify_on_a_softmax_site_equals_the_same_edit_by_a_torch_function_mode():
    model, (ids, mask) = gpt2(), batch()
    attn = model.transformer.h[0].attn
    mode = ScaleSoftmax()
    handles = [attn.register_forward_pre_hook(lambda m, a: (mode.__enter__(), None)[1]),
               attn.register_forward_hook(lambda m, a, o: (mode.__exit__(None, None, None), None)[1])]
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask).logits
    for h in handles:
        h.remove()
    hooks = {"s": {"at": "transformer.h.0.attn/softmax.0", "type": "forward",
                   "actions": [{"name": "modify_output", "op": "scale", "factor": 0.5}]}}
    with torch.no_grad(), hookrun.capture(model, hooks):
        got = model(input_ids=ids, attention_mask=mask).logits
        clean = model(input_ids=ids, attention_mask=mask).logits  # (the capture's hooks scale this one too)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(clean, want)
    with torch.no_grad():
        assert not torch.allclose(model(input_ids=ids, attention_mask=mask).logits, want)


class KeepSoftmax(TorchFunctionMode):
    def __init__(self, kept):
        super().__init__()
        self.kept = kept

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if getattr(func, "__name__", "") == "softmax":
            self.kept.append(out)
        return out


def test_the_gradient_at_a_softmax_site_equals_autograd_grad():
    model, (ids, mask) = gpt2(), batch()
    kept = []
    attn = model.transformer.h[1].attn
    mode = KeepSoftmax(kept)
    handles = [attn.register_forward_pre_hook(lambda m, a: (mode.__enter__(), None)[1]),
               attn.register_forward_hook(lambda m, a, o: (mode.__exit__(None, None, None), None)[1])]
    loss = model(input_ids=ids, attention_mask=mask).logits.logsumexp(-1).sum()
    (want,) = torch.autograd.grad(loss, kept)
    for h in handles:
        h.remove()
    hooks = {"g": {"at": "transformer.h.1.attn/softmax", "type": "tensor", "actions": ["record"]}}
    with hookrun.capture(model, hooks) as cap:
        model(input_ids=ids, attention_mask=mask).logits.logsumexp(-1).sum().backward()
    torch.testing.assert_close(cap["transformer.h.1.attn/softmax.0", "grad"], want)


def test_resnet_root_flatten_and_the_in_place_residual_sum():
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10).eval()
    x = torch.randn(2, 3, 32, 32)
    seen = {}
    model.avgpool.register_forward_hook(lambda m, i, o: seen.update({"pool": o}))
    model.layer1[0].bn2.register_forward_hook(lambda m, i, o: seen.update({"bn2": o.clone()}))
    model.layer1[0].register_forward_pre_hook(lambda m, a: seen.update({"identity": a[0].clone()}))
    hooks = {"f": {"at": "/flatten", "type": "forward", "actions": [{"name": "record", "what": "output"}]},
             "r": {"at": "layer1.0/add_", "type": "forward", "actions": [{"name": "record", "what": "output"}]},
             "child": {"at": "layer1.0/conv2d", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
    with torch.no_grad(), hookrun.capture(model, hooks) as cap:
        model(x)
    torch.testing.assert_close(cap["/flatten.0", "output"], torch.flatten(seen["pool"], 1))
    torch.testing.assert_close(cap["layer1.0/add_.0", "output"], seen["bn2"] + seen["identity"])  # after the op
    assert not any(module.startswith("layer1.0/conv2d") for _, module, _ in cap.keys())  # conv2d runs in the children


def test_replacing_an_in_place_ops_result_is_refused_before_any_batch():
    model = torchvision.models.resnet18(num_classes=10).eval()
    hooks = {"z": {"at": "layer1.0/add_", "type": "forward", "actions": [{"name": "modify_output", "op": "zero"}]}}
    with pytest.raises(ConfigError, match=r"layer1\.0/add_ is an in-place op"), hookrun.capture(model, hooks):
        pass
