"""evaluate's formulas, with SAELens' definitions (sae_lens/evals.py): no hooks here, only outputs.

    objective = Objective(loss)                     # loss=lm: next-token; else the configured loss
    clean = objective.reference(out_clean, call)    # the clean forward's log-probabilities and ce
    row = {**clean.row(), **clean.compare(out_other, call, "intervened")}
    totals = Totals(); totals.add(row); totals.means()

| metric          | per batch, and for the run from the float64 sums of every batch                  |
|-----------------|------------------------------------------------------------------------------------|
| ce_PASS         | loss=lm: mean next-token cross-entropy over the predicted tokens (logits at t      |
|                 | predict input_ids at t+1; a pair with padding on either side is left out); any     |
|                 | other loss: its value, weighted by the batch's samples                             |
| kl_PASS         | mean over positions (tokens with attention_mask 1; a classifier's samples) of      |
|                 | KL(clean || PASS) = sum over the output's last dim of p_clean (log p_clean - log p)|
| ce_loss_score   | (ce_ablated - ce_intervened) / (ce_ablated - ce_clean)                             |
| kl_div_score    | (kl_ablated - kl_intervened) / kl_ablated                                          |

The scores of the run come from the run's means (as SAELens forms them from means), not from a
mean of per-batch scores. A score whose denominator is 0 is NaN. `ce_count` and `kl_count` are
the weights: predicted tokens (samples) and positions.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from hookrun.errors import RunError
from hookrun.runner import losses

PASSES = ("clean", "intervened", "ablated")
MODEL_METRICS = ("ce_clean", "ce_intervened", "ce_ablated", "ce_loss_score", "kl_intervened", "kl_ablated",
                 "kl_div_score")
COUNTS = ("ce_count", "kl_count")


def log_probs(logits: torch.Tensor) -> torch.Tensor:
    """log-softmax over the last dim, in float32 at least."""
    return torch.log_softmax(logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits, dim=-1)


def next_token_nll(logp: torch.Tensor, input_ids: torch.Tensor, mask: torch.Tensor | None) -> tuple[float, int]:
    """Sum and count of -log p(input_ids[t+1]) at positions t whose pair (t, t+1) is not padding."""
    labels = input_ids[:, 1:].to(logp.device).long()
    nll = -logp[:, :-1].gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    if mask is None:
        return float(nll.double().sum()), nll.numel()
    m = mask.to(logp.device).bool()
    keep = m[:, 1:] & m[:, :-1]
    return float(nll[keep].double().sum()), int(keep.sum())


def kl_terms(logp_clean: torch.Tensor, logp_other: torch.Tensor, mask: torch.Tensor | None) -> tuple[float, int]:
    """Sum over positions of KL(clean || other) (summed over the last dim), and the positions: those
    of `mask` where it has the positions' shape (tokens), else all."""
    kl = (logp_clean.exp() * (logp_clean - logp_other)).sum(-1)
    if mask is not None and tuple(mask.shape) == tuple(kl.shape):
        keep = mask.to(kl.device).bool()
        return float(kl[keep].double().sum()), int(keep.sum())
    return float(kl.double().sum()), kl.numel()


def ratio(num: float, den: float) -> float:
    return num / den if den != 0 and math.isfinite(den) else math.nan


def scores(m: Mapping[str, float]) -> dict[str, float]:
    """ce_loss_score and kl_div_score from the means in `m` (where it has the ablated pass)."""
    if "ce_ablated" not in m:
        return {}
    return {"ce_loss_score": ratio(m["ce_ablated"] - m["ce_intervened"], m["ce_ablated"] - m["ce_clean"]),
            "kl_div_score": ratio(m["kl_ablated"] - m["kl_intervened"], m["kl_ablated"])}


