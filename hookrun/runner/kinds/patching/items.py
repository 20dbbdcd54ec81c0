"""The items of a patching run, as one batch, checked against the block before any forward.

    items = load_items(dataset, block, limit=None, device=device)   # {"clean": (N, T), "corrupt": (N, T), ...}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch.utils.data import default_collate

from hookrun.errors import ConfigError, close_matches
from hookrun.runner.kinds.patching.block import Block


def load_items(dataset: Any, block: Block, limit: int | None = None, device: Any = None) -> dict[str, torch.Tensor]:
    n = len(dataset) if limit is None else min(limit, len(dataset))
    if n == 0:
        raise ConfigError("patching: the data set has no items")
    first = dataset[0]
    if not isinstance(first, Mapping):
        raise ConfigError(f"patching: the items are {type(first).__name__}s; patching reads dict items with the keys "
                          f"{', '.join(block.item_keys())} (the clean and corrupted inputs and what the metric needs)")
    for key in block.item_keys():
        if key not in first:
            where = _key_of(block, key)
            close = close_matches(str(key), list(map(str, first)), n=1)
            raise ConfigError(f"{where}={key!r}: the items have no key {key!r}; their keys: {', '.join(map(str, first))}"
                              + (f"; did you mean {close[0]}?" if close else ""))
    rows = [{k: v for k, v in dataset[i].items() if isinstance(v, torch.Tensor | int | float)} for i in range(n)]
    for name in ("clean", "corrupt"):
        key = getattr(block, name)
        shapes = [tuple(torch.as_tensor(r[key]).shape) if key in r else None for r in rows]
        j = next((j for j, s in enumerate(shapes) if s != shapes[0]), None)
        if j is not None:
            raise ConfigError(f"patching.{name}: the items' {key!r} differ in shape: item 0 has {shapes[0]}, item {j} "
                              f"{shapes[j]}; patching stacks the items into one batch: pad them to one length (and give "
                              f"each item's position with metric.position: KEY), or make items of one length")
    batch = default_collate(rows)
    clean, corrupt = batch[block.clean], batch[block.corrupt]
    if tuple(clean.shape) != tuple(corrupt.shape):
        raise ConfigError(f"patching.clean / patching.corrupt: the clean input {block.clean!r} has shape {tuple(clean.shape[1:])} "
                          f"per item and the corrupted {block.corrupt!r} {tuple(corrupt.shape[1:])}; patching needs the same "
                          f"shape (pad or cut them to one length)")
    return {k: v.to(device) for k, v in batch.items()}


def _key_of(block: Block, key: str) -> str:
    for name in ("clean", "corrupt"):
        if getattr(block, name) == key:
            return f"patching.{name}"
    for name in ("answer", "wrong", "position"):
        if getattr(block, name) == key:
            return f"patching.metric.{name}"
    return "patching"
