"""op: patch in mode=generate against Hugging Face generate with a raw forward hook, on the same weights and prompts.

The source is a plain run of another model over the same prompts padded on the right (data=text's
default); generate pads on the left. Reference: each prompt alone (no padding) through the source
model, its block-0 output put on the prompt's real tokens by a raw hook on the prompt pass."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch
from torch.utils.data import default_collate
from toy_lm import EOS, PAD, Prompts, tiny_gpt2

import hookrun
from hookrun.errors import ConfigError

pytest.importorskip("transformers")

N_NEW, BATCH = 5, 4


def cfg(tmp_path, name, hooks, mode="generate", side="left", **model) -> dict:
    return {"model": {"_target_": "toy_lm.tiny_gpt2", **model},
            "data": {"dataset": {"_target_": "toy_lm.Prompts", "side": side}, "batch_size": BATCH,
                     "store": ["attention_mask"]},
            "mode": mode, "generate": {"max_new_tokens": N_NEW}, "device": "cpu", "hooks": hooks, "progress": False,
            "output": {"path": str(tmp_path / name)}}


def patch(source, positions="prompt") -> dict:
    return {"p": {"at": "transformer.h.0", "type": "forward", "actions": [
        {"name": "modify_output", "op": "patch", "source": str(source), "positions": positions}]}}


def source_run(tmp_path):
    record = {"r": {"at": "transformer.h.0", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
    return hookrun.run(cfg(tmp_path, "source.h5", record, mode="eval", side="right", seed=1)).path


def test_a_right_padded_source_patches_each_real_token_of_the_left_padded_prompts(tmp_path):
    got = hookrun.run(cfg(tmp_path, "patched.h5", patch(source_run(tmp_path))))
    with h5py.File(got.path) as f:
        ids = f["samples/generated_ids"][:]
    other, model, ds = tiny_gpt2(seed=1), tiny_gpt2(), Prompts()
    clean = []  # the source model's block-0 output on each prompt alone (a raw hook, a forward without padding)
    other.transformer.h[0].register_forward_hook(lambda m, a, o: clean.append((o[0] if isinstance(o, tuple) else o)[0]))
    for i in range(len(ds)):
        with torch.no_grad():
            other(ds[i]["input_ids"][ds[i]["attention_mask"].bool()][None])
    expected = []
    for start in range(0, len(ds), BATCH):
        idx = list(range(start, min(start + BATCH, len(ds))))
        batch = default_collate([ds[i] for i in idx])
        mask = batch["attention_mask"].bool()

        def hook(module, args, output, idx=idx, mask=mask):
            hidden = output[0] if isinstance(output, tuple) else output
            if hidden.shape[1] == 1:  # a new token's pass
                return None
            hidden = hidden.clone()
            for b, i in enumerate(idx):
                hidden[b, mask[b]] = clean[i]
            return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

        handle = model.transformer.h[0].register_forward_hook(hook)
        with torch.no_grad():
            out = model.generate(**batch, max_new_tokens=N_NEW, do_sample=False, pad_token_id=PAD, eos_token_id=EOS)
        handle.remove()
        expected.extend(out[:, batch["input_ids"].shape[1]:].tolist())
    for row, want in zip(ids, expected, strict=True):
        n = want.index(EOS) + 1 if EOS in want else N_NEW
        np.testing.assert_array_equal(row[:n], want[:n])
    # the source model patched with its own activations on the same prompts: the text of no patch
    plain = hookrun.run(cfg(tmp_path, "plain.h5", None, seed=1))
    selfpatch = hookrun.run(cfg(tmp_path, "self.h5", patch(tmp_path / "source.h5"), seed=1))
    with h5py.File(plain.path) as a, h5py.File(selfpatch.path) as b:
        np.testing.assert_array_equal(a["samples/generated_ids"][:], b["samples/generated_ids"][:])


def test_patch_at_the_new_tokens_is_refused_before_any_batch(tmp_path):
    source = source_run(tmp_path)
    with pytest.raises(ConfigError, match=r"^hooks.p.actions.0: op patch with positions: all in mode=generate: .*; "
                                          r"give positions: prompt$"):
        hookrun.run(cfg(tmp_path, "patched.h5", patch(source, "all")))
    assert not (tmp_path / "patched.h5").exists()


def test_a_source_of_other_prompts_is_refused_in_one_line(tmp_path):
    record = {"r": {"at": "transformer.h.0", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
    c = cfg(tmp_path, "source.h5", record, mode="eval", side="right")
    c["data"]["dataset"]["length"] = 6  # (prompts of 2 to 6 tokens: other lengths than the 2 to 7 patched)
    source = hookrun.run(c).path
    with pytest.raises(hookrun.errors.RunError, match=r"^hooks.p: patch source .*: sample 2 has 3 real tokens in the "
                                                      r"source and 2 here, padded on the other side; patch a run of the same prompts, or pad both on one side \(data.dataset.padding_side\)$"):
        hookrun.run(cfg(tmp_path, "patched.h5", patch(source)))
