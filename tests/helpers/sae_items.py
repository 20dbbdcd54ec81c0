"""The SAE tests' small live set-up: 64 seeded items of 8 features with a class, an MLP (8 -> 16 -> 16)
of seed 0, and a held-out data set of the same shape for sae.evaluate.data."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import Dataset

HELD_OUT = {"_target_": "hookrun.data.RandomTensors", "n": 32, "shape": [8], "num_classes": 16, "seed": 7}


class Items(Dataset):
    """Item i: 8 normal features and a class below `classes`, both from seed i."""

    def __init__(self, classes: int = 16) -> None:
        self.classes = classes

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.randn(8, generator=g), int(torch.randint(0, self.classes, (), generator=g))


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16)).eval()
