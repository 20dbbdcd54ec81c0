"""One builder for the small random-init HookedTransformers (TransformerLens 3.x) that the patching
tests compare hookrun's grids with.

    model = hooked_transformer(d_vocab=40)            # 2 layers, d_model 16, 4 heads of 4, eval mode
"""

from __future__ import annotations

import warnings

import torch


def hooked_transformer(d_vocab: int, n_layers: int = 2, d_model: int = 16, n_ctx: int = 8, d_head: int = 4,
                       n_heads: int = 4, seed: int = 0, **config):
    """A HookedTransformer with random weights from `seed`, in eval mode (TransformerLens' own
    warnings about an untrained model silenced)."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    torch.manual_seed(seed)
    cfg = HookedTransformerConfig(n_layers=n_layers, d_model=d_model, n_ctx=n_ctx, d_head=d_head, n_heads=n_heads,
                                  d_vocab=d_vocab, **config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return HookedTransformer(cfg).eval()
