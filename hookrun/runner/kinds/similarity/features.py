"""A similarity run's features: each hook point's output pooled to one row of features per item, in
its forward hook (hooks/taps.py: the output the hook saw, also where the forward changes it in place
after the hook).

    taps = Taps(model, ["layer1", "layer2"], hook="similarity", where="similarity.at")
    with taps.attached(pooled("mean", call.attention_mask, "similarity.at")):
        model(x)
    taps.take()      # [(rows, features) tensors], in the modules' order
    own_copy(call)   # the call with its own input tensors (the `with:` model's: the first may change them)

pool: flatten (every value of an item's output is a feature) or mean (over the space of a feature
map (rows, channels, ...), a 1-d map's (a Conv1d's) length included, over the tokens of (rows, tokens,
features): padding never enters; any 3-D output but a *1d module's is read as token rows). Token rows
of another length than the batch's attention_mask (a CLS token added) are refused where the batch
has padding (which tokens are padding is not known), and taken whole where it has none.
A module's output with no feature axis (one value per item) is refused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch

from hookrun.errors import ConfigError


def pooled(how: str, mask: torch.Tensor | None, where: str, taps: Any = None) -> Callable[[str, torch.Tensor], torch.Tensor]:
    """What a tap makes of each output: its rows pooled (see pool). `taps`: their modules' classes tell a
    1-d map (a Conv1d's) from token rows for pool=mean."""
    kinds = {n: type(m).__name__ for n, m in taps.targets} if taps is not None else {}
    return lambda name, t: pool(t, how, mask, f"{where}: {name}", kinds.get(name, ""))


def pool(t: torch.Tensor, how: str, mask: torch.Tensor | None, where: str, kind: str = "") -> torch.Tensor:
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
    tokens = mask is not None and t.dim() == 3 and mask.dim() == 2 and tuple(mask.shape) == tuple(t.shape[:2])
    if (not tokens and mask is not None and t.dim() == 3 and mask.dim() == 2 and len(t) == len(mask)
            and not kind.endswith("1d") and not bool(mask.bool().all())):  # (no padding: every token is real)
        raise ConfigError(f"{where}: its token rows are {t.shape[1]} long and the batch's attention_mask "
                          f"{mask.shape[1]} (a model that adds tokens, a CLS): which of its tokens are padding is not "
                          f"known, and pool={how} would take them in; name a module whose tokens are the mask's, or "
                          f"give batches without padding")
    if how == "flatten":
        if tokens and not bool(mask.bool().all()):
            raise ConfigError(f"{where}: pool=flatten over token rows with padding would make the padding features; "
                           f"use similarity.pool=mean (padding left out), or batches without padding")
        return t.reshape(len(t), -1).clone()  # (a copy: the forward may change its output in place after the hook)
    if t.dim() == 2:
        return t.to(torch.float64, copy=True)
    if tokens:
        t = t.to(torch.float64)
        m = mask.to(device=t.device, dtype=torch.float64).unsqueeze(-1)
        return (t * m).sum(dim=1) / m.sum(dim=1).clamp_min(1.0)
    if t.dim() > 3 or kind.endswith("1d"):  # a feature map (rows, channels, ...): over its space
        return t.to(torch.float64).flatten(2).mean(dim=2)
    return t.to(torch.float64).mean(dim=1)  # token rows: a transformer block's (a ViT's patches too)


def own_copy(call: Any) -> Any:
    """The call with its own copy of every input tensor (nested ones too; one tensor passed twice stays one),
    for the `with:` model: the first model's forward may change its inputs in place (x.clamp_(), x += ...),
    and the second must see the batch as it came."""
    memo: dict[int, torch.Tensor] = {}

    def copy(obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            return memo.setdefault(id(obj), obj.clone())
        if isinstance(obj, Mapping):
            return {k: copy(v) for k, v in obj.items()}
        if isinstance(obj, tuple) and hasattr(obj, "_fields"):
            return type(obj)(*(copy(v) for v in obj))
        if isinstance(obj, tuple | list):
            return type(obj)(copy(v) for v in obj)
        return obj

    return dataclasses.replace(call, args=copy(call.args), kwargs=copy(call.kwargs), attention_mask=copy(call.attention_mask))
