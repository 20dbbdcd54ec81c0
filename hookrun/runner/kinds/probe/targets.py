"""Token-level targets computed from a text batch, for `probe.target: {_target_: ...}`.

    probe: {target: {_target_: hookrun.runner.kinds.probe.targets.after_space}, pool: every}

A target function takes the batch (the collated items: a dict of tensors for text) and returns one
target per token, (batch, tokens), or one per item, (batch,); integers are classes, floats values.
These read data=text's byte tokens (hookrun.data.text: byte b is id b + 3; 0-2 are pad, bos, eos).
"""

from __future__ import annotations

from typing import Any

import torch

SPACE = ord(" ") + 3  # the byte tokenizer's id of a space


def is_space(batch: Any) -> torch.Tensor:
    """1 where the token is a space, else 0: readable from the token's own embedding."""
    return (batch["input_ids"] == SPACE).long()


def after_space(batch: Any) -> torch.Tensor:
    """1 where the previous token is a space (the token starts a word), else 0: not in the token's own
    embedding; a layer knows it once attention has moved the previous token's identity over."""
    ids = batch["input_ids"]
    prev = torch.full_like(ids, -1)
    prev[:, 1:] = ids[:, :-1]
    return (prev == SPACE).long()
