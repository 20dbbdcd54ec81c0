"""op add with a torch tensor as `value` (a steering vector held in Python, docs/generate.md): a 1-D
tensor is laid along `dim` as a list is (it was broadcast along the last dim whatever `dim` said), and
it is cast to the hooked tensor's dtype as a list is (a float32 vector on a bfloat16 LLaMA was
refused). Each against a raw torch hook doing the same on the same tiny LLaMA (GQA: 4 query heads,
2 key/value heads)."""

from __future__ import annotations

import pytest
import torch

import hookrun

transformers = pytest.importorskip("transformers")


def llama(dtype=torch.float32):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return transformers.LlamaForCausalLM._from_config(cfg, attn_implementation="eager").eval().to(dtype)


def steered(model, spec, ids):
    with torch.no_grad(), hookrun.capture(model, {"s": spec}):
        return model(input_ids=ids).logits


def test_a_1d_tensor_is_laid_along_dim_as_a_list_is():
    model, ids = llama(), torch.randint(3, 97, (2, 16))  # 16 tokens, head_dim 16: a per-head view (B, T, H, hd)
    vec = torch.randn(16)

    def by_hand(module, args):  # vec along the tokens of o_proj's input viewed per head
        return ((args[0].view(2, 16, 4, 16) + vec.view(1, 16, 1, 1)).reshape(2, 16, 64),)

    handle = model.model.layers[1].self_attn.o_proj.register_forward_pre_hook(by_hand)
    with torch.no_grad():
        ref = model(input_ids=ids).logits
    handle.remove()
    spec = {"at": "model.layers.1.self_attn/contiguous.0", "type": "forward"}
    for value in (vec, vec.tolist()):
        got = steered(model, {**spec, "actions": [{"name": "modify_output", "op": "add", "value": value, "dim": 1}]}, ids)
        torch.testing.assert_close(got, ref, rtol=0, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_float32_tensor_steers_a_half_precision_model_as_a_raw_hook_does(dtype):
    model, ids = llama(dtype), torch.randint(3, 97, (2, 8))
    vec = torch.randn(64)
    handle = model.model.layers[0].register_forward_hook(lambda m, a, out: out + (vec * 2.0).to(out.dtype))
    with torch.no_grad():
        ref = model(input_ids=ids).logits
    handle.remove()
    got = steered(model, {"at": "model.layers.0", "type": "forward",
                          "actions": [{"name": "modify_output", "op": "add", "value": vec, "dim": -1, "factor": 2.0}]}, ids)
    assert got.dtype == dtype
    torch.testing.assert_close(got, ref, rtol=0, atol=0)
