"""op mean (mean ablation) on a padded batch of text: each real token is replaced by the mean of the
batch's real tokens at its position (its sample's n-th real token), padding left as it was. The plain
column mean took in the padding tokens' rows (up to 0.147 off on a right-padded batch of text at a
LLaMA's o_proj input, where the values are at most 0.33). Against a raw torch forward hook doing the
same on the same tiny LLaMA, for right and left padding; an unpadded batch keeps the batch mean."""

from __future__ import annotations

import pytest
import torch

import hookrun

transformers = pytest.importorskip("transformers")
LENGTHS = (5, 8, 3)


def llama():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return transformers.LlamaForCausalLM._from_config(cfg, attn_implementation="eager").eval()


def padded(side: str):
    g, width = torch.Generator().manual_seed(1), max(LENGTHS)
    ids, mask = torch.zeros(len(LENGTHS), width, dtype=torch.long), torch.zeros(len(LENGTHS), width, dtype=torch.long)
    for i, n in enumerate(LENGTHS):
        cols = slice(0, n) if side == "right" else slice(width - n, width)
        ids[i, cols], mask[i, cols] = torch.randint(3, 97, (n,), generator=g), 1
    return ids, mask


def by_hand(side: str):
    """A forward hook: sample i's p-th real token (its column: p, or p + its padding on the left) replaced by
    the mean over the samples that have a p-th real token; padding columns untouched."""
    width = max(LENGTHS)
    col = [(lambda p, n=n: p if side == "right" else width - n + p) for n in LENGTHS]

    def hook(module, args, out):
        new = out.clone()
        for p in range(width):
            have = [i for i, n in enumerate(LENGTHS) if n > p]
            m = torch.stack([out[i, col[i](p)].double() for i in have]).mean(0)
            for i in have:
                new[i, col[i](p)] = m.to(out.dtype)
        return new
    return hook


@pytest.mark.parametrize("side", ["right", "left"])
def test_mean_ablation_of_a_padded_batch_averages_real_tokens_by_position(side):
    model, (ids, mask) = llama(), padded(side)
    handle = model.model.layers[0].register_forward_hook(by_hand(side))
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask).logits
    handle.remove()
    spec = {"m": {"at": "model.layers.0", "type": "forward", "actions": [{"name": "modify_output", "op": "mean"}]}}
    with torch.no_grad(), hookrun.capture(model, spec):
        got = model(input_ids=ids, attention_mask=mask).logits
    real = mask.bool()
    torch.testing.assert_close(got[real], want[real], rtol=0, atol=1e-5)
    with torch.no_grad():
        plain = model(input_ids=ids, attention_mask=mask).logits
    assert (got[real] - plain[real]).abs().max() > 0.01  # (the ablation took effect)


def test_an_unpadded_batch_keeps_the_batch_mean():
    model, ids = llama(), torch.randint(3, 97, (3, 6), generator=torch.Generator().manual_seed(2))
    handle = model.model.layers[0].register_forward_hook(lambda m, a, out: out.mean(0, keepdim=True).expand_as(out))
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    handle.remove()
    spec = {"m": {"at": "model.layers.0", "type": "forward", "actions": [{"name": "modify_output", "op": "mean"}]}}
    with torch.no_grad(), hookrun.capture(model, spec):
        got = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
