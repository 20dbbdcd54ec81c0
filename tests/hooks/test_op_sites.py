"""Op sites (issue 21): `at: MODULE/FN` hooks the torch calls a module's own forward makes.
References independent of hookrun: transformers' output_attentions, raw module hooks, a
TorchFunctionMode written here, torch.autograd.grad, and torchvision's avgpool called directly."""

from __future__ import annotations

import h5py
import numpy as np
import op_models
import pytest
import torch
import torchvision
from torch.overrides import TorchFunctionMode
from toy_lm import tiny_gpt2

import hookrun
from hookrun.errors import ConfigError
from hookrun.models import hf

transformers = pytest.importorskip("transformers")


def gpt2():
    return op_models.gpt2()


def batch():
    ids = torch.randint(0, 50, (3, 8), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(3, 8, dtype=torch.long)
    mask[0, 5:] = 0  # a padded sample
    return ids, mask


def block_input_and_attention(block: torch.nn.Module, attention: torch.nn.Module) -> dict:
    """Raw module hooks, the residual midpoint's reference: once the model has run, `seen["in"]` is
    the block's input (positional or hidden_states=) and `seen["attn"]` its attention's output."""
    seen = {}
    block.register_forward_pre_hook(lambda m, a, kw: seen.update({"in": a[0] if a else kw["hidden_states"]}), with_kwargs=True)
    attention.register_forward_hook(lambda m, i, o: seen.update({"attn": o[0] if isinstance(o, tuple) else o}))
    return seen


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
    seen = block_input_and_attention(model.transformer.h[0], model.transformer.h[0].attn)
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


# -- LLaMA and BERT, padded batches (issue 21's references) -----------------------------------------
ATTENTION = {"gpt2": "transformer.h.{}.attn/softmax", "llama": "model.layers.{}.self_attn/softmax",
             "bert": "encoder.layer.{}.attention.self/softmax"}


@pytest.mark.parametrize(("which", "side"), [("gpt2", "left"), ("llama", "right"), ("llama", "left"), ("bert", "right")])
def test_attention_sites_equal_output_attentions_per_layer_with_padding(which, side):
    import op_models

    model, batch = getattr(op_models, which)(), op_models.padded_batch(side)
    hooks = {"p": {"at": ATTENTION[which].format("*"), "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
    with torch.no_grad():
        want = model(**batch, output_attentions=True).attentions
        with hookrun.capture(model, hooks) as cap:
            model(**batch)
    assert len(want) == 2
    for i, pattern in enumerate(want):
        torch.testing.assert_close(cap[ATTENTION[which].format(i) + ".0", "output"], pattern)
    masked = batch["attention_mask"][0] == 0  # sample 0's padding gets no attention from its real tokens
    real = ~masked
    assert float(want[0][0][:, real][..., masked].abs().max()) == 0.0


@pytest.mark.parametrize(("model_cfg", "which"), [("hf_llama", "llama"), ("hf_bert", "bert")])
def test_a_file_run_of_the_shipped_configs_records_each_layers_pattern(tmp_path, model_cfg, which):
    cfg = hookrun.compose(f"model={model_cfg}", "data=text", "data.limit=2", "data.dataset.max_length=64", "device=cpu", "progress=false",
                          f"output.path={tmp_path / 'a.h5'}")
    cfg["hooks"] = {"p": {"at": ATTENTION[which].format("*"), "type": "forward",
                          "actions": [{"name": "record", "what": "output"}]}}
    path = hookrun.run(cfg).path
    torch.manual_seed(cfg["seed"])  # the model the run built: the same class, config and seed
    model = hf(**{k: v for k, v in cfg["model"].items() if k not in ("_target_", "checkpoint")}).eval()
    with h5py.File(path) as f:
        ids, mask = torch.from_numpy(f["samples/input_ids"][:]), torch.from_numpy(f["samples/attention_mask"][:])
        assert (mask == 0).any(1).all()  # every sample padded (to 64 bytes)
        with torch.no_grad():
            want = model(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
        for i, pattern in enumerate(want):
            got = f[f"captures/p/{ATTENTION[which].format(i).replace('/', '%2F')}.0/output"][:]
            np.testing.assert_allclose(got, pattern.numpy(), rtol=1e-5, atol=1e-6)


def test_llamas_residual_midpoint_is_the_layers_input_plus_self_attentions_output():
    import op_models

    model, batch = op_models.llama(), op_models.padded_batch("left")
    seen = block_input_and_attention(model.model.layers[1], model.model.layers[1].self_attn)
    hooks = {"mid": {"at": "model.layers.*/add", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
    with torch.no_grad(), hookrun.capture(model, hooks) as cap:
        out = model(**batch, output_hidden_states=True)
    torch.testing.assert_close(cap["model.layers.1/add.0", "output"], seen["in"] + seen["attn"])
    torch.testing.assert_close(cap["model.layers.0/add.1", "output"], out.hidden_states[1])  # the layer's output


# -- ops that cannot fire, refused before any batch ------------------------------------------------
def text_data(n=4):
    ids = torch.randint(3, 50, (n, 8), generator=torch.Generator().manual_seed(2))
    return [{"input_ids": ids[i], "attention_mask": torch.ones(8, dtype=torch.long)} for i in range(n)]


def run_sites(tmp_path, model, at, name="c.h5"):
    hooks = {"p": {"at": at, "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
    return hookrun.run({"hooks": hooks, "data": {"batch_size": 2}, "device": "cpu", "progress": False,
                        "output": {"path": str(tmp_path / name)}}, model=model, dataset=text_data())


class CountCalls(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.sizes = []

    def forward(self, input_ids, attention_mask):
        self.sizes.append(len(input_ids))
        return self.inner(input_ids=input_ids, attention_mask=attention_mask)


@pytest.mark.parametrize("impl", ["sdpa"])
def test_a_softmax_site_under_fused_attention_is_refused_naming_eager(tmp_path, impl):
    model = CountCalls(tiny_gpt2(0, impl, n_embd=32, n_head=4, n_positions=16, vocab_size=50,
                                 bos_token_id=50256, eos_token_id=50256, pad_token_id=None))  # GPT2Config's own token ids
    for at in ("inner.transformer.h.*.attn/softmax", "inner.transformer.h.0.attn/softmax.0"):
        with pytest.raises(ConfigError, match=rf"^hooks\.p\.at: inner\.transformer\.h\.0\.attn/softmax(\.0)? never runs: .* "
                                              rf"attn_implementation={impl}, .*model\.attn_implementation=eager"):
            run_sites(tmp_path, model, at)
        with pytest.raises(ConfigError, match="model.attn_implementation=eager"), hookrun.capture(model, {"p": {"at": at, "type": "forward"}}):
            pass
    with pytest.raises(ConfigError, match=r"attn_implementation=sdpa.*model\.attn_implementation=eager"):  # the probe's verdict
        run_sites(tmp_path, model, "inner.transformer.h.0.attn/matmul")
    assert model.sizes == [1] and not (tmp_path / "c.h5").exists()  # one probe of one sample; no batch, no file


def test_named_sites_that_never_run_are_refused_and_a_globs_silent_sites_dropped(tmp_path):
    model = CountCalls(gpt2())
    with pytest.raises(ConfigError, match=r"inner\.transformer\.h\.0/softmax never runs .* own code does not call softmax "
                                          r"\(calls inside a child module belong to the child\); inner\.transformer\.h\.0 calls add"):
        run_sites(tmp_path, model, "inner.transformer.h.0/softmax")
    with pytest.raises(ConfigError, match=r"inner\.transformer\.h\.1/add\.2 never runs: .* calls add 2 time\(s\) per forward"):
        run_sites(tmp_path, model, "inner.transformer.h.1/add.2")
    with pytest.raises(ConfigError, match=r"softmax is called by none of the 2 modules a glob reaches"):
        run_sites(tmp_path, model, "inner.transformer.h.*/softmax")
    assert model.sizes == [1, 1, 1]
    path = run_sites(tmp_path, model, "inner.transformer.h.**/softmax").path  # the blocks, attn, mlp, ...: only attn calls it
    with h5py.File(path) as f:
        assert sorted(f["captures/p"]) == ["inner.transformer.h.0.attn%2Fsoftmax.0", "inner.transformer.h.1.attn%2Fsoftmax.0"]
        assert f.attrs["hooks_not_fired"] == ""


def test_a_run_without_op_sites_never_enters_a_torch_function_mode(tmp_path, monkeypatch):
    entered = []
    original = TorchFunctionMode.__enter__
    monkeypatch.setattr(TorchFunctionMode, "__enter__", lambda self: (entered.append(type(self).__name__), original(self))[1])
    model = gpt2()
    module_hooks = {"a": {"at": "transformer.h.*.attn", "type": "forward", "actions": [{"name": "record", "what": "output.0"}]}}
    hookrun.run({"hooks": module_hooks, "data": {"batch_size": 2}, "device": "cpu", "progress": False,
                 "output": {"path": str(tmp_path / "m.h5")}}, model=model, dataset=text_data())
    with torch.no_grad(), hookrun.capture(model, module_hooks):
        model(**dict(zip(("input_ids", "attention_mask"), batch(), strict=True)))
    assert entered == []
    with torch.no_grad(), hookrun.capture(model, {"p": {"at": "transformer.h.1.attn/softmax", "type": "forward"}}):
        model(**dict(zip(("input_ids", "attention_mask"), batch(), strict=True)))
    assert entered == ["_SiteMode"]  # (the check that it is seen: one forward, one hooked module)
