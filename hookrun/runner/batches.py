"""Batch plumbing of the loop: items with their dataset index, checks, and (input, target) splits.

    loader = make_loader(ds, batch_size=16, num_workers=0)  # yields (indices, batch)
    inputs, target = split_batch(batch)
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from hookrun.errors import ConfigError


class Indexed(Dataset):
    """Wraps a dataset so each item comes with its index: the loader yields (indices, batch).
    `start` skips the first items (a resumed run); the indices stay the dataset's own."""

    def __init__(self, dataset: Dataset, start: int = 0) -> None:
        self.dataset = dataset
        self.start = start

    def __len__(self) -> int:
        return max(0, len(self.dataset) - self.start)

    def __getitem__(self, i: int) -> tuple[int, Any]:
        return self.start + i, self.dataset[self.start + i]


def check_item(item: Any) -> None:
    """A dataset item must be a tensor, a dict of tensors (a tokenizer's output), or a tuple
    (input, target, ...) whose input is a tensor."""
    if isinstance(item, dict) and item and all(isinstance(v, torch.Tensor) for v in item.values()):
        return
    first = item[0] if isinstance(item, tuple | list) and len(item) else item
    if not isinstance(first, torch.Tensor):
        got = type(item).__name__ + (f" whose first element is a {type(first).__name__}" if first is not item else "")
        raise ConfigError(
            f"data.dataset: an item is a {got}; hookrun needs a tensor or a tuple (input, target, ...) "
            f"with a tensor input (add a transform such as torchvision.transforms.ToTensor)"
        )


def make_loader(dataset: Dataset, batch_size: int, num_workers: int, start: int = 0) -> DataLoader:
    if batch_size < 1:
        raise ConfigError(f"data.batch_size must be at least 1, got {batch_size}")
    if num_workers < 0:
        raise ConfigError(f"data.num_workers must be 0 or more, got {num_workers}")
    return DataLoader(Indexed(dataset, start), batch_size=batch_size, shuffle=False, num_workers=num_workers)


def split_batch(batch: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(input, target) of a collated batch; target is None where items carry none."""
    if isinstance(batch, torch.Tensor | dict):
        return batch, None
    inputs = batch[0]
    target = batch[1] if len(batch) > 1 and isinstance(batch[1], torch.Tensor) else None
    return inputs, target


def to_device(inputs: Any, device: torch.device) -> Any:
    """A tensor, or a dict of them, on the device."""
    if isinstance(inputs, dict):
        return {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    return inputs.to(device, non_blocking=True)


def sample_paths(dataset: Dataset, indices: list[int]) -> list[str] | None:
    """The file path of each sample, where the dataset keeps them (ImageFolder's `samples`)."""
    samples = getattr(dataset, "samples", None)
    if not isinstance(samples, list | tuple) or not samples:
        return None
    first = samples[0]
    if isinstance(first, tuple | list) and first and isinstance(first[0], str):
        return [samples[i][0] for i in indices]
    if isinstance(first, str):
        return [samples[i] for i in indices]
    return None
