"""evaluate's metrics, with SAELens' definitions (sae_lens/evals.py): no hooks here, only outputs.

    objective = Objective(loss)                     # loss=lm: next-token; else the configured loss
    clean = objective.reference(out_clean, call)    # the clean forward's log-probabilities and ce
    row = batch_row(clean, {"intervened": clean.compare(out_other, call, "intervened")})
    totals = Totals(); totals.add(row); totals.means()

| metric          | per batch, and for the run from the float64 sums of every batch                  |
|-----------------|------------------------------------------------------------------------------------|
| ce_PASS         | loss=lm: mean next-token cross-entropy over the predicted tokens (logits at t      |
|                 | predict input_ids at t+1; a pair with padding on either side is left out); any     |
|                 | other loss: its value, weighted by the batch's samples                             |
| kl_PASS         | mean over positions (tokens with attention_mask 1; a classifier's samples) of      |
|                 | KL(clean || PASS) = sum over the classes of p_clean (log p_clean - log p): the     |
|                 | output's last dim; dim 1 with loss=cross_entropy (as torch's cross_entropy reads   |
|                 | it: a (batch, classes, H, W) output's positions are its batch x H x W)             |
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
from hookrun.runner.losses import log_probs

PASSES = ("clean", "intervened", "ablated")
MODEL_METRICS = ("ce_clean", "ce_intervened", "ce_ablated", "ce_loss_score", "kl_intervened", "kl_ablated",
                 "kl_div_score")
COUNTS = ("ce_count", "kl_count")
CLASS_DIM_1 = (torch.nn.CrossEntropyLoss, torch.nn.NLLLoss)  # losses (besides loss=cross_entropy) with classes at dim 1


CHUNK_BYTES = {"cpu": 4 << 20}  # the other forwards' log-probs are made a block of rows at a time
DEFAULT_CHUNK_BYTES = 256 << 20  # (a cache-sized block on a CPU; a large one where kernels are launched)


def ratio(num: float, den: float) -> float:
    return num / den + 0.0 if den != 0 and math.isfinite(den) else math.nan  # (+ 0.0: no -0.0)


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
        # torch's cross-entropy reads the classes at dim 1 ((batch, classes, H, W) for a segmenter): KL too
        self.class_dim = 1 if func is losses.cross_entropy or isinstance(loss, CLASS_DIM_1) else -1
        try:
            self.takes_batch = "batch" in inspect.signature(loss).parameters
        except (TypeError, ValueError):
            self.takes_batch = False

    def logits(self, output: Any) -> torch.Tensor:
        """The output's logits with the classes last (a (batch, classes, ...) output's moved there)."""
        logits = losses.pick_output(output, self.output_key, "lm" if self.lm else "evaluate")
        return logits.movedim(1, -1) if self.class_dim == 1 and logits.dim() > 2 else logits

    def loss_terms(self, output: Any, call: Any, samples: int) -> torch.Tensor:
        """A loss other than lm: its value times the batch's samples (a float64 0-d tensor)."""
        value = losses.call_loss(self.loss, self.takes_batch, output, call)
        if not isinstance(value, torch.Tensor) or value.numel() != 1:
            got = f"a tensor of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
            raise RunError(f"evaluate: loss: {losses.loss_name(self.loss)}(output, target) returned {got}; evaluate's "
                           f"ce needs a scalar tensor (the batch's mean loss, e.g. a .mean() over the batch)")
        return value.detach().reshape(()).double() * samples

    def reference(self, output: Any, call: Any) -> Reference:
        """The clean forward: its log-probabilities (kept for the other forwards), the rows each
        metric counts, and ce_clean."""
        logits = self.logits(output)
        shape = tuple(logits.shape)
        if len(shape) < 2:
            raise RunError(f"evaluate: the output's logits have shape {shape}; expected (batch, ..., classes)")
        logp = log_probs(logits).reshape(-1, shape[-1])
        mask = call.attention_mask
        kl_keep = mask.to(logp.device).bool().reshape(-1) if mask is not None and tuple(mask.shape) == shape[:-1] else None
        labels = ce_keep = None
        if self.lm:
            labels, ce_keep = next_token_labels(call, shape, logp.device)
            nll = -logp.gather(1, labels.unsqueeze(1)).squeeze(1)
            total, n = nll[ce_keep].double().sum(), ce_keep.sum()
        else:
            total, n = self.loss_terms(output, call, shape[0]), torch.tensor(shape[0], device=logp.device)
        positions = kl_keep.sum() if kl_keep is not None else torch.tensor(len(logp), device=logp.device)
        return Reference(self, logp, shape, kl_keep, labels, ce_keep, total, n, positions)


