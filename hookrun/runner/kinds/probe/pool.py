"""One hook point's output as probe rows: a feature map pooled over space, token rows pooled over the
real tokens (padding never enters), or one row per real token.

    rows = pool_rows(output, "mean", mask)     # (batch, C, H, W) -> (batch, C); (batch, T, D) + mask -> (batch, D)
    rows.x, rows.item, rows.token              # float64 rows, the batch position of each row, its token slot

| output             | pool                 | rows                                                      |
|--------------------|----------------------|-----------------------------------------------------------|
| (B, D)             | any                  | one per item, as they are                                 |
| (B, C, *space)     | mean / max           | one per item: the mean / max over space (4-D+, or a *1d module's 3-D) |
| (B, T, D) tokens   | last / mean / max    | one per item: its last real token / the mean, max over real tokens |
| (B, T, D) tokens   | every                | one per real token, in (sample, position) order           |

A 3-D output (B, T, D) is token rows, as the similarity kind reads it (hooks/taps.py's token_mask):
padding left out where the batch's token ids or attention mask are (B, T), every token real where the
batch has none (a ViT's patches); only a torch *1d module's output (Conv1d, BatchNorm1d, ...: (B, C, L))
is a 1-d map. Pooling runs in float64 (the probe's statistics are accumulated in it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hookrun.errors import ConfigError
from hookrun.hooks.taps import refuse_empty_items, refuse_not_batch_first, token_mask

POOLS = ("mean", "max", "last", "every")
TOKEN_ONLY = ("last", "every")


@dataclass
class Rows:
    x: torch.Tensor  # (rows, features) float64
    item: torch.Tensor  # (rows,) long: the row's sample, its position in the batch
    token: torch.Tensor | None  # (rows,) long: the row's token slot (sample * T + position) where rows are tokens
    length: int | None = None  # T, the output's tokens per item, where rows are tokens
    ids: torch.Tensor | None = None  # (batch, T) the token ids of an encoder-decoder's decoder, where the rows are its


def layout(t: torch.Tensor, real: torch.Tensor | None, pool: str, where: str) -> str:
    """'tokens', 'map' or 'flat' for the output `t` (`real`: its token mask, hooks/taps.py's token_mask, None
    where it is not token rows); a ConfigError line where `pool` cannot pool it."""
    if t.dim() < 2:
        raise ConfigError(f"probe.at: {where}'s output has shape {tuple(t.shape)}, with no feature axis (a probe "
                          f"needs (batch, features, ...) or (batch, tokens, features)); probe a module before it")
    if real is not None:
        return "tokens"
    if pool in TOKEN_ONLY and t.dim() == 2:
        raise ConfigError(f"probe.pool={pool}: {where}'s output {tuple(t.shape)} is one row per item (batch, features), "
                          f"not token rows; it needs no pooling: leave pool out (mean takes the rows as they are)")
    if pool in TOKEN_ONLY:
        raise ConfigError(f"probe.pool={pool}: {where}'s output {tuple(t.shape)} is not token rows (batch, tokens, "
                          f"features) but a feature map (batch, channels, ...); choose mean or max for a feature map")
    return "map" if t.dim() > 2 else "flat"


def pool_rows(t: torch.Tensor, pool: str, mask: torch.Tensor | None, where: str = "the hook point",
              module: str = "", indices: torch.Tensor | None = None) -> Rows:
    """`t`'s rows pooled as `pool` (see the table); `mask` (batch, tokens): 1 = a real token, or None;
    `module`: the hooked module's class (a torch *1d module's 3-D output is a 1-d map); `indices`: the batch's
    dataset indices (an item with no real token is refused by them for last, mean and max)."""
    refuse_not_batch_first(t, indices, "probe.at", where, "a probe needs (batch, features, ...) or (batch, tokens, "
                           "features): probe a module whose output is per item")
    real = token_mask(t, mask, module, where)
    kind = layout(t, real, pool, where)
    t = t.detach()
    n = t.shape[0]
    items = torch.arange(n, device=t.device)
    if kind == "map":  # the mean summed in float64 as it reads the map (no float64 copy of it); a max is exact
        flat = t.reshape(n, t.shape[1], -1)
        return Rows(flat.amax(2).to(torch.float64) if pool == "max" else flat.mean(2, dtype=torch.float64), items, None)
    if kind == "flat":  # (a copy even in float64: the forward may change its output in place after the hook)
        return Rows(t.to(torch.float64, copy=True), items, None)
    t = t.to(torch.float64)
    valid = real.to(device=t.device, dtype=torch.bool)
    if pool == "every":
        where_ = valid.reshape(-1).nonzero().squeeze(1)
        return Rows(t.reshape(-1, t.shape[2])[where_], where_ // t.shape[1], where_, t.shape[1])
    refuse_empty_items(valid, indices, f"probe.at: {where}", pool, "leave such items out of the data, or use pool: every "
                       "(an item with no real token gives no row)")
    if pool == "last":
        pos = torch.arange(valid.shape[1], device=t.device).expand_as(valid)
        last = torch.where(valid, pos, -1).amax(1).clamp(min=0)
        return Rows(t[items, last], items, items * t.shape[1] + last, t.shape[1])
    if pool == "max":
        return Rows(t.masked_fill(~valid[..., None], float("-inf")).amax(1), items, None)
    w = valid.to(t.dtype)[..., None]
    return Rows((t * w).sum(1) / w.sum(1).clamp(min=1), items, None)
