"""Rows of a capture: one per sample, per step or per token, decided once and then held to.

    rows = RowRule("auto", where="hooks.h.actions.0")
    k = rows.layout(role, call, tensor, state)   # 0: one row per step; k >= 1: k rows folded per sample

`auto` decides at a capture's first batch: a first dim equal to the batch size is one row per
sample; a multiple of it (`B*T` flattened tokens, swin's `B*windows`) is folded to one row of
`(k, ...)` per sample; anything else is one row per step. Later batches keep that decision, so a
smaller last batch or a batch of 1 cannot flip it. `sample` and `step` force the choice;
`token` stores one row per non-padding token of `(batch, tokens, ...)` tensors (the model call's
TokenMap, hookrun.hooks.tokens);
`ragged` one variable-length row per step, for a tensor whose first dim changes from batch to batch
(detection's box features, `(517, 256, 7, 7)` then `(520, ...)`).
"""

from __future__ import annotations

from typing import Any

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
