"""logit_lens equals log_softmax(lm_head(ln_f(resid))) computed here with the model's own modules
on the residual stream raw forward hooks caught, with the target's log-probability, its rank and
KL(final || lens) computed independently; in a file run (with chunks of a few positions), in
hookrun.capture, and its bad inputs are one line before any batch."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

import hookrun
from hookrun.analysis import open_run
from hookrun.data.text import text
from hookrun.errors import ConfigError
from hookrun.hooks.actions import lens as lens_module
from hookrun.models import tiny_lm

LENS = {"name": "logit_lens", "norm": "transformer.ln_f", "unembed": "lm_head", "top_k": 4,
        "target": "input_ids", "target_shift": 1}


@pytest.fixture(scope="module")
def model():
    return tiny_lm().eval()


@pytest.fixture(scope="module")
def data():
    return text(files="pydoc_topics", max_length=16, limit=6)


def reference(model, ids: torch.Tensor, mask: torch.Tensor, layer: int, k: int) -> dict[str, np.ndarray]:
    """The lens of block `layer`'s output, from a raw hook and the model's own ln_f and lm_head."""
    caught = {}
    h = model.transformer.h[layer].register_forward_hook(
        lambda m, a, out: caught.setdefault("x", out[0] if isinstance(out, tuple) else out))
    try:
        with torch.no_grad():
            final = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits.double(), -1)
    finally:
        h.remove()
    with torch.no_grad():
        lp = torch.log_softmax(model.lm_head(model.transformer.ln_f(caught["x"])).double(), -1)
    top = torch.topk(lp, k, dim=-1)
    nxt = ids[:, 1:]
    tlp = torch.full(ids.shape, float("nan"), dtype=torch.float64)
    tlp[:, :-1] = lp[:, :-1].gather(-1, nxt[..., None])[..., 0]
    valid = torch.zeros(ids.shape, dtype=torch.bool)
    valid[:, :-1] = mask[:, 1:].bool()
    tlp[~valid] = float("nan")
    rank = torch.full(ids.shape, -1, dtype=torch.int64)
    lp_np, nxt_np = lp.numpy(), nxt.numpy()
    for b in range(ids.shape[0]):
        for t in range(ids.shape[1] - 1):
            if valid[b, t]:
                rank[b, t] = int((lp_np[b, t] > lp_np[b, t, nxt_np[b, t]]).sum())
    kl = (final.exp() * (final - lp)).sum(-1)
    return {"lens.top_ids": top.indices.numpy(), "lens.top_logprobs": top.values.numpy(),
            "lens.target_logprob": tlp.numpy(), "lens.target_rank": rank.numpy(), "lens.kl_to_final": kl.numpy()}


def check(got: dict, want: dict) -> None:
    np.testing.assert_array_equal(got["lens.top_ids"], want["lens.top_ids"])
    np.testing.assert_array_equal(got["lens.target_rank"], want["lens.target_rank"])
    for role in ("lens.top_logprobs", "lens.target_logprob", "lens.kl_to_final"):
        np.testing.assert_allclose(got[role], want[role], rtol=1e-4, atol=1e-4, err_msg=role)


def test_file_run_equals_the_models_own_modules_in_small_chunks(tmp_path, model, data, monkeypatch):
    monkeypatch.setattr(lens_module, "CHUNK_ELEMENTS", 3 * 259)  # 3 positions per chunk: many chunks per batch
    cfg = {"hooks": {"lens": {"at": "transformer.h.*", "type": "forward", "actions": [LENS]}},
           "data": {"batch_size": 4}, "output": {"path": str(tmp_path / "l.h5")}, "device": "cpu", "progress": False}
    path = hookrun.run(cfg, model=model, dataset=data).path
    ids, mask = data.encoded["input_ids"], data.encoded["attention_mask"]
    with open_run(path) as run:
        for layer in (0, 3):
            got = {role: run[f"transformer.h.{layer}", role][:] for role in
                   ("lens.top_ids", "lens.top_logprobs", "lens.target_logprob", "lens.target_rank", "lens.kl_to_final")}
            check(got, reference(model, ids, mask, layer, 4))
            assert run.find(f"transformer.h.{layer}", "lens.top_ids").dims == ("sample", "position", "rank")
    assert float(np.nanmean(got["lens.kl_to_final"])) < 1e-4  # the last block's lens is the model's own output


@pytest.mark.parametrize("padded", [False, True])
def test_capture_in_a_notebook_gives_the_same_lens(model, data, padded):
    """With padding too: a position whose target is padding has no target (the notebook scored it
    against the pad id: it read no attention mask)."""
    ids, mask = data.encoded["input_ids"][:3], data.encoded["attention_mask"][:3]
    if padded:
        short = text(files="pydoc_topics", max_length=24, limit=2).encoded
        ids, mask = short["input_ids"], short["attention_mask"]
        assert not mask.all()
    with hookrun.capture(model, {"lens": {"at": "transformer.h.1", "type": "forward", "actions": [LENS]}}) as cap:
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask)
    got = {role: cap["transformer.h.1", role].numpy() for role in
           ("lens.top_ids", "lens.top_logprobs", "lens.target_logprob", "lens.target_rank", "lens.kl_to_final")}
    check(got, reference(model, ids, mask, 1, 4))


@pytest.mark.parametrize(("change", "message"), [
    ({"norm": "transformer.ln_x"}, r"norm='transformer.ln_x' is not a module of GPT2LMHeadModel; closest: transformer.ln_f"),
    ({"unembed": "lm_heads"}, r"unembed='lm_heads' is not a module .*closest: lm_head"),
    ({"top_k": 0}, r"top_k=0; expected a whole number >= 1"),
    ({"target": "labels"}, r"target='labels' is not a key of the items; their keys: input_ids, attention_mask"),
    ({"translator": "maps.pt"}, r"translator='maps.pt': only the identity"),
    ({"at": "transformer.h.0.attn.c_attn"}, r"has shape \(1, 16, 384\), but the unembedding takes \(batch, tokens, 128\)"),
])
def test_bad_inputs_are_one_line_before_any_batch(tmp_path, model, data, change, message):
    at = change.pop("at", "transformer.h.1")
    cfg = {"hooks": {"lens": {"at": at, "type": "forward", "actions": [{**LENS, **change}]}},
           "data": {"batch_size": 4}, "output": {"path": str(tmp_path / "bad.h5")}, "device": "cpu", "progress": False}
    with pytest.raises(ConfigError, match=message):
        hookrun.run(cfg, model=model, dataset=data)
    assert not (tmp_path / "bad.h5").exists()
    assert not any(m._forward_hooks for m in model.modules())  # the final-logits hook is gone too


@pytest.mark.slow
def test_the_shipped_experiment_runs_from_the_cli_and_sharpens_layer_by_layer(tmp_path):
    from conftest import run_cli

    proc = run_cli("experiment=logit_lens", f"hydra.run.dir={tmp_path}", "data.dataset.limit=16", "device=cpu",
                   "progress=false")
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open_run(tmp_path / "captures.h5") as run:
        real = run.file["samples/attention_mask"][:].astype(bool)
        layers = ["transformer.drop", *(f"transformer.h.{i}" for i in range(4))]
        kl = [float(run[m, "lens.kl_to_final"][:][real].mean()) for m in layers]
        hit = [float((run[m, "lens.target_rank"][:][real[:, 1:].nonzero()] == 0).mean()) for m in layers]
    assert kl == sorted(kl, reverse=True) and kl[-1] < 1e-4 < 1 < kl[0], kl  # the last block's lens is the output
    assert hit == sorted(hit) and hit[-1] > 0.4, hit  # the next byte is the top guess more often, layer by layer


def manual_lens(model, x: torch.Tensor) -> torch.Tensor:
    """log_softmax(layer_norm(x; ln_f) @ W_U) in float64, from the weights (not the modules)."""
    ln = model.transformer.ln_f
    with torch.no_grad():
        h = torch.nn.functional.layer_norm(x.double(), (x.shape[-1],), ln.weight.double(), ln.bias.double(), ln.eps)
        return torch.log_softmax(h @ model.lm_head.weight.double().T, -1)


@pytest.mark.parametrize("left", [False, True])
def test_a_position_on_padding_has_no_target(tmp_path, model, left):
    """Both a scalar target (an answer token) and the next token: a position on padding has none,
    left- and right-padded alike (the scalar was scored at every padding position, the next token at
    left padding whose next position is real)."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1, 259, (4, 10), generator=g)
    mask = torch.ones(4, 10, dtype=torch.long)
    for i, pad in enumerate((0, 1, 3, 5)):
        if pad:
            (mask[i, :pad] if left else mask[i, -pad:]).zero_()
    ids = ids.masked_fill(mask == 0, 0)
    items = [{"input_ids": ids[i], "attention_mask": mask[i], "answer": torch.tensor(7)} for i in range(4)]
    caught = {}
    h = model.transformer.h[1].register_forward_hook(lambda m, a, o: caught.setdefault("x", o[0] if isinstance(o, tuple) else o))
    with torch.no_grad():  # (positions from each item's first real token, as generate() counts them)
        model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0))
    h.remove()
    lp, real = manual_lens(model, caught["x"]), mask.bool()
    for target, shift, want_ids, ok in [("answer", 0, torch.full((4, 10), 7), real),
                                        ("input_ids", 1, torch.cat([ids[:, 1:], ids[:, :1]], 1),
                                         real & torch.cat([real[:, 1:], torch.zeros(4, 1, dtype=torch.bool)], 1))]:
        lens = {**LENS, "target": target, "target_shift": shift}
        cfg = {"hooks": {"lens": {"at": "transformer.h.1", "type": "forward", "actions": [lens]}},
               "data": {"batch_size": 4}, "output": {"path": str(tmp_path / f"{target}.h5")}, "device": "cpu", "progress": False}
        path = hookrun.run(cfg, model=model, dataset=items).path
        tlp = lp.gather(-1, want_ids[..., None])[..., 0]
        # the rank as a range: a token within float32 rounding of the target's log-prob (the lens runs in the
        # model's float32, this reference in float64) may count above it or not, by the CPU's kernels
        low = (lp > tlp[..., None] + 1e-5).sum(-1)
        high = (lp > tlp[..., None] - 1e-5).sum(-1) - 1  # (less the target itself)
        with open_run(path) as run:
            got_rank, got_lp = run["transformer.h.1", "lens.target_rank"][:], run["transformer.h.1", "lens.target_logprob"][:]
        assert (got_rank[~ok.numpy()] == -1).all(), target
        assert ((low.numpy() <= got_rank) & (got_rank <= high.numpy()))[ok.numpy()].all(), target
        assert (high - low)[ok].max() <= 1, target  # (at most one near-tie: the range is a real check)
        np.testing.assert_allclose(got_lp, np.where(ok.numpy(), tlp.numpy(), np.nan), rtol=1e-4, atol=1e-4, err_msg=target)
        assert (got_rank[~real.numpy()] == -1).all()