class Objective:
    """How `ce` is measured: loss=lm next-token from input_ids (and attention_mask), any other loss
    by calling it; the output's logits (for KL) are the tensor the loss reads (its output_key)."""

    def __init__(self, loss: Any) -> None:
        self.loss = loss
        func = getattr(loss, "func", loss)
        self.lm = func is losses.lm
        self.output_key = getattr(loss, "keywords", {}).get("output_key")
        try:
            self.takes_batch = "batch" in inspect.signature(loss).parameters
        except (TypeError, ValueError):
            self.takes_batch = False

    def logits(self, output: Any) -> torch.Tensor:
        return losses.pick_output(output, self.output_key, "lm" if self.lm else "evaluate")

    def ce(self, output: Any, logp: torch.Tensor, call: Any) -> tuple[float, int]:
        """Sum and count of the cross-entropy terms of one forward."""
        if self.lm:
            batch = call.batch
            if not isinstance(batch, Mapping) or not isinstance(batch.get("input_ids"), torch.Tensor):
                raise RunError("evaluate with loss=lm needs dict items with input_ids (data=text gives them)")
            ids = batch["input_ids"]
            if tuple(logp.shape[:2]) != tuple(ids.shape):
                raise RunError(f"evaluate: logits of shape {tuple(logp.shape)} do not fit input_ids of shape "
                               f"{tuple(ids.shape)} (expected (batch, tokens, vocab)); set loss.output_key")
            return next_token_nll(logp, ids, batch.get("attention_mask"))
        value = self.loss(output, call.target, batch=call.batch) if self.takes_batch else self.loss(output, call.target)
        if not isinstance(value, torch.Tensor) or value.numel() != 1:
            raise RunError(f"evaluate: the loss returned {type(value).__name__} {tuple(getattr(value, 'shape', ()))}, "
                           f"expected a scalar tensor")
        n = len(logp) if logp.dim() else 1
        return float(value.double()) * n, n

    def reference(self, output: Any, call: Any) -> Reference:
        logp = log_probs(self.logits(output))
        total, n = self.ce(output, logp, call)
        return Reference(self, logp, call.attention_mask, total / n if n else math.nan, n)


@dataclass
class Reference:
    """The clean forward of one batch, which the other forwards are compared with."""

    objective: Objective
    logp: torch.Tensor
    mask: torch.Tensor | None
    ce_clean: float
    ce_count: int

    def row(self) -> dict[str, float]:
        return {"ce_clean": self.ce_clean, "ce_count": self.ce_count}

    def compare(self, output: Any, call: Any, name: str) -> dict[str, float]:
        """ce_NAME, kl_NAME (and kl_count) of another forward of the same batch."""
        logp = log_probs(self.objective.logits(output))
        if logp.shape != self.logp.shape:
            raise RunError(f"evaluate: the {name} forward's output has shape {tuple(logp.shape)}, the clean one's "
                           f"{tuple(self.logp.shape)}")
        total, n = self.objective.ce(output, logp, call)
        kl, positions = kl_terms(self.logp, logp, self.mask)
        return {f"ce_{name}": total / n if n else math.nan, f"kl_{name}": kl / positions if positions else math.nan,
                "kl_count": positions}


class Totals:
    """The run's means: float64 sums of each batch's mean times its count (ce_* by ce_count,
    kl_* by kl_count), then the scores from those means."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.counts = {"ce_count": 0, "kl_count": 0}

    def add(self, row: Mapping[str, float]) -> None:
        for name in ("ce_count", "kl_count"):
            self.counts[name] += int(row.get(name, 0))
        for name, value in row.items():
            if name.startswith(("ce_", "kl_")) and name not in COUNTS and not name.endswith("_score"):
                weight = row.get("ce_count" if name.startswith("ce_") else "kl_count", 0)
                if weight:
                    self.sums[name] = self.sums.get(name, 0.0) + float(value) * float(weight)

    def means(self) -> dict[str, float]:
        out = {}
        for name, total in self.sums.items():
            n = self.counts["ce_count" if name.startswith("ce_") else "kl_count"]
            out[name] = total / n if n else math.nan
        out.update(scores(out))
        out.update(self.counts)
        return {k: out[k] for k in (*MODEL_METRICS, *COUNTS) if k in out}


def batch_row(clean: Reference, others: Mapping[str, dict[str, float]]) -> dict[str, float]:
    """One batch's row: the clean ce, each other forward's ce and kl, the scores, the counts."""
    row = clean.row()
    for values in others.values():
        row.update(values)
    row.update(scores(row))
    return {k: row[k] for k in (*MODEL_METRICS, *COUNTS) if k in row}
