"""TransformerLens 4.3's edge attribution and faithfulness on a saved GPT-2 (run in the TL 4.3 venv).

    python tl4_edges.py MODEL_DIR SPEC.json OUT.npz

SPEC: {"clean": [[ids]], "corrupt": [[ids]], "answer": A, "wrong": B, "ks": [..]}. Writes the edge
scores summed over positions as a [writers, readers] grid (hookrun's labels, NaN where no edge) and
the recovered fraction of the first pair for the top-k of that grid (kept at every position).
"""

import json
import sys

import numpy as np
import torch
from transformer_lens.model_bridge import TransformerBridge
from transformer_lens.tools.analysis.attribution_patching import (
    EdgeAttributionConfig,
    Node,
    attribution_patch,
    faithfulness,
)
from transformers import AutoTokenizer, GPT2LMHeadModel

folder, spec_path, out = sys.argv[1:4]
spec = json.load(open(spec_path))
hf = GPT2LMHeadModel.from_pretrained(folder, attn_implementation="eager").eval()
tok = AutoTokenizer.from_pretrained(folder)
bridge = TransformerBridge.boot_transformers("gpt2", hf_model=hf, tokenizer=tok)
bridge.eval()
clean, corrupt = torch.tensor(spec["clean"]), torch.tensor(spec["corrupt"])
A, B = spec["answer"], spec["wrong"]


def metric_fn(logits):
    return logits[0, -1, A] - logits[0, -1, B]


def label(node):
    if node.kind == "embed":
        return "embed"
    if node.kind == "attn_head_out":
        return f"L{node.layer}.H{node.head}"
    if node.kind in ("mlp_out", "mlp_in"):
        return f"L{node.layer}.MLP"
    if node.kind == "logits":
        return "logits"
    return f"L{node.layer}.H{node.head}.{node.kind[0]}"


L, H = hf.config.n_layer, hf.config.n_head
writers, readers = ["embed"], []
for layer in range(L):
    readers += [f"L{layer}.H{h}.{k}" for k in "qkv" for h in range(H)] + [f"L{layer}.MLP"]
    writers += [f"L{layer}.H{h}" for h in range(H)] + [f"L{layer}.MLP"]
readers.append("logits")
wi, ri = {w: i for i, w in enumerate(writers)}, {r: i for i, r in enumerate(readers)}

res = attribution_patch(bridge, clean, corrupt, metric_fn, EdgeAttributionConfig(granularity="edge"))
grid = np.full((len(writers), len(readers)), np.nan)
by_pair = {}
for (w, r), s in res.edge_scores.items():
    i, j = wi[label(w)], ri[label(r)]
    grid[i, j] = (0.0 if np.isnan(grid[i, j]) else grid[i, j]) + s
    by_pair.setdefault((i, j), []).append((w, r))

res1 = attribution_patch(bridge, clean[:1], corrupt[:1], metric_fn, EdgeAttributionConfig(granularity="edge"))
grid1 = np.full((len(writers), len(readers)), np.nan)
for (w, r), s in res1.edge_scores.items():
    i, j = wi[label(w)], ri[label(r)]
    grid1[i, j] = (0.0 if np.isnan(grid1[i, j]) else grid1[i, j]) + s
flat = np.where(np.isnan(grid1), -1.0, np.abs(grid1)).reshape(-1)
order = np.argsort(-flat, kind="stable")
recovered = []
for k in spec["ks"]:
    circuit = [e for f in order[:k] for e in by_pair[(f // len(readers), f % len(readers))]]
    recovered.append(faithfulness(bridge, clean[:1], corrupt[:1], metric_fn, circuit).recovered)
node = {label(n): s for n, s in res.node_scores.items()}
np.savez(out, grid=grid, recovered=np.array(recovered), n_edges=len(res.edge_scores))
print("ok", len(res.edge_scores), recovered)
_ = Node
