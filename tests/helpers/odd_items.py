"""Datasets whose items disagree with each other, or fail: 8 items of 4 values each, for `fc`
models of 4 inputs (toy_models' or the test's). `form` chooses how items 4-7 differ from 0-3."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import Dataset, IterableDataset


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


def features(i: int) -> torch.Tensor:
    return torch.arange(4, dtype=torch.float32) + i


class Items(Dataset):
    """form: "late_label" (dict items, only 4-7 carry `label`), "lost_label" ((x, i) tuples 0-3, then
    dicts without a target), "labels" (every item a dict with `label` = 7 - i: the consistent case),
    "target_shape" (a scalar target for 0-3, shape (2,) after), "raises" (item 6 raises KeyError; "raises_first": item 0),
    "short" (len() 8, but items 5-7 raise IndexError; "short_labels": those of "labels" 0-4, label i % 2)."""

    def __init__(self, form: str) -> None:
        self.form = form

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        x, f = features(i), self.form
        if f == "late_label":
            return {"x": x, "label": i} if i >= 4 else {"x": x}
        if f == "lost_label":
            return (x, i) if i < 4 else {"x": x}
        if f == "labels":
            return {"x": x, "label": 7 - i}
        if f == "target_shape":
            return x, (torch.tensor(i) if i < 4 else torch.tensor([i, i]))
        if (f == "raises" and i == 6) or (f == "raises_first" and i == 0):
            raise KeyError(f"bad item {i}")
        if f.startswith("short") and i >= 5:
            raise IndexError(i)
        if f == "short_labels":
            return {"x": x, "label": i % 2}
        return x, 0


class Streamed(IterableDataset):
    """A torch IterableDataset of Items("labels")'s 8 items, streamed: no __len__, no __getitem__."""

    def __iter__(self):
        return (Items("labels")[i] for i in range(8))


class StreamedLen(Streamed):
    """Streamed with a __len__ that lies (100 for 8 items)."""

    def __len__(self) -> int:
        return 100


class ShortSwaps(Dataset):
    """hookrun.data.swaps.word_swap's 4 items (length 8) with a __len__ of 6: items 4 and 5 raise IndexError."""

    def __init__(self) -> None:
        from hookrun.data.swaps import word_swap

        self.items = word_swap(n=4, length=8)

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int):
        return self.items[i]
