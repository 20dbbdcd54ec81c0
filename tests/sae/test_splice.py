"""op: splice (issue 20): an SAE written in SAELens' format by this test is spliced into a tiny GPT-2's
block output. References, computed here from the saved tensors: a raw forward hook that returns
the SAE's reconstruction (relu((x - b_dec) W_enc + b_enc) W_dec + b_dec), the clean model's
logits, and raw hooks that zero a latent or add a decoder row."""

from __future__ import annotations

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import h5py
import numpy as np
import pytest
import torch
from toy_models import standard_sae

import hookrun
from hookrun.data import text
from hookrun.errors import ConfigError
from hookrun.models import hf

pytest.importorskip("transformers")
safetensors = pytest.importorskip("safetensors.torch")
BATCH, D, D_SAE = 4, 32, 48
BLOCK = "transformer.h.0"


@pytest.fixture(scope="module")
def data():
    return text(max_length=52, limit=8, padding_side="right")  # padded rows: the mask has zeros


def gpt2() -> torch.nn.Module:
    torch.manual_seed(0)
    return hf("GPT2LMHeadModel", {"n_layer": 2, "n_head": 2, "n_embd": D, "n_positions": 64, "vocab_size": 259}).eval()


@pytest.fixture(scope="module")
def sae(tmp_path_factory):
    """An SAELens folder (cfg.json + sae_weights.safetensors) with random weights, and those weights."""
    folder = tmp_path_factory.mktemp("sae")
    return folder, standard_sae(folder, D, D_SAE, BLOCK, sae_lens_version="6.0.0")


def encode(w, x):
    return torch.relu((x - w["b_dec"]) @ w["W_enc"] + w["b_enc"])


def decode(w, f):
    return f @ w["W_dec"] + w["b_dec"]


def logits_with(model, ds, fn=None):
    """Logits of every batch, with `fn(block output) -> replacement` as a raw forward hook (None: clean)."""
    handle = model.transformer.h[0].register_forward_hook(lambda m, a, o: fn(o)) if fn else None
    try:
        with torch.no_grad():
            return [model(input_ids=ds.encoded["input_ids"][i:i + BATCH],
                          attention_mask=ds.encoded["attention_mask"][i:i + BATCH]).logits
                    for i in range(0, len(ds), BATCH)]
    finally:
        if handle:
            handle.remove()


def run(tmp_path, model, ds, hooks):
    cfg = {"data": {"batch_size": BATCH, "store": ["input_ids", "attention_mask"]}, "device": "cpu", "progress": False,
           "hooks": hooks, "output": {"path": str(tmp_path / "c.h5"), "overwrite": True}}
    hookrun.run(cfg, model=model, dataset=ds)
    return h5py.File(tmp_path / "c.h5")


