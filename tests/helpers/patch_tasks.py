"""The patching tests' token task: random prompts, each corrupted at one position, and random answers.

    clean, corrupt, ans, wrong, items = token_task(40, n=4, length=6, at=2)   # items: patch_grid's
"""

from __future__ import annotations

import torch


def token_task(vocab: int, n: int, length: int, *, at: int, low: int = 0, seed: int = 1):
    """n prompts of `length` tokens in [low, vocab) (a torch.Generator seeded `seed`), each corrupted at
    position `at` by a fresh draw, and an answer and a wrong answer in [0, vocab) per prompt; and the
    same as patch_grid's items ({"clean", "corrupt", "answer", "wrong"})."""
    g = torch.Generator().manual_seed(seed)
    clean = torch.randint(low, vocab, (n, length), generator=g)
    corrupt = clean.clone()
    corrupt[:, at] = torch.randint(low, vocab, (n,), generator=g)
    ans, wrong = torch.randint(0, vocab, (n,), generator=g), torch.randint(0, vocab, (n,), generator=g)
    items = [{"clean": clean[i], "corrupt": corrupt[i], "answer": ans[i], "wrong": wrong[i]} for i in range(n)]
    return clean, corrupt, ans, wrong, items
