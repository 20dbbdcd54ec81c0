"""Axis names of attention's op sites when a sequence is as long as a head is wide (issue 34, item
7): tiny_lm (head_dim 32) over 32 tokens. The names come from the structure of the calls (which
operand is the pattern, which the queries and keys), checked against what the tensors are: the
scores recomputed from the module's own c_attn weights, the probabilities as their softmax."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import h5py
import pytest
import torch

import hookrun
from hookrun.hooks.site_axes import Call, site_axes

pytest.importorskip("transformers")
ATTN = "transformer.h.0.attn"


@pytest.fixture(scope="module")
def run_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("axes") / "c.h5"
    sites = [f"{ATTN}/matmul", f"{ATTN}/add", f"{ATTN}/softmax"]
    cfg = hookrun.compose("model=tiny_lm", "data=text", "data.dataset.max_length=32", "data.limit=1", "data.batch_size=2",
                          "device=cpu", "progress=false", f"output.path={path}",
                          f"hooks={{out: {{at: [{', '.join(sites)}], type: forward, actions: [{{name: record, what: output}}]}}, "
                          f"args: {{at: {ATTN}/matmul, type: forward_pre}}}}")
    hookrun.run(cfg)
    return path


def dims(f, hook, site, role):
    d = f[f"captures/{hook}/{ATTN}%2F{site}/{role}"]
    return list(d.attrs["dims"]), torch.from_numpy(d[:])


def test_head_dim_equals_the_sequence_length(run_file):
    from hookrun.models import tiny_lm

    attn = tiny_lm().transformer.h[0].attn
    with h5py.File(run_file) as f:
        assert f["samples/input_ids"].shape[1] == 32 == attn.head_dim


def test_scores_and_pattern_are_named_query_key_and_the_values_product_token_feature(run_file):
    from hookrun.models import tiny_lm

    model = tiny_lm()
    with h5py.File(run_file) as f:
        ids = torch.from_numpy(f["samples/input_ids"][:])
        mask = torch.from_numpy(f["samples/attention_mask"][:])
        scores_names, scores = dims(f, "out", "matmul.0", "output")
        assert scores_names == ["sample", "head", "query", "key"]
        assert dims(f, "out", "add.0", "output")[0] == ["sample", "head", "query", "key"]  # the mask added
        assert dims(f, "out", "softmax.0", "output")[0] == ["sample", "head", "query", "key"]
        assert dims(f, "out", "matmul.1", "output")[0] == ["sample", "head", "token", "feature"]
        assert dims(f, "args", "matmul.0", "input.0")[0] == ["sample", "head", "token", "feature"]  # queries
        assert dims(f, "args", "matmul.0", "input.1")[0] == ["sample", "head", "feature", "token"]  # keys, transposed
        assert dims(f, "args", "matmul.1", "input.0")[0] == ["sample", "head", "query", "key"]  # the pattern
    seen = []  # the reference: q @ k^T from the block's own input and c_attn weights
    block = model.transformer.h[0]
    handle = block.attn.register_forward_pre_hook(lambda m, args, kwargs: seen.append(args[0] if args else kwargs["hidden_states"]),
                                                  with_kwargs=True)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    handle.remove()
    q, k, _ = block.attn.c_attn(seen[0]).split(block.attn.embed_dim, dim=2)
    heads = lambda t: t.view(*t.shape[:2], block.attn.num_heads, block.attn.head_dim).transpose(1, 2)  # noqa: E731
    torch.testing.assert_close(scores, heads(q) @ heads(k).transpose(-1, -2), rtol=1e-4, atol=1e-4)


def test_site_axes_follows_tensor_identity_not_sizes():
    """A hand-written attention forward with T == head_dim: every tensor (B, H, 4, 4)."""
    q, k, v = (torch.randn(1, 2, 4, 4) for _ in range(3))
    kt = k.transpose(-1, -2)
    s = q @ kt
    scaled = s * 0.5
    p = scaled.softmax(-1)
    dropped = torch.nn.functional.dropout(p, 0.0)
    out = dropped @ v
    calls = [Call("transpose", 0, {"input": k}, {"output": kt}), Call("matmul", 0, {"input.0": q, "input.1": kt}, {"output": s}),
             Call("mul", 0, {"input.0": s}, {"output": scaled}), Call("softmax", 0, {"input": scaled}, {"output": p}),
             Call("dropout", 0, {"input": p}, {"output": dropped}), Call("matmul", 1, {"input.0": dropped, "input.1": v}, {"output": out})]
    axes = site_axes(calls)
    pattern, per_head = ("head", "query", "key"), ("head", "token", "feature")
    assert axes[("matmul", 0, "output")] == axes[("mul", 0, "output")] == axes[("softmax", 0, "output")] == pattern
    assert axes[("dropout", 0, "output")] == axes[("matmul", 1, "input.0")] == pattern
    assert axes[("matmul", 1, "output")] == axes[("matmul", 1, "input.1")] == axes[("matmul", 0, "input.0")] == per_head
    assert axes[("matmul", 0, "input.1")] == ("head", "feature", "token")
    # the transpose's result is the very tensor q @ k^T reads: the keys, transposed; its input is past a permutation
    assert axes[("transpose", 0, "output")] == ("head", "feature", "token")
    assert ("transpose", 0, "input") not in axes
