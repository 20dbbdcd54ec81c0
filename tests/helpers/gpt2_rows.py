"""A tiny GPT-2 (token ids under 20, random weights, eager attention), a block's rows for each text run
alone through a raw forward hook, and a target function reading each token's class from the batch's
`y`: the references the probe's tests of token rows fit scikit-learn on."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

VOCAB = 20
TOKEN_TARGET = {"_target_": "gpt2_rows.tok_target"}  # probe.target: each token's class, (batch, tokens)


def tok_target(batch):
    return batch["y"]


def tiny_gpt2_model() -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=2, n_head=2, n_positions=16, bos_token_id=0,
                                  eos_token_id=0)
    cfg._attn_implementation = "eager"
    return transformers.GPT2Model(cfg).eval()


def rows_alone(model: torch.nn.Module, ids: Sequence[np.ndarray], block: int = 1) -> list[np.ndarray]:
    """Block `block`'s output (tokens, features) as float64 for each text of `ids` run alone, unpadded."""
    rows: list[np.ndarray] = []
    h = model.h[block].register_forward_hook(
        lambda m, a, o: rows.append((o[0] if isinstance(o, tuple) else o)[0].double().numpy()))
    try:
        with torch.no_grad():
            for i in ids:
                model(torch.tensor(i)[None])
    finally:
        h.remove()
    return rows
