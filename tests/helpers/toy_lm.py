"""The tests' tiny random-init GPT-2 (one builder for every test that needs one) and left-padded
prompts of different lengths, for mode=generate tests.

    model = tiny_gpt2(seed=0)
    model = tiny_gpt2(0, "eager", n_embd=32, n_head=4, vocab_size=50)   # other sizes, eager attention
    ds = Prompts(n=6)          # items {input_ids, attention_mask}, left-padded to one length
    ds = Renamed(side="right") # the same under other keys, {ids, mask} (data.inputs maps them)
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch.utils.data import Dataset

VOCAB, WIDTH, PAD, EOS = 64, 32, 0, 3


class Letters:
    """A toy tokenizer: token i is the letter chr(97 + i % 26); 0 (pad) and 3 (eos) are special."""

    pad_token_id, eos_token_id = PAD, EOS

    def __init__(self) -> None:
        self.padding_side = "left"

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(97 + i % 26) for i in ids if not (skip_special_tokens and i in (PAD, EOS)))


class Prompts(Dataset):
    """`n` prompts of 2 to `length` tokens, left-padded to `length` (or right-padded, to test the refusal)."""

    def __init__(self, n: int = 6, length: int = 7, seed: int = 0, side: str = "left") -> None:
        g = torch.Generator().manual_seed(seed)
        self.items = []
        for i in range(n):
            size = 2 + (i * 3) % (length - 1)
            ids, mask = torch.full((length,), PAD), torch.zeros(length, dtype=torch.long)
            part = slice(length - size, length) if side == "left" else slice(0, size)
            ids[part] = torch.randint(4, VOCAB, (size,), generator=g)
            mask[part] = 1
            self.items.append({"input_ids": ids, "attention_mask": mask})
        self.tokenizer = Letters()

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return self.items[i]


class Renamed(Dataset):
    """Prompts under other keys than the model's arguments: {ids, mask}."""

    def __init__(self, n: int = 6, side: str = "left") -> None:
        self.items = [{"ids": p["input_ids"], "mask": p["attention_mask"]} for p in Prompts(n=n, side=side).items]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return self.items[i]


def tiny_gpt2(seed: int = 0, attn_implementation: str | None = None, **config: Any) -> torch.nn.Module:
    """The tests' one tiny random-init GPT-2 (transformers' GPT2LMHeadModel), in eval mode, its weights
    drawn after torch.manual_seed(seed). `config`: GPT2Config's arguments over these defaults (2
    blocks of WIDTH, 2 heads, VOCAB tokens, 64 positions, the Letters' special tokens);
    `attn_implementation`: "eager" or "sdpa", transformers' default where None."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(**{"n_layer": 2, "n_embd": WIDTH, "n_head": 2, "vocab_size": VOCAB, "n_positions": 64,
                           "bos_token_id": 1, "eos_token_id": EOS, "pad_token_id": PAD, **config})
    if attn_implementation is None:
        return GPT2LMHeadModel(config).eval()
    return GPT2LMHeadModel._from_config(config, attn_implementation=attn_implementation).eval()


def tiny_gpt2_failing_on_rank(rank: int = 1, checkpoint: Any = None, **kw: Any) -> torch.nn.Module:
    """tiny_gpt2(**kw) whose forward raises RuntimeError in the process whose RANK (or SUBMITIT_LOCAL_GLOBALID)
    is `rank`: one rank of a many-process run fails, the others go on (`checkpoint`: tiny_lm's key, unused)."""
    model = tiny_gpt2(**kw)
    if int(os.environ.get("RANK", os.environ.get("SUBMITIT_LOCAL_GLOBALID", "0"))) == rank:
        def boom(module: torch.nn.Module, args: Any) -> None:
            raise RuntimeError(f"rank {rank} fails (tests/helpers/toy_lm.tiny_gpt2_failing_on_rank)")
        model.register_forward_pre_hook(boom)
    return model
