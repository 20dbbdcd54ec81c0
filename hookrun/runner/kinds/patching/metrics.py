"""patching's metrics: one value per item from the (items, T, V) logits of a run, and the
normalization of a cell's value between the corrupted and the clean run's.

    item_metric("logit_diff", logits, items, position=-1, answer="answer", wrong="wrong", ids=ids, reference=None)
    normalized(value, clean, corrupt)   # 0 where a cell restores nothing, 1 where it restores all
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from hookrun.errors import foreign_code
from hookrun.runner.losses import log_probs, next_token_pairs, wide

PATCH_METRICS = ("logit_diff", "logprob", "prob", "ce", "kl", "logit")


def user_metric(fn: Any, name: str, logits: torch.Tensor, items: Mapping[str, torch.Tensor]) -> Any:
    """A metric of the user's own on one run's logits; an exception it raises is one RunError line naming
    it (its traceback: --verbose), as a loss or a model's forward that raises is (runner/losses.py)."""
    with foreign_code(f"patching.metric {name}(logits, items) raised"):
        return fn(logits, items)


def item_metric(name: str, logits: torch.Tensor, items: Mapping[str, torch.Tensor], position: int | str | None,
                answer: str | None, wrong: str | None, ids: torch.Tensor, reference: torch.Tensor | None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
    """The metric `name` of each item (a 1-d tensor, one value per row of `logits`):

    | name       | per item                                                                      |
    |------------|-------------------------------------------------------------------------------|
    | logit_diff | logits[pos, answer] - logits[pos, wrong]                                      |
    | logit      | logits[pos, answer]                                                           |
    | logprob    | log_softmax(logits[pos])[answer]                                              |
    | prob       | softmax(logits[pos])[answer]                                                  |
    | ce         | mean next-token cross-entropy of `ids` (the clean input) over the sequence    |
    |            | (with `mask`, the attention_mask: over the pairs t, t + 1 both real tokens)   |
    |            | (an item with no such pair: refused before any forward, checks.check_ce)      |
    | kl         | KL(reference || this run) at pos, summed over the vocabulary (reference: the  |
    |            | clean run's log-probabilities)                                                |

    `position` is an int (every item; -1 the last) or an item key holding each item's position;
    (items, classes) logits (an image classifier's) have no position: the row is read whole.
    """
    n = logits.shape[0]
    rows = torch.arange(n, device=logits.device)
    if name == "ce":
        lp = log_probs(logits[:, :-1])
        nll = -lp.gather(-1, ids[:, 1:, None].to(lp.device).long()).squeeze(-1)
        if mask is None or tuple(mask.shape) != tuple(ids.shape):
            return nll.mean(-1)
        keep = next_token_pairs(mask.to(nll.device))  # padding on either side left out, as loss=lm and evaluate leave it
        return nll.masked_fill(~keep, 0).sum(-1) / keep.sum(-1)
    at = wide(logits if logits.dim() == 2 else logits[rows, _positions(items, position, n, logits) % logits.shape[1]])  # fp16: exact diffs
    if name == "kl":
        lp = log_probs(at)
        return (reference.exp() * (reference - lp)).sum(-1)
    a = items[answer].to(logits.device).long().reshape(n)
    if name == "logit_diff":
        return at[rows, a] - at[rows, items[wrong].to(logits.device).long().reshape(n)]
    if name == "logit":
        return at[rows, a]
    lp = log_probs(at)[rows, a]
    return lp if name == "logprob" else lp.exp()


def reference_logprobs(logits: torch.Tensor, items: Mapping[str, torch.Tensor], position: int | str | None) -> torch.Tensor:
    """kl's reference: the log-probabilities at each item's position (the clean run)."""
    n = logits.shape[0]
    if logits.dim() == 2:  # (items, classes): an image classifier's output has no position
        return log_probs(logits).detach()
    rows = torch.arange(n, device=logits.device)
    return log_probs(logits[rows, _positions(items, position, n, logits) % logits.shape[1]]).detach()


def _positions(items: Mapping[str, torch.Tensor], position: int | str | None, n: int, logits: torch.Tensor) -> torch.Tensor:
    if isinstance(position, str):
        return items[position].to(logits.device).long().reshape(n)
    return torch.full((n,), int(position), device=logits.device)


def normalized(value: Any, clean: float, corrupt: float) -> Any:
    """(m - m_corrupt) / (m_clean - m_corrupt): 0 where a cell restores nothing, 1 where it restores all."""
    return (value - corrupt) / (clean - corrupt) if clean != corrupt else value * math.nan
