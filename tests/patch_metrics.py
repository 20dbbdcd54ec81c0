"""User metrics for tests/test_patching_runs.py (a `_target_` the config names)."""

from __future__ import annotations

import os

import torch

SIGNAL_AT: list[int] = []  # the metric call that sends SIGINT (then cleared): outside the config resume compares
CALLS: list[int] = [0]


def last_logit(logits: torch.Tensor, items: dict, token: int = 1) -> torch.Tensor:
    """One value per item: the last position's logit of `token`; SIGINT at call SIGNAL_AT[0]."""
    CALLS[0] += 1
    if SIGNAL_AT and CALLS[0] == SIGNAL_AT[0]:
        SIGNAL_AT.clear()
        os.kill(os.getpid(), 2)
    return logits[:, -1, token]


def batch_mean(logits: torch.Tensor, items: dict) -> torch.Tensor:
    """A scalar (TransformerLens' metrics end in .mean()): refused."""
    return logits[:, -1, 1].mean()
