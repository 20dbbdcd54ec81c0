"""MIB's faithfulness divides by m(empty circuit) as MIB evaluates it, also in bfloat16 (the dtype MIB's
run_evaluation.py loads Llama, Qwen and Gemma in).

MIB-circuit-track's `evaluate_area_under_curve` takes `corrupted_score = evaluate_graph(graph after
apply_topn(0))` and each fraction's `(evaluate_graph(circuit) - corrupted_score) / (baseline - corrupted_score)`:
a circuit that pruning leaves empty is the same graph as apply_topn(0), so its faithfulness is 0 by
construction, and the full graph's is 1. hookrun took m(empty) to be the corrupted run's metric under
counterfactual ablation: equal in exact arithmetic, but an ablated forward rebuilds each reader's input as
input - (live - corrupted) in the model's dtype, and in bfloat16 the empty circuit scored -0.013 (1.3% of
m_clean - m_corrupt) on this model, shifting every point of the curve and CPR by 10%."""

from __future__ import annotations

import json

import numpy as np
import torch
from edge_graph import prompt_pairs

import hookrun

V = 50


def bf16_llama():
    """A random 2-layer Llama with grouped-query attention (6 query heads, 2 key/value heads), in bfloat16."""
    import transformers as tr

    cfg = tr.LlamaConfig(vocab_size=V, hidden_size=48, num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2,
                         head_dim=8, intermediate_size=64, max_position_embeddings=32, initializer_range=0.3)
    torch.manual_seed(0)
    net = tr.LlamaForCausalLM._from_config(cfg, attn_implementation="eager").eval()
    with torch.no_grad():
        for name, p in net.named_parameters():
            if "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
    return net.to(torch.bfloat16)


def test_a_circuit_pruned_to_nothing_scores_zero_in_bfloat16(tmp_path):
    net = bf16_llama()
    items = prompt_pairs(V, 6, seed=3, at=1, shift=7, n=4)
    path = tmp_path / "mib.h5"
    hookrun.run({"data": {"target": None}, "progress": False, "output": {"path": str(path)},
                 "patching": {"method": "eap", "faithfulness": {"fractions": "mib", "ablation": "corrupt"}}},
                model=net, dataset=items)
    with hookrun.open_run(path) as run:
        meta = json.loads(run.attrs["patching"])
    mib = meta["faithfulness"]["mib"]
    for name in ("cpr", "cmd"):
        kept, faith, metric = (np.asarray(mib[name][k]) for k in ("kept", "faithfulness", "metric"))
        empty = kept == 0
        assert empty.any() and kept[-1] == mib["n_edges"]  # (the small fractions prune to nothing here)
        np.testing.assert_array_equal(faith[empty], 0.0)  # MIB: the same graph as apply_topn(0), exactly 0
        assert not np.signbit(faith[empty]).any()  # (0, not -0 in the log line and inspect where m_clean < m_empty)
        assert faith[-1] == 1.0  # every edge kept: the clean run
        np.testing.assert_array_equal(metric[empty], mib["metric_empty"])
        want = (metric - mib["metric_empty"]) / (mib["metric_clean"] - mib["metric_empty"])  # MIB's normalisation
        np.testing.assert_allclose(faith, want, rtol=1e-12)
        curve = want if name == "cpr" else np.abs(1 - want)
        assert np.isclose(mib[name]["area"], np.trapezoid(curve, mib["fractions"]), rtol=1e-12, atol=1e-15)
