"""A similarity run's features: each hook point's output pooled to one row of features per item, in
its forward hook (hooks/taps.py: the output the hook saw, also where the forward changes it in place
after the hook).

    taps = Taps(model, ["layer1", "layer2"], hook="similarity", where="similarity.at")
    with taps.attached(pooled("mean", call.attention_mask, "similarity.at")):
        model(x)
    taps.take()      # [(rows, features) tensors], in the modules' order

pool: flatten (every value of an item's output is a feature) or mean (over the space of a feature
map (rows, channels, ...), a 1-d map's (a Conv1d's) length included, over the tokens of (rows, tokens,
features): padding never enters; any 3-D output but a *1d module's is read as token rows). Token rows
of another length than the batch's attention_mask (a CLS token added) are refused where the batch
has padding (which tokens are padding is not known), and taken whole where it has none.
A module's output with no feature axis (one value per item) is refused, and so is one whose first axis is
not the batch's items (a position table's (1, tokens, features), a router's (batch x tokens, experts)).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from hookrun.errors import ConfigError
from hookrun.hooks.taps import module_kinds, refuse_empty_items, refuse_not_batch_first, token_mask


def pooled(how: str, mask: torch.Tensor | None, where: str, taps: Any = None,
           items: torch.Tensor | None = None) -> Callable[[str, torch.Tensor], torch.Tensor]:
    """What a tap makes of each output: its rows pooled (see pool). `taps`: their modules' classes tell a
    1-d map (a Conv1d's) from token rows for pool=mean; `items`: the batch's dataset indices."""
    kinds = module_kinds(taps) if taps is not None else {}

    def make(name: str, t: torch.Tensor) -> torch.Tensor:
        refuse_not_batch_first(t, items, where, name, "CKA and RSA need one row per item, (batch, features, ...) or "
                               "(batch, tokens, features): compare a module whose output is per item")
        return pool(t, how, taps.mask(mask) if taps is not None else mask, f"{where}: {name}", kinds.get(name, ""), items)

    return make


def pool(t: torch.Tensor, how: str, mask: torch.Tensor | None, where: str, kind: str = "",
         items: torch.Tensor | None = None) -> torch.Tensor:
    """(rows, ...) -> (rows, features): flattened, or averaged over space / the real tokens (float64); always
    new memory, made in the hook: the forward may change a module's output in place once its hooks have
    returned (conv -> ReLU(inplace=True)), and the rows are the output the hook saw. A 3-D output is a 1-d
    map (rows, channels, length), averaged over its length, where its module (`kind`, its class) is torch's
    *1d (Conv1d, BatchNorm1d, MaxPool1d...); any other is token rows (rows, tokens, features), averaged over
    the tokens: a transformer block's, a ViT's patches (an activation after a Conv1d is read so too: name
    the Conv1d or its norm, or use pool: flatten)."""
    if t.dim() < 2 or not t.is_floating_point():
        raise ConfigError(f"{where} gives shape {tuple(t.shape)} {t.dtype}: no feature axis (one value per item, or no floating "
                          f"tensor); name a module whose output has features per item")
    t = t.detach()
    real = token_mask(t, mask, kind, where)  # (hooks/taps.py: which 3-D outputs are token rows, shared with the probe)
    if how == "flatten":
        if real is not None and not bool(real.bool().all()):
            raise ConfigError(f"{where}: pool=flatten over token rows with padding would make the padding features; "
                           f"use similarity.pool=mean (padding left out), or batches without padding")
        return t.reshape(len(t), -1).clone()  # (a copy: the forward may change its output in place after the hook)
    if t.dim() == 2:
        return t.to(torch.float64, copy=True)
    if real is not None:  # token rows (a transformer block's, a ViT's patches): over the real tokens
        refuse_empty_items(real, items, where, how, "leave such items out of the data")
        t = t.to(torch.float64)
        m = real.to(device=t.device, dtype=torch.float64).unsqueeze(-1)
        return (t * m).sum(dim=1) / m.sum(dim=1).clamp_min(1.0)
    return t.to(torch.float64).flatten(2).mean(dim=2)  # a feature map (rows, channels, ...): over its space

