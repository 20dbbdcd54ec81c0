"""Collate functions for `data.collate`: how a list of items becomes one batch.

    data.collate: {_target_: hookrun.data.collate_lists, _partial_: true}
    collate_lists([(img_a, tgt_a), (img_b, tgt_b)])  # -> ([img_a, img_b], [tgt_a, tgt_b])
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def collate_lists(items: list[Any]) -> Any:
    """Items side by side as lists, nothing stacked: tuples give a tuple of lists, dicts a dict of
    lists, tensors a list. What torchvision's detection models take (images of different sizes)."""
    first = items[0]
    if isinstance(first, Mapping):
        return {k: [item[k] for item in items] for k in first}
    if isinstance(first, tuple | list):
        return tuple(list(parts) for parts in zip(*items, strict=True))
    return list(items)
