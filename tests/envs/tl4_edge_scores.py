"""TransformerLens 4.3's edge scores of a saved GPT-2's first pair, written as JSON, and its own faithfulness of
the top-k circuits of those scores (summed over positions, each edge kept at every position). Run in the TL 4.3 venv.

    python tl4_edge_scores.py MODEL_DIR SPEC.json OUT.json

SPEC: {"clean": [[ids]], "corrupt": [[ids]], "answer": A, "wrong": B, "ks": [..]}. OUT: {"edge_scores":
[{"writer": asdict(Node), "reader": asdict(Node), "score": s}], "recovered": [one per k]}.
"""

import dataclasses
import json
import sys

import numpy as np
import torch
from transformer_lens.model_bridge import TransformerBridge
from transformer_lens.tools.analysis.attribution_patching import (
    EdgeAttributionConfig,
    attribution_patch,
    faithfulness,
)
from transformers import AutoTokenizer, GPT2LMHeadModel

folder, spec_path, out = sys.argv[1:4]
spec = json.load(open(spec_path))
hf = GPT2LMHeadModel.from_pretrained(folder, attn_implementation="eager").eval()
bridge = TransformerBridge.boot_transformers("gpt2", hf_model=hf, tokenizer=AutoTokenizer.from_pretrained(folder))
bridge.eval()
clean, corrupt = torch.tensor(spec["clean"])[:1], torch.tensor(spec["corrupt"])[:1]
A, B = spec["answer"], spec["wrong"]


def metric_fn(logits):
    return logits[0, -1, A] - logits[0, -1, B]


def pair(w, r):  # a (writer, reader) pair regardless of position
    return (w.kind, w.layer, w.head, r.kind, r.layer, r.head)


res = attribution_patch(bridge, clean, corrupt, metric_fn, EdgeAttributionConfig(granularity="edge"))
summed, members = {}, {}
for (w, r), s in res.edge_scores.items():
    summed[pair(w, r)] = summed.get(pair(w, r), 0.0) + s
    members.setdefault(pair(w, r), []).append((w, r))
keys = list(summed)
order = np.argsort(-np.abs(np.array([summed[k] for k in keys])), kind="stable")
recovered = []
for k in spec["ks"]:
    circuit = [e for i in order[:k] for e in members[keys[i]]]
    recovered.append(faithfulness(bridge, clean, corrupt, metric_fn, circuit).recovered)
records = [{"writer": dataclasses.asdict(w), "reader": dataclasses.asdict(r), "score": float(s)}
           for (w, r), s in res.edge_scores.items()]
json.dump({"edge_scores": records, "recovered": recovered}, open(out, "w"))
print("ok", len(records), recovered)
