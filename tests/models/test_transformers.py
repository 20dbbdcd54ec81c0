"""transformers models (tiny configs, random init, offline): every recorded value, replacement
and steering vector against raw hooks on the same weights and the same token batches. The text
has 11 samples in batches of 5: a smaller last batch and a batch of 1 in every family."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may download

import h5py
import numpy as np
import pytest
import torch

import hookrun
from hookrun.data import text
from hookrun.errors import RunError
from hookrun.models import hf

transformers = pytest.importorskip("transformers")
BATCH = 5
TINY = {
    "gpt2": ("GPT2LMHeadModel", {"n_layer": 2, "n_head": 2, "n_embd": 32, "n_positions": 64, "vocab_size": 259}),
    "llama": ("LlamaForCausalLM", {"vocab_size": 259, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                                   "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
                                   "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}),
    "bert": ("BertModel", {"vocab_size": 259, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
                           "intermediate_size": 64, "max_position_embeddings": 64}),
    "t5": ("T5EncoderModel", {"vocab_size": 259, "d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 2, "num_heads": 4}),
}


@pytest.fixture(scope="module")
def data():
    return text(max_length=16, limit=11, padding_side="right")


def build(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    cls, config = TINY[name]
    return hf(cls, config).eval()


def batches(ds):
    for i in range(0, len(ds), BATCH):
        yield ds.encoded["input_ids"][i:i + BATCH], ds.encoded["attention_mask"][i:i + BATCH]


def raw(model, ds, module, kind="forward", fn=None):
    """Run the model over the batches with one raw hook; returns what `fn` collected, and the logits."""
    got, outs = [], []
    if kind == "pre":
        handle = module.register_forward_pre_hook(lambda m, a, k: fn(got, a, k), with_kwargs=True)
    else:
        handle = module.register_forward_hook(lambda m, a, k, o: fn(got, a, k, o), with_kwargs=True)
    try:
        with torch.no_grad():
            for ids, mask in batches(ds):
                out = model(input_ids=ids, attention_mask=mask)
                outs.append(out.logits if hasattr(out, "logits") else out.last_hidden_state)
    finally:
        handle.remove()
    return got, outs


def run(tmp_path, model, ds, hooks, **over):
    cfg = {"data": {"batch_size": BATCH, "store": ["input_ids", "attention_mask"]}, "device": "cpu", "progress": False,
           "hooks": hooks, "output": {"path": str(tmp_path / "c.h5"), "overwrite": True}, **over}
    hookrun.run(cfg, model=model, dataset=ds)
    return h5py.File(tmp_path / "c.h5")


def hidden(o):
    return o[0] if isinstance(o, tuple) else o


def test_gpt2_token_rows_last_token_and_masked_mean(tmp_path, data):
    model = build("gpt2")
    outs, _ = raw(model, data, model.transformer.h[1], fn=lambda got, a, k, o: got.append(hidden(o).clone()))
    mask = data.encoded["attention_mask"].bool()
    full = torch.cat(outs)  # (11, 16, 32)
    hooks = {"res": {"at": "transformer.h.*", "type": "forward", "actions": [{"name": "record", "what": "output", "rows": "token"}]},
             "last": {"at": "transformer.h.1", "type": "forward", "actions": [{"name": "record", "what": "output", "select": {"dim": "token", "index": "last"}}]},
             "mean": {"at": "transformer.h.1", "type": "forward", "actions": [{"name": "record", "what": "output", "reduce": "mean", "dims": "token"}]}}
    with run(tmp_path, model, data, hooks) as f:
        np.testing.assert_allclose(f["captures/res/transformer.h.1/output"][:], full[mask].numpy(), rtol=1e-5, atol=1e-6)
        pos = mask.nonzero()
        np.testing.assert_array_equal(f["samples/token_sample"][:], pos[:, 0].numpy())
        np.testing.assert_array_equal(f["samples/token_position"][:], pos[:, 1].numpy())
        lengths = mask.sum(1)
        np.testing.assert_allclose(f["captures/last/transformer.h.1/output"][:], full[torch.arange(11), lengths - 1].numpy(), rtol=1e-5, atol=1e-6)
        m = mask[..., None].float()
        np.testing.assert_allclose(f["captures/mean/transformer.h.1/output"][:], ((full * m).sum(1) / m.sum(1)).numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(f["samples/input_ids"][:], data.encoded["input_ids"].numpy())


def test_gpt2_left_padding_last_token(tmp_path):
    ds = text(max_length=16, limit=6, padding_side="left")
    model = build("gpt2")
    outs, _ = raw(model, ds, model.transformer.ln_f, fn=lambda got, a, k, o: got.append(o.clone()))
    hooks = {"last": {"at": "transformer.ln_f", "type": "forward", "actions": [{"name": "record", "what": "output", "select": {"dim": "token", "index": "last"}}]}}
    with run(tmp_path, model, ds, hooks) as f:
        np.testing.assert_allclose(f["captures/last/transformer.ln_f/output"][:], torch.cat(outs)[:, -1].numpy(), rtol=1e-5, atol=1e-6)


def test_llama_keyword_hidden_states_replaced_as_a_raw_pre_hook(tmp_path, data):
    model = build("llama")
    attn = model.model.layers[0].self_attn

    def halve(got, a, k):
        return a, {**k, "hidden_states": k["hidden_states"] * 0.5}

    _, clean = raw(model, data, attn, "pre", lambda got, a, k: got.append(k["hidden_states"].clone()))
    _, want = raw(model, data, attn, "pre", halve)
    hooks = {"halve": {"at": "model.layers.0.self_attn", "type": "forward_pre",
                       "actions": [{"name": "record", "what": "input.hidden_states"},
                                   {"name": "replace_input", "op": "scale", "factor": 0.5, "arg": "hidden_states"}]},
             "logits": {"at": "lm_head", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
    with run(tmp_path, model, data, hooks) as f:
        got = f["captures/logits/lm_head/output"][:]
        assert f["captures/halve/model.layers.0.self_attn/input.hidden_states"].shape == (11, 16, 32)
    np.testing.assert_allclose(got, torch.cat(want).numpy(), rtol=1e-5, atol=1e-5)
    assert not np.allclose(got, torch.cat(clean).numpy(), atol=1e-3)


def test_llama_steering_vector_on_a_decoder_layer(tmp_path, data):
    model = build("llama")
    vec = torch.linspace(-1, 1, 32)
    _, want = raw(model, data, model.model.layers[1], fn=lambda got, a, k, o: (hidden(o) + vec,) + o[1:] if isinstance(o, tuple) else o + vec)
    hooks = {"steer": {"at": "model.layers.1", "type": "forward", "actions": [{"name": "modify_output", "op": "add", "value": vec.tolist(), "dim": -1}]},
             "logits": {"at": "lm_head", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
    with run(tmp_path, model, data, hooks) as f:
        np.testing.assert_allclose(f["captures/logits/lm_head/output"][:], torch.cat(want).numpy(), rtol=1e-5, atol=1e-5)


def test_llama_backward_hook_on_keyword_attention_is_refused(tmp_path, data):
    hooks = {"g": {"at": "model.layers.0.self_attn", "type": "backward", "actions": ["record"]}}
    with pytest.raises(RunError, match="use type: tensor on the same module"):
        run(tmp_path, build("llama"), data, hooks, mode="grad", loss={"_target_": "hookrun.runner.losses.lm", "_partial_": True})


def test_lm_loss_gradients_match_autograd(tmp_path, data):
    model = build("gpt2")
    hooks = {"g": {"at": "transformer.h.0", "type": "tensor", "actions": ["record"]}}
    with run(tmp_path, model, data, hooks, mode="grad", loss={"_target_": "hookrun.runner.losses.lm", "_partial_": True}) as f:
        got = f["captures/g/transformer.h.0/grad"][:]
    want = []
    keep = []
    h = model.transformer.h[0].register_forward_hook(lambda m, a, o: keep.append(o))
    for ids, mask in batches(data):
        keep.clear()
        logits = model(input_ids=ids, attention_mask=mask).logits
        labels = ids[:, 1:].masked_fill(~(mask[:, 1:].bool() & mask[:, :-1].bool()), -100)
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 259), labels.reshape(-1), ignore_index=-100)
        want.append(torch.autograd.grad(loss, hidden(keep[0]))[0])
    h.remove()
    np.testing.assert_allclose(got, torch.cat(want).numpy(), rtol=1e-4, atol=1e-7)


def test_bert_cls_token_of_every_layer(tmp_path, data):
    model = build("bert")
    outs = {}
    handles = [layer.register_forward_hook(lambda m, a, o, i=i: outs.setdefault(i, []).append(hidden(o)[:, 0].clone()))
               for i, layer in enumerate(model.encoder.layer)]
    with torch.no_grad():
        for ids, mask in batches(data):
            model(input_ids=ids, attention_mask=mask)
    for h in handles:
        h.remove()
    hooks = {"cls": {"at": "encoder.layer.*", "type": "forward", "actions": [{"name": "record", "what": "output", "select": {"dim": "token", "index": [0]}}]}}
    with run(tmp_path, model, data, hooks) as f:
        for i in range(2):
            got = f[f"captures/cls/encoder.layer.{i}/output"][:]
            np.testing.assert_allclose(got[:, 0], torch.cat(outs[i]).numpy(), rtol=1e-5, atol=1e-6)


def test_t5_position_bias_is_one_row_per_step_even_in_a_batch_of_1(tmp_path, data):
    model = build("t5")
    sa = model.encoder.block[1].layer[0]
    bias, _ = raw(model, data, sa, "pre", lambda got, a, k: got.append(k["position_bias"].clone()))
    _, want = raw(model, data, sa, "pre", lambda got, a, k: ((a[0] * 2,) + a[1:], k))
    hooks = {"bias": {"at": "encoder.block.1.layer.0", "type": "forward_pre", "actions": [{"name": "record", "what": "input.position_bias"}]},
             "double": {"at": "encoder.block.1.layer.0", "type": "forward_pre", "actions": [{"name": "replace_input", "op": "scale", "factor": 2.0, "arg": "hidden_states"}]},
             "out": {"at": "encoder.final_layer_norm", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
    with run(tmp_path, model, data, hooks) as f:
        ds = f["captures/bias/encoder.block.1.layer.0/input.position_bias"]
        assert ds.attrs["rows"] == "steps" and ds.shape[0] == 3  # (1, heads, T, T) per batch of 5, 5 and 1
        np.testing.assert_allclose(ds[:], torch.stack(bias).numpy(), rtol=1e-6)
        np.testing.assert_allclose(f["captures/out/encoder.final_layer_norm/output"][:], torch.cat(want).numpy(), rtol=1e-5, atol=1e-6)


def test_tied_parameter_is_found_by_every_name(tmp_path, data):
    model = build("gpt2")
    assert model.lm_head.weight is model.transformer.wte.weight
    hooks = {"g": {"at": "lm_head.weight", "type": "param", "actions": ["record"]}}
    with run(tmp_path, model, data, hooks, mode="grad", loss={"_target_": "hookrun.runner.losses.lm", "_partial_": True}) as f:
        got = f["captures/g/lm_head.weight/grad"][:]
    want = []
    for ids, mask in batches(data):
        logits = model(input_ids=ids, attention_mask=mask).logits
        labels = ids[:, 1:].masked_fill(~(mask[:, 1:].bool() & mask[:, :-1].bool()), -100)
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 259), labels.reshape(-1), ignore_index=-100)
        want.append(torch.autograd.grad(loss, model.lm_head.weight)[0])
    np.testing.assert_allclose(got, torch.stack(want).numpy(), rtol=1e-4, atol=1e-7)


def test_missing_parameter_hint_lists_real_names(tmp_path, data):
    from hookrun.errors import NotFoundError

    hooks = {"g": {"at": "lm_head.bias", "type": "param", "actions": ["record"]}}
    with pytest.raises(NotFoundError, match=r"has no parameter 'lm_head.bias'; .*lm_head.weight"):
        run(tmp_path, build("gpt2"), data, hooks, mode="grad", loss={"_target_": "hookrun.runner.losses.lm", "_partial_": True})


def test_a_loss_that_cannot_use_the_output_says_so(tmp_path, data):
    loss = {"_target_": "hookrun.runner.losses.cross_entropy", "_partial_": True}
    with pytest.raises(RunError, match=r"loss=cross_entropy needs a target, but the items carry none"):
        run(tmp_path, build("gpt2"), data, None, mode="grad", loss=loss)
    loss = {"_target_": "hookrun.runner.losses.sum_output", "_partial_": True, "output_key": "nope"}
    with pytest.raises(RunError, match=r"loss=sum: the model's output is a CausalLMOutputWithCrossAttentions with keys logits, \w+; set loss.output_key"):
        run(tmp_path, build("gpt2"), data, None, mode="grad", loss=loss)


def test_resume_keeps_token_rows_and_stored_keys(tmp_path, data):
    from toy_models import STOP_AT

    from hookrun.output.process import Interrupted

    hooks = {"res": {"at": "transformer.h.1", "type": "forward", "actions": [{"name": "record", "what": "output", "rows": "token"}]},
             "stop": {"at": "transformer.h.0", "type": "forward", "actions": [{"_target_": "toy_models.signal_when_told", "_partial_": True}]}}
    with run(tmp_path / "full", build("gpt2"), data, hooks) as f:
        want = {k: f[k][:] for k in ("captures/res/transformer.h.1/output", "samples/token_sample", "samples/token_position", "samples/input_ids")}
    cfg = {"data": {"batch_size": BATCH, "store": ["input_ids", "attention_mask"]}, "device": "cpu", "progress": False,
           "hooks": hooks, "output": {"path": str(tmp_path / "part.h5")}}
    STOP_AT[:] = [1]
    with pytest.raises(Interrupted):
        hookrun.run(cfg, model=build("gpt2"), dataset=data)
    hookrun.run({**cfg, "resume": True}, model=build("gpt2"), dataset=data)
    with h5py.File(tmp_path / "part.h5") as f:
        assert f.attrs["status"] == "complete"
        for k, v in want.items():
            np.testing.assert_array_equal(f[k][:], v)


def test_model_from_a_local_folder_and_a_missing_one(tmp_path):
    from hookrun.errors import ConfigError

    model = build("gpt2")
    model.save_pretrained(str(tmp_path / "gpt2"))
    loaded = hf("AutoModelForCausalLM", path=str(tmp_path / "gpt2"))
    ids = torch.randint(3, 259, (2, 8))
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits)
    with pytest.raises(ConfigError, match=r"model.path: no folder '.*/missing'"):
        hf("GPT2LMHeadModel", path=str(tmp_path / "missing"))


def test_a_local_folder_of_another_model_type_is_refused_in_one_line(tmp_path):
    """transformers built a gpt2 folder as model_class=BertModel with a warning: a random-init BERT of its
    default size (12 layers of 768), and the run went on and wrote a complete file of random weights."""
    from hookrun.errors import ConfigError

    build("gpt2").save_pretrained(str(tmp_path / "gpt2"))
    folder = str(tmp_path / "gpt2")
    with pytest.raises(ConfigError) as got:
        hf("BertModel", path=folder)
    assert str(got.value) == (f"model.path: {folder!r} holds a gpt2 model (config.json model_type), and "
                              f"model.model_class=BertModel builds bert; give model.model_class=GPT2LMHeadModel "
                              f"(or an Auto class such as AutoModelForCausalLM)")
    assert type(hf("GPT2Model", path=folder)).__name__ == "GPT2Model"  # the same type, another head: read


@pytest.mark.parametrize("name", ["gpt2", "bert"])
def test_items_longer_than_the_position_table_are_one_line_before_any_batch(tmp_path, name):
    """max_length past the model's learned positions failed in the first batch as 'IndexError: index out of
    range in self', with a failed file left. The reference is the model's own forward: 64 tokens run, 65 fail."""
    from hookrun.errors import ConfigError

    model = build(name)
    for width, runs in ((64, True), (65, False)):
        try:
            with torch.no_grad():
                model(input_ids=torch.full((1, width), 5))
            assert runs
        except (IndexError, RuntimeError):  # (BERT: its token_type_ids buffer is as long as the table)
            assert not runs
    table = {"gpt2": "transformer.wpe", "bert": "embeddings.position_embeddings"}[name]
    hooks = {"h": {"at": "**.1", "type": "forward", "actions": ["record"]}}
    with pytest.raises(ConfigError) as got:
        run(tmp_path, model, text(max_length=65, limit=3), hooks)
    assert str(got.value) == (f"data: the items hold 65 tokens (input_ids), more than the 64 positions of "
                              f"{type(model).__name__} ({table}); set data.dataset.max_length=64 or less (data=text "
                              f"cuts each text to it), or give shorter items")
    assert not (tmp_path / "c.h5").exists()
    with run(tmp_path, model, text(max_length=64, limit=3), hooks) as f:
        assert f.attrs["status"] == "complete"
