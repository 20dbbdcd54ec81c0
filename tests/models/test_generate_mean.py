"""op: mean at generate's new-token passes against Hugging Face generate with raw PyTorch hooks, same weights and prompts.

A sample past its end-of-sequence token is fed padding: not a real token, so it stays out of the
mean (and keeps its own values), as padding does in the prompt pass."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch
from torch.utils.data import default_collate
from toy_lm import PAD, Prompts, tiny_gpt2

import hookrun

pytest.importorskip("transformers")

N_NEW, EOS = 6, 41  # (41: the first token of sample 2, the other samples' text runs on)


def raw_generate(alive_only: bool) -> np.ndarray:
    """The new tokens with block 0's output at each new token replaced by the mean over the samples
    still generating (alive_only) or over the whole batch; a raw pre-hook on the model reads the fed tokens."""
    model, ds, state = tiny_gpt2(), Prompts(n=4), {}
    batch = default_collate([ds[i] for i in range(4)])

    def pre(module, args, kwargs):
        ids = kwargs["input_ids"]
        state["alive"] = torch.ones(4, dtype=torch.bool) if ids.shape[1] > 1 else state["alive"] & (ids[:, -1] != EOS)

    def hook(module, args, output):
        hidden = output[0] if isinstance(output, tuple) else output
        if hidden.shape[1] > 1:  # the prompt pass
            return None
        alive = state["alive"] if alive_only else torch.ones(4, dtype=torch.bool)
        hidden = hidden.clone()
        hidden[alive] = hidden[alive].mean(0, keepdim=True)
        return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

    model.register_forward_pre_hook(pre, with_kwargs=True)
    model.transformer.h[0].register_forward_hook(hook)
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=N_NEW, do_sample=False, pad_token_id=PAD, eos_token_id=EOS)
    new = out[:, batch["input_ids"].shape[1]:].numpy()
    for row in new:  # (as /samples/generated_ids: after the EOS token, -1)
        if EOS in row:
            row[list(row).index(EOS) + 1:] = -1
    return new


def test_mean_at_new_tokens_leaves_out_the_samples_past_their_end_of_sequence_token(tmp_path):
    c = {"model": {"_target_": "toy_lm.tiny_gpt2"}, "data": {"dataset": {"_target_": "toy_lm.Prompts", "n": 4}, "batch_size": 4},
         "mode": "generate", "generate": {"max_new_tokens": N_NEW, "eos_token_id": EOS}, "device": "cpu", "progress": False,
         "hooks": {"m": {"at": "transformer.h.0", "type": "forward",
                         "actions": [{"name": "modify_output", "op": "mean", "positions": "generated"}]}},
         "output": {"path": str(tmp_path / "mean.h5")}}
    with h5py.File(hookrun.run(c).path) as f:
        got = f["samples/generated_ids"][:]
    expected = raw_generate(alive_only=True)
    assert (expected == EOS).any() and not np.array_equal(expected, raw_generate(alive_only=False))  # (the test tells them apart)
    np.testing.assert_array_equal(got, expected)
