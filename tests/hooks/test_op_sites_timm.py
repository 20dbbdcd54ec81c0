"""Op sites inside timm's attention (issue 34, item 14): timm runs fused scaled_dot_product_attention
unless a module's `fused_attn` is False, so no softmax runs. hookrun switches the attention modules
an op site targets to their unfused path (logged) and restores them afterwards; the lister does the
same. Reference: the attention pattern computed here from the module's own qkv weights."""

from __future__ import annotations

import logging

import pytest
import torch

import hookrun

timm = pytest.importorskip("timm")
SITE = "blocks.0.attn/softmax"


def vit() -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, num_classes=10).eval()


def reference_pattern(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T * scale) of blocks.0.attn from its input and its qkv weights (plain torch)."""
    attn, seen = model.blocks[0].attn, []
    handle = attn.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    with torch.no_grad():
        model(x)
    handle.remove()
    h = seen[0]
    b, n, c = h.shape
    qkv = torch.nn.functional.linear(h, attn.qkv.weight, attn.qkv.bias).reshape(b, n, 3, attn.num_heads, c // attn.num_heads)
    q, k = qkv.permute(2, 0, 3, 1, 4)[:2]
    return ((q * attn.scale) @ k.transpose(-2, -1)).softmax(-1)


def test_a_softmax_site_in_timm_attention_records_the_pattern_and_restores_fused_attention(caplog):
    model, x = vit(), torch.randn(2, 3, 32, 32)
    assert model.blocks[0].attn.fused_attn is True  # timm's default here: the softmax never runs
    with torch.no_grad():
        fused_logits = model(x)
    hooks = {"p": {"at": SITE, "type": "forward", "actions": ["record"]}}
    with caplog.at_level(logging.INFO, logger="hookrun"), hookrun.capture(model, hooks) as cap, torch.no_grad():
        logits = model(x)
    assert "switched from fused attention to their unfused path (fused_attn=False)" in caplog.text
    torch.testing.assert_close(cap[f"{SITE}.0", "output"], reference_pattern(model, x), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(logits, fused_logits, rtol=1e-4, atol=1e-5)  # the unfused path computes the same
    assert model.blocks[0].attn.fused_attn is True  # the live model comes back as it went in
    assert all(b.attn.fused_attn for b in model.blocks)  # modules without sites were never touched


def test_the_lister_finds_the_softmax_site_and_leaves_the_model_fused():
    model = vit()
    table = hookrun.modules(model, torch.randn(1, 3, 32, 32), match=SITE)
    assert table.names() == [f"{SITE}.0"]
    assert table[0].outputs["output"] == (1, model.blocks[0].attn.num_heads, 5, 5)  # 4 patches + the class token
    assert model.blocks[0].attn.fused_attn is True
