"""hookrun's logit lens on a TransformerLens 4.3 TransformerBridge of a random-init Gemma 2 whose forward
softcaps the logits (final_logit_softcapping), beside the references (run in the TL 4.3 venv, with this
checkout on PYTHONPATH):

    python tl4_lens_bridge.py FOLDER OUT.npz

Writes hookrun's lens.top_logprobs and lens.kl_to_final at blocks.0 and blocks.1, the bridge's own output
logits, block 0's lens computed here with the HF model's own modules (a raw forward hook on
model.layers.0, then model.norm, lm_head and tanh(z / c) * c), and the message that refuses the bridge's
own ln_final (a wrapper holding the norm) as `norm`.
"""

import sys

import numpy as np
import torch
import transformers as tf
from tl4_words import save_word_tokenizer
from transformer_lens.model_bridge import TransformerBridge

import hookrun
from hookrun.errors import ConfigError

folder, out = sys.argv[1:3]
V, CAP = 40, 0.5
save_word_tokenizer(folder, V)
torch.manual_seed(0)
cfg = tf.Gemma2Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8, max_position_embeddings=32, final_logit_softcapping=CAP)
hf = tf.Gemma2ForCausalLM(cfg).eval()
with torch.no_grad():
    hf.lm_head.weight.mul_(20)  # logits well past the cap: the softcap changes the distribution
hf.config.name_or_path = folder
bridge = TransformerBridge.boot_transformers(folder, hf_model=hf, tokenizer=tf.AutoTokenizer.from_pretrained(folder)).eval()
ids = torch.randint(2, V, (3, 6), generator=torch.Generator().manual_seed(1))
lens = {"name": "logit_lens", "norm": "ln_final._original_component", "unembed": "unembed._original_component", "top_k": V}
caught = {}
h = hf.model.layers[0].register_forward_hook(lambda m, a, o: caught.setdefault("x", o[0] if isinstance(o, tuple) else o))
with hookrun.capture(bridge, {"lens": {"at": "blocks.*", "type": "forward", "actions": [lens]}}) as cap, torch.no_grad():
    logits = bridge(input=ids)
h.remove()
with torch.no_grad():
    z = hf.lm_head(hf.model.norm(caught["x"])).double()
try:
    hookrun.capture(bridge, {"lens": {"at": "blocks.1", "type": "forward", "actions": [{**lens, "norm": "ln_final"}]}}).__enter__()
    refused = ""
except ConfigError as exc:
    refused = str(exc)
np.savez(out, refused=np.array(refused), output=logits.double().numpy(), layer0=(torch.tanh(z / CAP) * CAP).numpy(),
         **{f"{role}.{b}": np.asarray(cap[f"blocks.{b}", f"lens.{role}"]) for b in (0, 1)
            for role in ("top_logprobs", "kl_to_final")})
