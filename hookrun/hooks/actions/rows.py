"""Rows of a capture: one per sample, per step or per token, decided once and then held to.

    rows = RowRule("auto", where="hooks.h.actions.0")
    k = rows.layout(role, call, tensor, state)   # 0: one row per step; k >= 1: k rows folded per sample

`auto` decides at a capture's first batch: a first dim equal to the batch size is one row per
sample; a multiple of it (`B*T` flattened tokens, swin's `B*windows`) is folded to one row of
`(k, ...)` per sample; anything else is one row per step. Later batches keep that decision, so a
smaller last batch or a batch of 1 cannot flip it. `sample` and `step` force the choice;
`token` stores one row per non-padding token of `(batch, tokens, ...)` tensors (token_rows);
`ragged` one variable-length row per step, for a tensor whose first dim changes from batch to batch
(detection's box features, `(517, 256, 7, 7)` then `(520, ...)`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hookrun.errors import ConfigError, RunError, one_of
from hookrun.hooks.events import StepState, flatten

ROWS = ("auto", "sample", "step", "token", "ragged")
STEP = 0


class RowRule:
    def __init__(self, rows: str, where: str, per_step_hook: bool) -> None:
        if rows not in ROWS:
            raise ConfigError(f"{where}: record rows={rows!r}; choose from: {one_of(ROWS)}")
        if per_step_hook and rows in ("sample", "token"):
            raise ConfigError(f"{where}: rows={rows} does not fit a param hook, whose gradients have no batch dimension")
        self.rows, self.where, self.per_step_hook = rows, where, per_step_hook
        self.known: dict[tuple[str, int], int] = {}

    def reset(self) -> None:
        self.known.clear()

    def layout(self, role: str, call: int, t: torch.Tensor, state: StepState, where: str) -> int:
        """0 for one row per step, k >= 1 for k rows folded into each sample's row."""
        if self.per_step_hook or self.rows in ("step", "ragged"):
            return STEP
        b, n = state.batch_size, (t.shape[0] if t.dim() else None)
        key = (role, call)
        known = self.known.get(key)
        if known is None:
            if n == b:
                known = 1
            elif n and b > 1 and n % b == 0:
                known = n // b
            else:
                known = STEP
            if known == STEP and self.rows == "sample":
                raise RunError(f"{self.where}: rows=sample, but {role} of {where} has shape {tuple(t.shape)} in a batch "
                               f"of {b}: its first dim is not the batch (nor a multiple of it); use rows: step")
            self.known[key] = known
            return known
        if known != STEP and n != known * b:
            raise RunError(
                f"{self.where}: {role} of {where} had {known} row(s) per sample in its first batch, but has shape "
                f"{tuple(t.shape)} in batch {state.step} of {b} samples; record it with rows: step (one row per "
                f"batch), in a record action of its own: {{name: record, what: {role}, rows: step}}"
            )
        return known


def fits_tokens(t: torch.Tensor, state: StepState) -> bool:
    """Whether `t` is (batch, tokens, ...) (or flattened batch*tokens) as the attention mask says."""
    mask = state.attention_mask
    if mask is None:
        return t.dim() >= 2 and t.shape[0] == state.batch_size
    return t.dim() >= 2 and tuple(t.shape[:2]) == tuple(mask.shape) or (t.dim() >= 1 and t.shape[0] == mask.numel())


def token_rows(t: torch.Tensor, state: StepState, role: str, where: str) -> torch.Tensor:
    """The rows of the non-padding tokens of `t` ((batch, tokens, ...) or (batch*tokens, ...)),
    in order (sample, position); the step's token map is set from the first such capture."""
    b = state.batch_size
    mask = state.attention_mask
    if mask is not None and t.dim() >= 1 and t.shape[0] == mask.numel() and t.shape[0] != b:
        t = t.reshape(*mask.shape, *t.shape[1:])
    if t.dim() < 2 or t.shape[0] != b or (mask is not None and tuple(t.shape[:2]) != tuple(mask.shape)):
        want = f"the attention mask's {tuple(mask.shape)}" if mask is not None else f"(batch {b}, tokens)"
        raise RunError(f"{where}: rows=token needs {role} as (batch, tokens, ...) matching {want}; it has shape {tuple(t.shape)}")
    keep = mask.to(torch.bool) if mask is not None else torch.ones(t.shape[:2], dtype=torch.bool, device=t.device)
    keep = keep.to(t.device)
    if state.token_map is None:
        rows = keep.nonzero()[:, 0].cpu().numpy()
        position = (keep.long().cumsum(1) - 1)[keep].cpu().numpy()  # among the sample's real tokens: left padding does not count
        samples = state.sample_index.numpy() if state.sample_index is not None else np.arange(b)
        state.token_map = (samples[rows], position)
    elif len(state.token_map[0]) != int(keep.sum()):
        raise RunError(f"{where}: {role} has {int(keep.sum())} tokens, another rows=token capture of this batch "
                       f"{len(state.token_map[0])}; token captures must share the batch's tokens")
    return t[keep]


def last_positions(t: torch.Tensor, dim: int, state: StepState) -> torch.Tensor:
    """Each sample's last non-padding position along `dim` (the last position without a mask)."""
    mask = state.attention_mask
    size = t.shape[dim]
    if mask is None or tuple(mask.shape) != (t.shape[0], size):
        return torch.full((t.shape[0],), size - 1, dtype=torch.long, device=t.device)
    m = mask.to(t.device).to(torch.bool)
    return (size - 1 - m.flip(1).to(torch.int8).argmax(dim=1)).long()


def padding_mask(t: torch.Tensor, dims: list[int], state: StepState) -> torch.Tensor | None:
    """The attention mask shaped to broadcast over `t`, where a reduction crosses the token dim
    (1) of a (batch, tokens, ...) tensor that matches the mask; None otherwise."""
    mask = state.attention_mask
    if mask is None or 1 not in dims or t.dim() < 2 or tuple(t.shape[:2]) != tuple(mask.shape):
        return None
    return mask.to(t.device).to(t.dtype).reshape(*mask.shape, *([1] * (t.dim() - 2)))


def per_sample_lists(raw: Any, family: str, batch_size: int) -> dict[str, list[torch.Tensor]] | None:
    """A list with one item per sample (detection's list of dicts): its tensors by role, each a
    list of `batch_size` tensors of varying first dim. None where `raw` is not such a list."""
    if type(raw) is not list or len(raw) != batch_size or not raw:
        return None
    parts = [flatten(item, family) for item in raw]
    roles = list(parts[0])
    if not roles or any(list(p) != roles for p in parts):
        return None
    return {role: [p[role] for p in parts] for role in roles}
