"""MIB's metrics on an HF Gemma 2, against the same weights as a TransformerLens HookedTransformer.

The scores are compared with EAP-IG's EAP on the HookedTransformer (its writers: hook_embed, each head's
hook_result, which comes before ln1_post, hook_mlp_out), the CPR and CMD curves with
test_mib_metrics.reference, which ablates a head's layer for a reader as EAP-IG's evaluate_graph does:
ln1_post of the layer's heads with that reader's ablated ones corrupted (plus b_O), in place of ln1_post
of the live ones.
"""

# ruff: noqa: B023  (the reference hooks are closures used within the loop iteration that defines them)

from __future__ import annotations

import numpy as np
import pytest
import torch
from edge_graph import prompt_pairs
from test_mib_metrics import MIB, H, L, T, V, eap_ig_edges, reference, scores_of, writer_outputs

import hookrun


@pytest.fixture(scope="module")
def items():
    return prompt_pairs(V, T, seed=5, at=1, shift=11)


def gemma_pair():
    """A tiny HF Gemma2ForCausalLM (4 query heads on 2 key/value heads, post-norms, eager attention, float64) and its
    weights as a TransformerLens 3.9 HookedTransformer (TransformerLens' own convert_gemma_weights)."""
    import warnings

    import transformers as tr
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions import convert_gemma_weights

    cfg = tr.Gemma2Config(vocab_size=V, hidden_size=32, num_hidden_layers=L, num_attention_heads=H, num_key_value_heads=2,
                          head_dim=8, intermediate_size=64, max_position_embeddings=32, initializer_range=0.3,
                          sliding_window=16, query_pre_attn_scalar=8, attn_logit_softcapping=None,
                          final_logit_softcapping=None, rms_norm_eps=1e-6)
    torch.manual_seed(0)
    net = tr.Gemma2ForCausalLM._from_config(cfg, attn_implementation="eager").eval().double()
    with torch.no_grad():
        for name, p in net.named_parameters():
            if "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
    tcfg = HookedTransformerConfig(d_model=32, n_layers=L, n_heads=H, d_head=8, n_key_value_heads=2, d_mlp=64, d_vocab=V,
                                   n_ctx=16, act_fn="gelu_pytorch_tanh", gated_mlp=True, normalization_type="RMS",
                                   eps=1e-6, positional_embedding_type="rotary", rotary_dim=8, rotary_adjacent_pairs=False,
                                   final_rms=True, use_normalization_before_and_after=True,
                                   original_architecture="Gemma2ForCausalLM", dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lens = HookedTransformer(tcfg).eval()
        lens.load_state_dict(convert_gemma_weights(net, tcfg), strict=False)
    return net, lens


def lens_eap(model, items):
    """EAP-IG's get_scores (EAP) on a HookedTransformer with each pair's clean and corrupted inputs swapped (hookrun's
    denoising sign), with its hooks: (clean - corrupted) hook_embed, hook_result
    per head, hook_mlp_out, dotted with d metric / d the reader's input (hook_q|k|v_input per query head, ungrouped;
    hook_mlp_in; the last hook_resid_post) on the corrupted run, averaged over the items."""
    model.set_use_split_qkv_input(True)
    model.set_use_hook_mlp_in(True)
    model.cfg.ungroup_grouped_query_attention = True
    out = {}
    for it in items:
        clean, corrupt = writer_outputs(model, it["clean"]), writer_outputs(model, it["corrupt"])
        names = [f"blocks.{layer}.hook_{q}_input" for layer in range(L) for q in "qkv"]
        names += [f"blocks.{layer}.hook_mlp_in" for layer in range(L)] + [f"blocks.{L - 1}.hook_resid_post"]
        grads = {}
        logits = model.run_with_hooks(it["corrupt"][None], bwd_hooks=[(n, lambda g, hook: grads.__setitem__(hook.name, g[0].detach())) for n in names])
        (logits[0, -1, it["answer"]] - logits[0, -1, it["wrong"]]).backward()
        model.zero_grad()
        for p, c, q in eap_ig_edges():
            if q:
                layer, h = (int(v) for v in c[1:].split(".h"))
                g = grads[f"blocks.{layer}.hook_{q}_input"][:, h]
            else:
                g = grads[f"blocks.{L - 1}.hook_resid_post" if c == "logits" else f"blocks.{c[1:]}.hook_mlp_in"]
            out[(p, c, q)] = out.get((p, c, q), 0.0) + float(((clean[p] - corrupt[p]) * g).sum()) / len(items)
    return out


def test_gemma2_post_norms_score_as_eap_ig_and_evaluate_as_mib(items):
    """HF Gemma 2: a head's writer was its share of the post-attention norm's output at each run's own scale, and
    an ablated head was swapped in at the corrupted run's scale. MIB (EAP-IG's evaluate_graph on TransformerLens'
    block) re-runs ln1_post per reader on the mix of live and corrupted heads: CPR -4.94 against MIB's -3.55 on
    the hunter's model. Now the scores equal EAP-IG's (hook_result differences) and the curves MIB's evaluation
    on the same weights as a HookedTransformer."""
    net, lens = gemma_pair()
    ids = torch.stack([it["clean"] for it in items])
    with torch.no_grad():  # the two models are one (HF's eager softmax, in float32, bounds the agreement near 1e-7)
        torch.testing.assert_close(lens(ids), net(ids).logits, atol=1e-5, rtol=1e-5)
    grid = hookrun.patch_grid(net, items, method="eap", faithfulness={"fractions": "mib"})["edges"]
    scores = scores_of(grid)
    want_scores = lens_eap(lens, items)
    scale = max(abs(v) for v in want_scores.values())
    assert scale > 0.1
    np.testing.assert_allclose([scores[e] for e in want_scores], list(want_scores.values()), atol=1e-6 * scale, rtol=1e-5)
    want = reference(lens, items, scores, MIB)
    for name in ("cpr", "cmd"):  # (each curve is the faithfulness f on its ranking)
        assert np.ptp(want[name][0]) > 0.5  # circuits that keep some heads of a layer and ablate others
        np.testing.assert_allclose(grid.attrs[f"faithfulness_{name}_curve"], want[name][0], rtol=1e-5, atol=1e-6)
        assert grid.attrs[f"faithfulness_{name}"] == pytest.approx(want[name][2], rel=1e-5, abs=1e-6)
