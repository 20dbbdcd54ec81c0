"""Axis names of a LLaMA attention's op sites (GQA: 4 query heads, 2 key/value heads; head_dim 16,
12 tokens): the keys transposed for q @ k^T are `head, feature, token` (they were named an attention
pattern, `head, query, key`, and `hookrun.plot` drew them as one), and rotary's half of a query,
(B, H, T, head_dim / 2), is no pattern. Each recorded tensor is checked against the same tensor
recomputed by hand from the module's own weights and input (raw torch hooks)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import h5py
import pytest
import torch

import hookrun

pytest.importorskip("transformers")
ATTN = "model.layers.0.self_attn"
CONFIG = dict(vocab_size=259, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0, bos_token_id=1, eos_token_id=2)


@pytest.fixture(scope="module")
def run_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("axes_llama") / "c.h5"
    sites = [f"{ATTN}/{s}" for s in ("transpose.3", "neg.0", "matmul.0", "softmax.0")]
    hookrun.run({"model": {"_target_": "hookrun.models.hf", "model_class": "LlamaForCausalLM", "config": CONFIG,
                           "attn_implementation": "eager"},
                 "data": {"dataset": {"_target_": "hookrun.data.text", "max_length": 12}, "batch_size": 2, "limit": 1,
                          "store": ["input_ids", "attention_mask"]},
                 "hooks": {"ops": {"at": sites, "type": "forward", "actions": [{"name": "record", "what": "output"}]}},
                 "output": {"path": str(path)}, "progress": False, "device": "cpu", "seed": 0})
    return path


def reference(ids, mask):
    """(queries after rotary, keys after rotary and the GQA repeat) of layer 0, by hand."""
    from hookrun.models import hf

    torch.manual_seed(0)  # the run's seed, before its model is built
    model = hf(model_class="LlamaForCausalLM", config=CONFIG).eval()
    attn = model.model.layers[0].self_attn
    seen = {}
    handle = attn.register_forward_pre_hook(lambda m, a, kw: seen.update(kw), with_kwargs=True)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
        handle.remove()
        x, (cos, sin) = seen["hidden_states"], seen["position_embeddings"]
        b, t, _ = x.shape
        q = attn.q_proj(x).view(b, t, 4, 16).transpose(1, 2)
        k = attn.k_proj(x).view(b, t, 2, 16).transpose(1, 2)
        rot = lambda z: z * cos[:, None] + torch.cat([-z[..., 8:], z[..., :8]], -1) * sin[:, None]  # noqa: E731
        return q, rot(q), rot(k).repeat_interleave(2, dim=1)


def test_keys_transposed_are_head_feature_token_and_rotary_half_is_no_pattern(run_file):
    with h5py.File(run_file) as f:
        ids, mask = (torch.from_numpy(f[f"samples/{k}"][:]) for k in ("input_ids", "attention_mask"))
        got = {s: f[f"captures/ops/{ATTN}%2F{s}/output"] for s in ("transpose.3", "neg.0", "matmul.0", "softmax.0")}
        names = {s: list(d.attrs["dims"]) for s, d in got.items()}
        values = {s: torch.from_numpy(d[:]) for s, d in got.items()}
    q_raw, q, keys = reference(ids, mask)
    assert values["transpose.3"].shape == (2, 4, 16, 12)
    torch.testing.assert_close(values["transpose.3"], keys.transpose(2, 3), rtol=1e-5, atol=1e-5)
    assert names["transpose.3"] == ["sample", "head", "feature", "token"]
    torch.testing.assert_close(values["neg.0"], -q_raw[..., 8:], rtol=1e-5, atol=1e-5)
    assert names["neg.0"][2:] != ["query", "key"] and "query" not in names["neg.0"]
    torch.testing.assert_close(values["matmul.0"], q @ keys.transpose(2, 3), rtol=1e-4, atol=1e-4)
    assert names["matmul.0"] == names["softmax.0"] == ["sample", "head", "query", "key"]
