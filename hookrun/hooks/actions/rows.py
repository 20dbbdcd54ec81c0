"""What record does to a tensor's rows and values: one row per sample, step or token, decided once,
and the copy in the storage dtype (a snapshot) the writer gets.

    rows = RowRule("auto", where="hooks.h.actions.0")
    k = rows.layout(ev, role, tensor)        # 0: one row per step; k >= 1: k rows folded per sample
    value = snapshot(t, torch.float16)       # a copy in the storage dtype, still on the device
    narrows(t.dtype, value.dtype)            # True: float32 -> float16 can overflow to inf

`auto` decides at a capture's first batch: a tensor whose batch is at axis 1 (batch_second: a
sequence-first module's `(T, B, ...)`) is one row per step, with a warning; a first dim equal to the
batch size is one row per sample; a multiple of it (`B*T` flattened tokens, swin's `B*windows`) is
folded to one row of `(k, ...)` per sample; anything else is one row per step. Later batches keep that decision, so a
smaller last batch or a batch of 1 cannot flip it. `sample` and `step` force the choice;
`token` stores one row per non-padding token of `(batch, tokens, ...)` tensors (the model call's
TokenMap, hookrun.hooks.tokens);
`ragged` one variable-length row per step, for a tensor whose first dim changes from batch to batch
(detection's box features, `(517, 256, 7, 7)` then `(520, ...)`). A selection or reduction, made
before the snapshot, is hookrun.hooks.actions.reduction's (loaded only where a record asks for one).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from hookrun.errors import ConfigError, RunError, one_of
from hookrun.hooks import Event, flatten

log = logging.getLogger("hookrun")


def snapshot(t: torch.Tensor, dtype: torch.dtype | None, source: torch.dtype | None = None) -> torch.Tensor:
    """A detached copy on the tensor's own device, in the storage dtype: `dtype`, else (keep) the hooked
    tensor's `source` dtype where both are floating (a half tensor's float32 mean or norm is rounded to it
    here, once: a float16 norm past 65504 is inf as any cast's, and the caller counts it), else t's own.

    bfloat16 is rounded to bfloat16 when asked for, then kept as float32 (numpy has no bfloat16).
    The copy to the host happens later, off the hook (hookrun.store.writer: HostTransfer).
    """
    if dtype is None and source is not None and source.is_floating_point:
        dtype = source
    target = dtype if (dtype is not None and t.is_floating_point()) else t.dtype
    if target == torch.bfloat16:
        t = t.to(torch.bfloat16)
        target = torch.float32
    return t.detach().to(dtype=target, copy=True)


def narrows(source: torch.dtype, stored: torch.dtype) -> bool:
    """Whether casting `source` to `stored` can turn a finite value into inf (float32 -> float16)."""
    return source.is_floating_point and stored.is_floating_point and torch.finfo(stored).max < torch.finfo(source).max


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def check_finite(value: torch.Tensor, ev: Event, role: str, dtype: torch.dtype | None) -> None:
    """The value as it is stored (after select, reduce and the cast) must be finite."""
    if value.is_floating_point() and not bool(torch.isfinite(value).all()):
        bad = int((~torch.isfinite(value)).sum())
        hint = "; float16 holds values up to 65504: use dtype float32" if value.dtype == torch.float16 else ""
        raise RunError(
            f"hook {ev.hook!r} at {ev.where}: {role} has {bad} non-finite value(s) at step {ev.step} "
            f"as stored, in {dtype_name(value.dtype)} (record check_finite=true){hint}"
        )


ROWS = ("auto", "sample", "step", "token", "ragged")
STEP = 0


class RowRule:
    def __init__(self, rows: str, where: str, per_step_hook: bool, env: Any = None) -> None:
        rows = {"samples": "sample", "tokens": "token", "steps": "step"}.get(rows, rows)  # (the file's `rows` attribute's words)
        if rows not in ROWS:
            raise ConfigError(f"{where}: record rows={rows!r}; choose from: {one_of(ROWS)}")
        if per_step_hook and rows in ("sample", "token"):
            raise ConfigError(f"{where}: rows={rows} does not fit a param hook, whose gradients have no batch dimension")
        self.rows, self.where, self.per_step_hook, self.env = rows, where, per_step_hook, env
        self.known: dict[tuple[str, int], int] = {}
        self.warned: set[tuple[str, int]] = set()  # (kept over reset: the estimate's batch of one warns for the run)

    def reset(self) -> None:
        self.known.clear()

    def layout(self, ev: Event, role: str, t: torch.Tensor, site: bool = False) -> int:
        """0 for one row per step, k >= 1 for k rows folded into each sample's row (token rows: 1).
        `site`: `ev` is an op site's (its module's batch_first says nothing of the op's tensors)."""
        if self.per_step_hook or self.rows in ("step", "ragged"):
            return STEP
        state, where = ev.state, ev.where
        b, n = state.batch_size, (t.shape[0] if t.dim() else None)
        key = (role, ev.call)
        known = self.known.get(key)
        if known is None:
            second = batch_second(ev, role, t, b, getattr(self.env, "model", None), site)
            shape = f"{role} of {where} has shape {tuple(t.shape)} in a batch of {b}: its batch is at axis 1"
            if second and second[0] and self.rows in ("sample", "token"):
                raise RunError(f"{self.where}: rows={self.rows}, but {shape} ({second[1]}), not first; use rows: step "
                               f"(one row per batch){second[2]}")
            if self.rows == "token":
                known = 1
            elif second and self.rows == "auto":
                known = STEP
                self._per_step(key, shape, second, b, n == b or bool(n and b > 1 and n % b == 0))
            elif n == b:
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
        if known != STEP and self.rows != "token" and n != known * b:
            raise RunError(
                f"{self.where}: {role} of {where} had {known} row(s) per sample in its first batch, but has shape "
                f"{tuple(t.shape)} in batch {state.step} of {b} samples; record it with rows: step (one row per "
                f"batch), in a record action of its own: {{name: record, what: {role}, rows: step}}"
            )
        return known

    def _per_step(self, key: tuple[str, int], shape: str, second: tuple[bool, str, str], b: int, looks: bool) -> None:
        """A tensor with its batch at axis 1 is stored per step: said once per (role, call) where its
        shape `looks` like rows of samples; refused where the run's last batch is smaller (its
        per-step row would not fit the earlier ones)."""
        planned = getattr(self.env, "planned_samples", None)
        short = len(planned) % b if planned is not None and len(planned) > b else 0
        if short:
            raise RunError(f"{self.where}: {shape} ({second[1]}), so its rows cannot be samples, and one row per step "
                           f"cannot hold it either: the last batch of these {len(planned)} samples has {short}; give a "
                           f"data.batch_size that divides {len(planned)}{second[2]}")
        if looks and key not in self.warned:
            self.warned.add(key)
            log.warning("%s: %s (%s), so it is stored as one row per step, not as rows of samples; rows: step says so "
                        "and silences this%s", self.where, shape, second[1], second[2])


