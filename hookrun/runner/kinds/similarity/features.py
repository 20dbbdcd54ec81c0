"""A similarity run's features: each hook point's output pooled to one row of features per item, in
its forward hook (hooks/taps.py: the output the hook saw, also where the forward changes it in place
after the hook).

    taps = Taps(model, ["layer1", "layer2"], hook="similarity", where="similarity.at")
    with taps.attached(pooled("mean", call.attention_mask, "similarity.at")):
        model(x)
    taps.take()      # [(rows, features) tensors], in the modules' order

pool: flatten (every value of an item's output is a feature) or mean (over the space of a feature
map (rows, channels, ...), over the tokens of (rows, tokens, features): padding never enters).
A module's output with no feature axis (one value per item) is refused.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from hookrun.errors import ConfigError


def pooled(how: str, mask: torch.Tensor | None, where: str) -> Callable[[str, torch.Tensor], torch.Tensor]:
    """What a tap makes of each output: its rows pooled (see pool)."""
    return lambda name, t: pool(t, how, mask, f"{where}: {name}")


def pool(t: torch.Tensor, how: str, mask: torch.Tensor | None, where: str) -> torch.Tensor:
    """(rows, ...) -> (rows, features): flattened, or averaged over space / the real tokens (float64); always
    new memory, made in the hook: the forward may change a module's output in place once its hooks have
    returned (conv -> ReLU(inplace=True)), and the rows are the output the hook saw."""
    if t.dim() < 2 or not t.is_floating_point():
        raise ConfigError(f"{where} gives shape {tuple(t.shape)} {t.dtype}: no feature axis (one value per item, or no floating "
                          f"tensor); name a module whose output has features per item")
    t = t.detach()
    tokens = mask is not None and t.dim() == 3 and mask.dim() == 2 and tuple(mask.shape) == tuple(t.shape[:2])
    if how == "flatten":
        if tokens and not bool(mask.bool().all()):
            raise ConfigError(f"{where}: pool=flatten over token rows with padding would make the padding features; "
                           f"use similarity.pool=mean (padding left out), or batches without padding")
        return t.reshape(len(t), -1).clone()  # (a copy: the forward may change its output in place after the hook)
    if t.dim() == 2:
        return t.to(torch.float64, copy=True)
    t = t.to(torch.float64)
    if tokens:
        m = mask.to(device=t.device, dtype=torch.float64).unsqueeze(-1)
        return (t * m).sum(dim=1) / m.sum(dim=1).clamp_min(1.0)
    return t.mean(dim=1) if t.dim() == 3 else t.flatten(2).mean(dim=2)
