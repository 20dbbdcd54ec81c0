"""Small models and datasets with dict items, keyword inputs and token masks (issue 10 tests)."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import Dataset


class Scorer(nn.Module):
    """Called with keywords only inside: `self.mix(hidden_states=..., mask=...)`."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(20, 8)
        self.mix = Mix()
        self.head = nn.Linear(8, 3)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        h = self.embed(input_ids)
        mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
        h = self.mix(hidden_states=h, mask=mask.to(h.dtype))
        return self.head(h.mean(dim=1))


class Mix(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, hidden_states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.lin(hidden_states) * mask.unsqueeze(-1)


class Tokens(Dataset):
    """Dict items {input_ids, attention_mask, label}: right-padded sequences of length 6."""

    def __init__(self, n: int = 10, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(1, 20, (n, 6), generator=g)
        lengths = torch.randint(2, 7, (n,), generator=g)
        self.mask = (torch.arange(6)[None] < lengths[:, None]).long()
        self.ids = self.ids * self.mask
        self.labels = torch.randint(0, 3, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i], "label": self.labels[i]}


class TokenTuples(Tokens):
    """The same data as (input_ids, attention_mask, label) tuples."""

    def __getitem__(self, i: int) -> tuple:
        return self.ids[i], self.mask[i], self.labels[i]


class Ragged(Dataset):
    """Vectors of different lengths: default_collate cannot stack them."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.ones(3 + i)


class NoneTargets(Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> tuple:
        return torch.ones(3), None