def splice_hooks(folder, **extra):
    return {"sae": {"at": BLOCK, "type": "forward", "actions": [{"name": "modify_output", "op": "splice", "path": str(folder), **extra}]},
            "logits": {"at": "lm_head", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}


def stored_logits(f):
    return torch.from_numpy(f["captures/logits/lm_head/output"][:])


def test_spliced_logits_equal_a_raw_hook_returning_the_reconstruction(tmp_path, data, sae):
    folder, w = sae
    model = gpt2()
    ref = torch.cat(logits_with(model, data, lambda x: decode(w, encode(w, x))))
    clean = torch.cat(logits_with(model, data))
    with run(tmp_path, model, data, splice_hooks(folder)) as f:
        got = stored_logits(f)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(got, clean, atol=1e-3)  # the splice changed something
    assert "sae" not in model.transformer.h[0]._modules  # the model comes back as it went in


def test_error_term_leaves_the_logits_equal_to_the_clean_models(tmp_path, data, sae):
    folder, _ = sae
    model = gpt2()
    clean = torch.cat(logits_with(model, data))
    with run(tmp_path, model, data, splice_hooks(folder, error_term=True)) as f:
        torch.testing.assert_close(stored_logits(f), clean, rtol=0, atol=0)


def test_latents_are_a_hook_point_recorded_per_token(tmp_path, data, sae):
    folder, w = sae
    model = gpt2()
    got_x = []
    logits_with(model, data, lambda x: got_x.append(x))
    hooks = {**splice_hooks(folder, error_term=True),
             "lat": {"at": f"{BLOCK}.sae.latents", "type": "forward",
                     "actions": [{"name": "record", "what": "output", "rows": "token"}]}}
    with run(tmp_path, model, data, hooks) as f:
        rows = f[f"captures/lat/{BLOCK}.sae.latents/output"][:]
        assert f[f"captures/lat/{BLOCK}.sae.latents/output"].attrs["module"] == f"{BLOCK}.sae.latents"
    mask = data.encoded["attention_mask"].bool()
    want = encode(w, torch.cat(got_x))[mask]  # real tokens only, in (sample, position) order
    assert mask.sum() < mask.numel()  # the batch is padded
    np.testing.assert_allclose(rows, want.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("error_term", [True, False])
def test_steering_a_feature_adds_its_decoder_row(tmp_path, data, sae, error_term):
    folder, w = sae
    model = gpt2()
    k, feature = 4.0, 5
    if error_term:  # the model's own output plus k x the decoder row of the feature
        ref = torch.cat(logits_with(model, data, lambda x: x + k * w["W_dec"][feature]))
    else:
        def steered(x):
            f = encode(w, x)
            f[..., feature] += k
            return decode(w, f)
        ref = torch.cat(logits_with(model, data, steered))
    hooks = {**splice_hooks(folder, error_term=error_term),
             "steer": {"at": f"{BLOCK}.sae.latents", "type": "forward",
                       "actions": [{"name": "modify_output", "op": "add_features", "features": {feature: k}}]}}
    with run(tmp_path, model, data, hooks) as f:
        torch.testing.assert_close(stored_logits(f), ref, rtol=1e-4, atol=1e-4)


def test_zeroing_and_clamping_latents_equal_raw_hooks(tmp_path, data, sae):
    folder, w = sae
    model = gpt2()

    def edited(x):
        f = encode(w, x)
        f[..., [1, 2]] = 0.0
        f[..., 7] = 3.0
        return decode(w, f)

    ref = torch.cat(logits_with(model, data, edited))
    hooks = {**splice_hooks(folder),
             "edit": {"at": f"{BLOCK}.sae.latents", "type": "forward",
                      "actions": [{"name": "modify_output", "op": "zero_features", "features": [1, 2]},
                                  {"name": "modify_output", "op": "clamp_features", "features": {7: 3.0}}]}}
    with run(tmp_path, model, data, hooks) as f:
        torch.testing.assert_close(stored_logits(f), ref, rtol=1e-4, atol=1e-4)


def test_splice_stats_equal_their_definitions(data, sae):
    """l0, mse, explained variance and dead latents over real tokens, as SpliceStats accumulates them."""
    from hookrun.hooks.actions import StepState
    from hookrun.hooks.splice import Splice
    from hookrun.sae import load_sae

    folder, w = sae
    x = torch.randn(3, 5, D, generator=torch.Generator().manual_seed(3))
    valid = torch.ones(3, 5, dtype=torch.bool)
    valid[1, 3:] = False
    state = StepState()
    state.call_tokens = type("T", (), {"valid": valid})()
    s = Splice(load_sae(folder), BLOCK, False, state)
    s.stats.reset_batch()
    s(x)
    rows = x[valid].double()
    f = encode(w, x)[valid].double()
    err = rows - decode(w, encode(w, x))[valid].double()
    var = (rows - rows.mean(0)).pow(2).sum(-1).mean()
    got = s.stats.totals()
    assert got["l0"] == pytest.approx(float((f > 0).sum(-1).double().mean()))
    assert got["mse"] == pytest.approx(float(err.pow(2).mean()), rel=1e-5)
    assert got["explained_variance"] == pytest.approx(float(1 - err.pow(2).sum(-1).mean() / var), rel=1e-5)
    assert got["dead_fraction"] == pytest.approx(float(((f > 0).sum(0) == 0).double().mean()))


# -- bad input: one line, before any batch ------------------------------------------------------------
def test_a_folder_of_no_known_format_says_what_it_found(tmp_path, data):
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "weights.bin").write_bytes(b"0")
    with pytest.raises(ConfigError, match=r"hooks\.sae\.actions\.0.*no SAE folder I know: found \[weights\.bin\]"):
        run(tmp_path, gpt2(), data, splice_hooks(tmp_path / "junk"))
    assert not (tmp_path / "c.h5").exists()


def test_an_sae_of_the_wrong_width_names_both_numbers_before_any_batch(tmp_path, data):
    folder = tmp_path / "wide"
    folder.mkdir()
    d = 16
    safetensors.save_file({"W_enc": torch.zeros(d, 8), "W_dec": torch.zeros(8, d), "b_enc": torch.zeros(8),
                           "b_dec": torch.zeros(d)}, str(folder / "sae_weights.safetensors"))
    (folder / "cfg.json").write_text(json.dumps({"architecture": "standard", "d_in": d, "d_sae": 8}))
    model = gpt2()
    with pytest.raises(ConfigError, match=rf"reads d_in={d} but {BLOCK}'s output has {D} features"):
        run(tmp_path, model, data, splice_hooks(folder))
    assert not (tmp_path / "c.h5").exists()
    assert "sae" not in model.transformer.h[0]._modules


def test_the_splice_check_and_the_site_check_share_one_forward_of_the_first_sample(tmp_path, data, sae):
    """A splice beside an op site: both checks listen to one forward of the first sample, then the
    batches run; the model's forwards are counted with a raw pre-hook on it."""
    folder, w = sae
    model = gpt2()
    ref = torch.cat(logits_with(model, data, lambda x: decode(w, encode(w, x))))
    calls = []
    handle = model.register_forward_pre_hook(lambda m, a: calls.append(1))
    hooks = {**splice_hooks(folder), "soft": {"at": "transformer.h.1.attn/softmax", "type": "forward",
                                               "actions": [{"name": "record", "what": "output"}]}}
    model.config._attn_implementation = "eager"  # a softmax site needs eager attention
    try:
        with run(tmp_path, model, data, hooks) as f:
            torch.testing.assert_close(stored_logits(f), ref, rtol=1e-5, atol=1e-5)
    finally:
        handle.remove()
    assert len(calls) == 1 + len(range(0, len(data), BATCH))  # one probe forward, then the batches


def test_the_actions_tensor_check_shares_that_forward_too(tmp_path, data, sae):
    """top_examples checks its tensor's feature axis in one sample's forward: it listens to the same
    forward as the splice and site checks (two forwards before the batches, before)."""
    folder, w = sae
    model = gpt2()
    ref = torch.cat(logits_with(model, data, lambda x: decode(w, encode(w, x))))
    calls = []
    handle = model.register_forward_pre_hook(lambda m, a: calls.append(1))
    hooks = {**splice_hooks(folder),
             "soft": {"at": "transformer.h.1.attn/softmax", "type": "forward", "actions": [{"name": "record", "what": "output"}]},
             "top": {"at": f"{BLOCK}.sae.latents", "type": "forward", "actions": [{"name": "top_examples", "k": 2}]}}
    model.config._attn_implementation = "eager"  # a softmax site needs eager attention
    try:
        with run(tmp_path, model, data, hooks) as f:
            torch.testing.assert_close(stored_logits(f), ref, rtol=1e-5, atol=1e-5)
    finally:
        handle.remove()
    assert len(calls) == 1 + len(range(0, len(data), BATCH))  # one forward for every check, then the batches


def test_splice_on_an_input_or_an_op_site_is_refused(tmp_path, data, sae):
    folder, _ = sae
    hooks = {"s": {"at": BLOCK, "type": "forward_pre", "actions": [{"name": "replace_input", "op": "splice", "path": str(folder)}]}}
    with pytest.raises(ConfigError, match=r"op splice replaces a module's output: use it in \{name: modify_output"):
        run(tmp_path, gpt2(), data, hooks)
    hooks = {"s": {"at": f"{BLOCK}/add", "type": "forward", "actions": [{"name": "modify_output", "op": "splice", "path": str(folder)}]}}
    with pytest.raises(ConfigError, match=r"is an op site \(splice the module transformer\.h\.0 instead\)"):
        run(tmp_path, gpt2(), data, hooks)


def test_capture_splices_in_a_notebook_too(data, sae):
    folder, w = sae
    model = gpt2()
    ids, mask = data.encoded["input_ids"][:2], data.encoded["attention_mask"][:2]
    ref = logits_with(model, data, lambda x: decode(w, encode(w, x)))[0][:2]
    hooks = {"s": {"at": BLOCK, "type": "forward", "actions": [{"name": "modify_output", "op": "splice", "path": str(folder)}]},
             "l": {"at": "lm_head", "type": "forward", "actions": ["record"]}}
    with hookrun.capture(model, hooks) as cap, torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    torch.testing.assert_close(cap["lm_head", "output"], ref, rtol=1e-5, atol=1e-5)
    assert "sae" not in model.transformer.h[0]._modules


def zero_in_place(x, ctx, feature=5):
    """An op that edits the latents in place and hands the same tensor back."""
    x[..., feature] = 0
    return x


def test_an_in_place_edit_of_the_latents_with_the_error_term_changes_the_output(tmp_path, data, sae):
    """It was dropped in silence (the edited tensor was the latents object itself, read as 'no edit'),
    while the statistics were taken on the edited latents. Reference: raw hooks on the saved weights."""
    folder, w = sae
    model = gpt2()
    feature = 5

    def edited(x):
        f = encode(w, x)
        g = f.clone()
        g[..., feature] = 0
        return x + (decode(w, g) - decode(w, f))

    ref = torch.cat(logits_with(model, data, edited))
    hooks = {**splice_hooks(folder, error_term=True),
             "edit": {"at": f"{BLOCK}.sae.latents", "type": "forward", "actions": [
                 {"name": "modify_output", "op": {"_target_": "test_splice.zero_in_place", "_partial_": True}}]}}
    with run(tmp_path, model, data, hooks) as f:
        torch.testing.assert_close(stored_logits(f), ref, rtol=1e-4, atol=1e-4)
        assert not torch.equal(ref, torch.cat(logits_with(model, data)))  # (the edit changes the logits)


def test_a_gradient_hook_on_the_latents_fires_with_the_error_term(tmp_path, data, sae):
    """With error_term the output was the model's own x whenever no edit was made, so the latents were out
    of the graph: a `type: tensor` hook on them never fired (the run said the module did not run).
    Reference: torch.autograd.grad of the same loss through a raw hook built from the saved weights."""
    from hookrun.runner.losses import lm

    folder, w = sae
    model = gpt2()
    hooks = {**splice_hooks(folder, error_term=True),
             "g": {"at": f"{BLOCK}.sae.latents", "type": "tensor", "actions": ["record"]}}
    cfg = {"data": {"batch_size": BATCH}, "device": "cpu", "progress": False, "hooks": hooks, "mode": "grad",
           "loss": {"_target_": "hookrun.runner.losses.lm", "_partial_": True},
           "output": {"path": str(tmp_path / "g.h5")}}
    hookrun.run(cfg, model=model, dataset=data)
    ids, mask = data.encoded["input_ids"][:BATCH], data.encoded["attention_mask"][:BATCH]
    kept = {}

    def spliced(m, a, x):
        f = encode(w, x).detach().requires_grad_(True)
        kept["f"] = f
        return x + (decode(w, f) - decode(w, f).detach())

    handle = model.transformer.h[0].register_forward_hook(spliced)
    try:
        loss = lm(model(input_ids=ids, attention_mask=mask), batch={"input_ids": ids, "attention_mask": mask})
        (want,) = torch.autograd.grad(loss, [kept["f"]])
    finally:
        handle.remove()
    with h5py.File(tmp_path / "g.h5") as f:
        got = f[f"captures/g/{BLOCK}.sae.latents/grad"][:BATCH]
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-7)
