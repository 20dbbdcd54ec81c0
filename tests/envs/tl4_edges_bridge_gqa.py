"""hookrun's edges on TransformerLens 4.3 TransformerBridges of random-init HF Llamas (run in the TL 4.3 venv,
with this checkout on PYTHONPATH):

    python tl4_edges_bridge_gqa.py FOLDER OUT.json

Writes, for a bridge of a Llama without grouping (4 key/value heads for 4 query heads), hookrun's EAP grid on
the bridge and on a fresh copy of the HF model (taken before the bridge was booted: booting replaces the model's
modules); for a bridge of a Llama with grouped-query attention (2 key/value heads), the error hookrun.patch_grid
raised (its type and message) and how many forwards the model ran before it.
"""

import copy
import json
import sys

import torch
import transformers as tf
from tl4_words import save_word_tokenizer
from transformer_lens.model_bridge import TransformerBridge

import hookrun

folder, out = sys.argv[1:3]
V, T = 40, 6
save_word_tokenizer(folder, V)
g = torch.Generator().manual_seed(5)
clean = torch.randint(2, V, (3, T), generator=g)
corrupt = clean.clone()
corrupt[:, 1] = (corrupt[:, 1] + 11) % V
items = [{"clean": c, "corrupt": k, "answer": int(c[1]), "wrong": int(k[1])} for c, k in zip(clean, corrupt, strict=True)]
result = {}
for kv in (4, 2):
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=kv,
                         head_dim=8, intermediate_size=48, max_position_embeddings=32, initializer_range=0.3)
    hf = tf.LlamaForCausalLM._from_config(cfg, attn_implementation="eager").eval()
    fresh = copy.deepcopy(hf)
    hf.config.name_or_path = folder
    bridge = TransformerBridge.boot_transformers(folder, hf_model=hf, tokenizer=tf.AutoTokenizer.from_pretrained(folder)).eval()
    forwards = []
    bridge.register_forward_pre_hook(lambda m, a, forwards=forwards: forwards.append(1))
    try:
        grid = hookrun.patch_grid(bridge, items, input="input", method="eap")["edges"]
    except Exception as exc:  # noqa: BLE001  (the test reads what was raised)
        result[kv] = {"error": type(exc).__name__, "message": str(exc), "forwards": len(forwards)}
        continue
    hf_items = [{"input_ids": it["clean"], **{k: it[k] for k in ("corrupt", "answer", "wrong")}} for it in items]
    want = hookrun.patch_grid(fresh, hf_items, clean="input_ids", method="eap")["edges"]
    result[kv] = {"bridge": torch.from_numpy(grid.values).nan_to_num(99).tolist(),
                  "hf": torch.from_numpy(want.values).nan_to_num(99).tolist(), "forwards": len(forwards)}
json.dump(result, open(out, "w"))
