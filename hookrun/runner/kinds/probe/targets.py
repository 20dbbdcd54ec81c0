"""Token-level targets computed from a text batch, for `probe.target: {_target_: ...}`.

    probe: {target: {_target_: hookrun.runner.kinds.probe.targets.after_space}, pool: every}

A target function takes the batch (the collated items: a dict of tensors for text) and returns one
target per token, (batch, tokens), or one per item, (batch,); integers are classes, floats values.
These read data=text's byte tokens (hookrun.data.text: byte b is id b + 3; 0-2 are pad, bos, eos); ids
past the bytes' (a tokenizer folder's: GPT-2's id 35 is 'D') are one line, not targets of another token.
"""

from __future__ import annotations

from typing import Any

import torch

from hookrun.errors import ConfigError

SPACE = ord(" ") + 3  # the byte tokenizer's id of a space
BYTE_IDS = 256 + 3  # the byte tokenizer's vocabulary (hookrun.data.text.ByteTokenizer.vocab_size)


def byte_ids(batch: Any, name: str) -> torch.Tensor:
    """The batch's input_ids, refused in one line where they are not the byte tokenizer's."""
    ids = batch["input_ids"]
    top = int(ids.max()) if ids.numel() else 0
    if top >= BYTE_IDS:  # (a tokenizer folder's ids: after_space read 'after token 35', GPT-2's 'D', as 'after a space')
        raise ConfigError(f"probe.target: {name} reads data=text's byte tokens (data.dataset.tokenizer: byte, whose ids "
                          f"are below {BYTE_IDS}), and this batch's ids reach {top}: another tokenizer's, whose id {SPACE} "
                          f"is not a space; use tokenizer: byte, or a target function that knows your tokenizer")
    return ids


def is_space(batch: Any) -> torch.Tensor:
    """1 where the token is a space, else 0: readable from the token's own embedding."""
    return (byte_ids(batch, "is_space") == SPACE).long()


def after_space(batch: Any) -> torch.Tensor:
    """1 where the previous token is a space (the token starts a word), else 0: not in the token's own
    embedding; a layer knows it once attention has moved the previous token's identity over."""
    ids = byte_ids(batch, "after_space")
    prev = torch.full_like(ids, -1)
    prev[:, 1:] = ids[:, :-1]
    return (prev == SPACE).long()
