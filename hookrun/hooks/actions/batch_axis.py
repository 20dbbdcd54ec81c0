"""Where the batch is in what a hook sees, where it is not simply axis 0: a tensor with its batch at
axis 1 (a sequence-first module's `(T, B, ...)`, an RNN's hidden state), the batch_first a module runs
with, and a list with one item per sample (detection's outputs). Loaded only where a record's tensor
might have its batch at axis 1, or its hook sees such a list (hookrun.hooks.actions.rows), and by
top_examples, taps and the live SAE.

    batch_second(ev, "output", t, 8, model, site=False)   # (True, "the module runs sequence-first, ...", "...")
    declared_batch_first(model.encoder.layers[0], "encoder.layers.0", model)  # False
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from hookrun.errors import RunError
from hookrun.hooks import Event, flatten

log = logging.getLogger("hookrun")


def rows_per_step(rule: Any, key: tuple[str, int], shape: str, second: tuple[bool, str, str], b: int,
                  looks: bool) -> None:
    """A tensor with its batch at axis 1 (batch_second) is stored per step by `rule` (RowRule.layout):
    said once per (role, call) where its shape `looks` like rows of samples; refused where the run's
    last batch is smaller (its per-step row would not fit the earlier ones)."""
    planned = getattr(rule.env, "planned_samples", None)
    short = len(planned) % b if planned is not None and len(planned) > b else 0
    if short:
        raise RunError(f"{rule.where}: {shape} ({second[1]}), so its rows cannot be samples, and one row per step "
                       f"cannot hold it either: the last batch of these {len(planned)} samples has {short}; give a "
                       f"data.batch_size that divides {len(planned)}{second[2]}")
    if looks and key not in rule.warned:
        rule.warned.add(key)
        log.warning("%s: %s (%s), so it is stored as one row per step, not as rows of samples; rows: step says so "
                    "and silences this%s", rule.where, shape, second[1], second[2])


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