def batch_second(ev: Event, role: str, t: torch.Tensor, b: int, model: Any, site: bool) -> tuple[bool, str, str] | None:
    """Why `t`'s batch is at axis 1 rather than 0: (whether a module says so, why, what else to do); None where
    nothing says so. A (T, B, ...) tensor with T == B tells nothing by its shape: only a module's
    batch_first does (its own, or the nearest enclosing module's: a Linear inside a
    TransformerEncoderLayer(batch_first=False)), and an RNN's hidden state (layers, B, H)."""
    if t.dim() < 3 or t.shape[1] != b:
        return None
    part = role.split(".", 1)[1] if "." in role else ""
    target = None if site else ev.target
    if isinstance(target, torch.nn.RNNBase) and (part[:1] == "1" or part.startswith("hx")):
        return True, f"{type(target).__name__}'s hidden state is (layers, batch, hidden)", ""
    declared = None if target is None else declared_batch_first(target, ev.module, model)
    if declared is False and not (isinstance(target, torch.nn.MultiheadAttention) and part == "1"):  # (weights: B first)
        return True, "the module runs sequence-first, batch_first=False", ", or build the module with batch_first=True"
    if declared is None and b > 1 and t.shape[0] != b and t.shape[0] % b == 0:
        return False, (f"axis 0 is {t.shape[0] // b} x the batch and axis 1 the batch, as in a sequence-first "
                       f"(T, B, ...) tensor"), "; rows: sample folds it per sample if its axis 0 is batch-major (B*k, as swin's windows)"
    return None


TRANSFORMERS = (torch.nn.TransformerEncoderLayer, torch.nn.TransformerDecoderLayer, torch.nn.TransformerEncoder,
                torch.nn.TransformerDecoder)  # (no batch_first of their own: their attention's)


def declared_batch_first(target: Any, path: str, model: Any) -> bool | None:
    """The batch_first a module runs with: its own attribute (nn.LSTM, nn.MultiheadAttention,
    nn.Transformer), a PyTorch transformer layer's or stack's (its attention's), else the nearest
    enclosing module's; None where no module says."""
    chain = [target]
    if model is not None and path:
        parts = path.split(".")
        for i in range(len(parts) - 1, -1, -1):
            try:
                chain.append(model.get_submodule(".".join(parts[:i])))
            except AttributeError:
                break
    for m in chain:
        flag = getattr(m, "batch_first", None)
        if isinstance(flag, bool):
            return flag
        if isinstance(m, TRANSFORMERS):
            flags = [s.batch_first for s in m.modules() if isinstance(getattr(s, "batch_first", None), bool)]
            if flags:
                return flags[0]
    return None


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