def next_token_labels(call: Any, shape: tuple, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """For each (sample, position) row of (B, T, V) logits: the next token, and whether it is
    predicted (t < T - 1, and neither t nor t + 1 is padding)."""
    batch = call.batch
    if not isinstance(batch, Mapping) or not isinstance(batch.get("input_ids"), torch.Tensor):
        raise RunError("evaluate with loss=lm needs dict items with input_ids (data=text gives them)")
    ids = batch["input_ids"].to(device).long()
    if len(shape) != 3 or shape[:2] != tuple(ids.shape):
        raise RunError(f"evaluate: logits of shape {shape} do not fit input_ids of shape {tuple(ids.shape)} "
                       f"(expected (batch, tokens, vocab)); set loss.output_key")
    labels = torch.zeros_like(ids)
    labels[:, :-1] = ids[:, 1:]
    keep = torch.zeros_like(ids, dtype=torch.bool)
    mask = batch.get("attention_mask")
    if isinstance(mask, torch.Tensor):
        keep[:, :-1] = losses.next_token_pairs(mask.to(device))
    else:
        keep[:, :-1] = True
    return labels.reshape(-1), keep.reshape(-1)


@dataclass
class Reference:
    """The clean forward of one batch, which the other forwards are compared with."""

    objective: Objective
    logp: torch.Tensor  # (rows, V): the clean log-probabilities, one row per position
    shape: tuple  # the logits' shape
    kl_keep: torch.Tensor | None  # (rows,) the positions KL is averaged over (None: all)
    labels: torch.Tensor | None  # loss=lm: (rows,) the next token of each position
    ce_keep: torch.Tensor | None  # loss=lm: (rows,) the predicted positions
    ce_sum: torch.Tensor  # 0-d, float64: the clean forward's ce terms summed
    ce_count: torch.Tensor  # 0-d: the predicted tokens (loss=lm) or the samples
    kl_count: torch.Tensor  # 0-d: the positions KL is averaged over

    def sums(self) -> dict[str, torch.Tensor]:
        """The clean forward's sums, as 0-d tensors on the output's device (batch_row reads them
        all at once: one device sync per batch)."""
        return {"ce_clean": self.ce_sum, "ce_count": self.ce_count, "kl_count": self.kl_count}

    def compare(self, output: Any, call: Any, name: str) -> dict[str, torch.Tensor]:
        """The sums of ce_NAME and kl_NAME of another forward of the same batch. Its log-probs are
        made a block of rows at a time (never the whole (B, T, V) at once): per row, the same
        numbers as a whole log_softmax."""
        logits = self.objective.logits(output)
        if tuple(logits.shape) != self.shape:
            raise RunError(f"evaluate: the {name} forward's output has shape {tuple(logits.shape)}, the clean one's {self.shape}")
        flat = logits.reshape(-1, self.shape[-1])
        rows = len(self.logp)
        step = max(1, CHUNK_BYTES.get(flat.device.type, DEFAULT_CHUNK_BYTES) // (4 * self.shape[-1]))
        kl = nll = flat.new_zeros((), dtype=torch.float64)
        for lo in range(0, rows, step):
            hi = min(rows, lo + step)
            lp, lpc = log_probs(flat[lo:hi]), self.logp[lo:hi]
            terms = (lpc - lp).mul_(lpc.exp()).sum(-1)
            kl = kl + (terms[self.kl_keep[lo:hi]] if self.kl_keep is not None else terms).double().sum()
            if self.labels is not None:
                picked = -lp.gather(1, self.labels[lo:hi].unsqueeze(1)).squeeze(1)
                nll = nll + picked[self.ce_keep[lo:hi]].double().sum()
        total = nll if self.labels is not None else self.objective.loss_terms(output, call, self.shape[0])
        return {f"ce_{name}": total, f"kl_{name}": kl}


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


def batch_row(clean: Reference, others: Mapping[str, dict[str, torch.Tensor]]) -> dict[str, float]:
    """One batch's row: the clean ce, each other forward's ce and kl, the scores, the counts. The
    sums are read from the device together, once."""
    sums = clean.sums()
    for values in others.values():
        sums.update(values)
    names = list(sums)
    values = dict(zip(names, torch.stack([sums[n].double() for n in names]).tolist(), strict=True))
    ce_n, kl_n = int(values.pop("ce_count")), int(values.pop("kl_count"))
    row = {k: (v / (ce_n if k.startswith("ce_") else kl_n) if (ce_n if k.startswith("ce_") else kl_n) else math.nan)
           for k, v in values.items()}
    row.update(scores(row))
    row.update(ce_count=ce_n, kl_count=kl_n)
    return {k: row[k] for k in (*MODEL_METRICS, *COUNTS) if k in row}