def test_a_dict_dataset_without_data_store_keeps_its_attention_mask(tmp_path, model, data):
    """The lens ran on the batches' mask; the file keeps it (/samples/attention_mask), so its mean
    pictures leave padding out though data.store names no key."""
    items = [{"input_ids": data.encoded["input_ids"][i], "attention_mask": data.encoded["attention_mask"][i]} for i in range(6)]
    items[1]["attention_mask"][-5:] = 0
    cfg = {"hooks": {"lens": {"at": "transformer.h.1", "type": "forward", "actions": [LENS]}},
           "data": {"batch_size": 4, "store": []}, "output": {"path": str(tmp_path / "m.h5")}, "device": "cpu", "progress": False}
    path = hookrun.run(cfg, model=model, dataset=items).path
    with h5py.File(path, "r") as f:
        np.testing.assert_array_equal(f["samples/attention_mask"][:], torch.stack([it["attention_mask"] for it in items]).numpy())


@pytest.mark.parametrize("family", ["gemma2", "granite", "cohere"])
def test_the_final_distribution_is_the_models_output_after_its_softcap_or_scale(tmp_path, family):
    """Gemma 2's final_logit_softcapping, Granite's logits_scaling and Cohere's logit_scale change
    lm_head's output in the model's forward: the lens's final distribution is the model's own output
    (its logits), and each layer's logits take the same step."""
    import transformers as tf

    torch.manual_seed(0)
    shape = {"vocab_size": 60, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "pad_token_id": 0}
    cfg_cls, model_cls, extra = {"gemma2": (tf.Gemma2Config, tf.Gemma2ForCausalLM, {"final_logit_softcapping": 2.0, "head_dim": 8}),
                                 "granite": (tf.GraniteConfig, tf.GraniteForCausalLM, {"logits_scaling": 8.0}),
                                 "cohere": (tf.CohereConfig, tf.CohereForCausalLM, {"logit_scale": 0.25})}[family]
    lm = model_cls(cfg_cls(**shape, **extra)).eval()
    with torch.no_grad():
        lm.lm_head.weight.mul_(20)
    ids = torch.randint(1, 60, (3, 7), generator=torch.Generator().manual_seed(1))
    items = [{"input_ids": ids[i], "attention_mask": torch.ones(7, dtype=torch.long)} for i in range(3)]
    lens = {"name": "logit_lens", "norm": "model.norm", "unembed": "lm_head", "top_k": 60}
    cfg = {"hooks": {"lens": {"at": "model.layers.*", "type": "forward", "actions": [lens]}},
           "data": {"batch_size": 3}, "output": {"path": str(tmp_path / "g.h5")}, "device": "cpu", "progress": False}
    path = hookrun.run(cfg, model=lm, dataset=items).path
    caught = {}
    h = lm.model.layers[0].register_forward_hook(lambda m, a, o: caught.setdefault("x", o[0] if isinstance(o, tuple) else o))
    with torch.no_grad():
        final = torch.log_softmax(lm(input_ids=ids).logits.double(), -1)  # the model's own output
        h.remove()
        z = lm.lm_head(lm.model.norm(caught["x"])).double()
    post = {"gemma2": lambda z: torch.tanh(z / 2.0) * 2.0, "granite": lambda z: z / 8.0, "cohere": lambda z: z * 0.25}[family]
    lp0 = torch.log_softmax(post(z), -1)
    with open_run(path) as run:
        last = run["model.layers.1", "lens.top_logprobs"][:]
        np.testing.assert_allclose(last, final.sort(-1, descending=True).values.numpy(), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(run["model.layers.1", "lens.kl_to_final"][:], 0, atol=1e-4)
        np.testing.assert_allclose(run["model.layers.0", "lens.top_logprobs"][:], lp0.sort(-1, descending=True).values.numpy(),
                                   rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(run["model.layers.0", "lens.kl_to_final"][:],
                                   (final.exp() * (final - lp0)).sum(-1).numpy(), rtol=1e-4, atol=1e-4)


def test_the_final_distribution_takes_the_runs_own_modify_output_on_the_unembed(tmp_path, model, data):
    """A modify_output on lm_head changes the logits the model returns: KL(final || lens) is taken
    against them (the lens's hook on lm_head had fired before the run's modify, so the final
    distribution was the unmodified one: the same KL with or without the modify)."""
    mod = {"at": "lm_head", "type": "forward", "actions": [{"name": "modify_output", "op": "scale", "factor": 3.0}]}
    cfg = {"hooks": {"lens": {"at": "transformer.h.1", "type": "forward", "actions": [LENS]}, "mod": mod},
           "data": {"batch_size": 3}, "output": {"path": str(tmp_path / "m.h5")}, "device": "cpu", "progress": False}
    path = hookrun.run(cfg, model=model, dataset=data).path
    ids, mask = data.encoded["input_ids"], data.encoded["attention_mask"]
    caught = {}
    hooks = [model.transformer.h[1].register_forward_hook(
        lambda m, a, o: caught.setdefault("x", o[0] if isinstance(o, tuple) else o)),
             model.lm_head.register_forward_hook(lambda m, a, o: o * 3.0)]  # a raw hook doing the same modify
    try:
        with torch.no_grad():
            final = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits.double(), -1)
    finally:
        for h in hooks:
            h.remove()
    with torch.no_grad():
        lp = torch.log_softmax(model.lm_head(model.transformer.ln_f(caught["x"])).double(), -1)
    with open_run(path) as run:
        np.testing.assert_allclose(run["transformer.h.1", "lens.kl_to_final"][:], (final.exp() * (final - lp)).sum(-1).numpy(),
                                   rtol=1e-4, atol=1e-4)
