"""User metrics for tests/patching/test_patching_runs.py (a `_target_` the config names)."""

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


def logit_diff_or_kill(logits: torch.Tensor, items: dict) -> torch.Tensor:
    """One value per item: logits[-1, answer] - logits[-1, wrong] (the built-in logit_diff); SIGKILL
    this process at its call CALL on rank RANK where the environment has HOOKRUN_TEST_KILL=RANK:CALL
    (outside the config, which resume compares; calls 1 and 2 are the clean and corrupted runs)."""
    import signal
    import time

    CALLS[0] += 1
    told = os.environ.get("HOOKRUN_TEST_KILL")
    if told:
        rank, call = map(int, told.split(":"))
        if int(os.environ.get("RANK", "0")) == rank and CALLS[0] == call:
            time.sleep(1.5)  # the writer thread flushes the chunks before this one
            os.kill(os.getpid(), signal.SIGKILL)
    rows = torch.arange(logits.shape[0])
    at = logits[:, -1]
    return at[rows, items["answer"].long()] - at[rows, items["wrong"].long()]
