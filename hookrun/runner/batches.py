"""Batch plumbing of the loop: items with their dataset index, collated into batches.

    loader = make_loader(ds, batch_size=16, num_workers=0)  # yields (indices, batch)
    loader = make_loader(ds, 2, 0, collate=collate_lists)   # items of different sizes, as lists
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, default_collate

from hookrun.errors import ConfigError, HookrunError, RunError


class Indexed(Dataset):
    """Wraps a dataset so each item comes with its index: the loader yields (indices, batch).
    `start` skips the first items (a resumed run), `stop` ends before item `stop` (data.limit's batches:
    no item past them is read, by a worker's prefetch either); the indices stay the dataset's own."""

    def __init__(self, dataset: Dataset, start: int = 0, stop: int | None = None) -> None:
        self.dataset = dataset
        self.start, self.stop = start, stop

    def __len__(self) -> int:
        end = len(self.dataset) if self.stop is None else min(self.stop, len(self.dataset))
        return max(0, end - self.start)

    def __getitem__(self, i: int) -> tuple[int, Any]:
        return self.start + i, self.dataset[self.start + i]


class Collate:
    """The loader's collate_fn: the indices as a tensor, the items through `fn` (default_collate
    unless data.collate names another), with one clear line where the items cannot be batched."""

    def __init__(self, fn: Callable | None = None) -> None:
        self.fn = fn or default_collate
        self.custom = fn is not None

    def __call__(self, pairs: list[tuple[int, Any]]) -> tuple[torch.Tensor, Any]:
        indices = torch.tensor([i for i, _ in pairs], dtype=torch.long)
        items = [item for _, item in pairs]
        if not self.custom:
            refuse_mixed(items, indices.tolist())
        try:
            return indices, self.fn(items)
        except (RuntimeError, TypeError) as exc:
            if self.custom:
                raise RunError(f"data.collate failed on the samples {indices.tolist()}: {type(exc).__name__}: "
                               f"{str(exc).splitlines()[0] if str(exc) else ''}") from None
            from hookrun.runner.data_errors import collate_message

            message = collate_message(items, indices.tolist(), exc)
            raise (ConfigError if "hold None" in message else RunError)(message) from None


def _form(item: Any) -> str:
    if isinstance(item, Mapping):
        return f"a dict of {', '.join(sorted(map(str, item)))}"
    if isinstance(item, tuple | list):
        return f"a {type(item).__name__} of {len(item)}"
    return f"a {type(item).__name__}"


def refuse_mixed(items: list, indices: list[int]) -> None:
    """Items of one batch must have one form (the same keys, the same length): default_collate drops
    a key the first item lacks (a target of later items lost) and fails obscurely on the rest."""
    first = _form(items[0]) if items else ""
    j = next((j for j, item in enumerate(items) if _form(item) != first), None)
    if j is not None:
        raise RunError(f"data: the items of one batch differ: sample {indices[0]} is {first}, sample {indices[j]} "
                       f"is {_form(items[j])}; every item must have the same parts: each gives a target, or none does "
                       f"(data.target=null)")


def build_collate(node: Any) -> Callable:
    """data.collate built: a function that takes the list of items. Without `_partial_: true` Hydra
    calls it with no items (collate_lists() missing 'items'), or builds an object that is no function."""
    from hookrun.config.build import build

    hint = "a collate function is called with the list of items: add `_partial_: true` to data.collate"
    try:
        fn = build(node, "data.collate")
    except ConfigError as exc:
        if "required positional argument" in str(exc) and "_partial_" not in node:
            raise ConfigError(f"{exc}; {hint}") from None
        raise
    if not callable(fn):
        raise ConfigError(f"data.collate: built a {type(fn).__name__}, not a function; {hint}")
    return fn


def make_loader(dataset: Dataset, batch_size: int, num_workers: int, start: int = 0,
                collate: Callable | None = None, stop: int | None = None) -> DataLoader:
    if batch_size < 1:
        raise ConfigError(f"data.batch_size must be at least 1, got {batch_size}")
    if num_workers < 0:
        raise ConfigError(f"data.num_workers must be 0 or more, got {num_workers}")
    return DataLoader(Indexed(dataset, start, stop), batch_size=batch_size, shuffle=False, num_workers=num_workers,
                      collate_fn=Collate(collate))


def first_items(dataset: Dataset, size: int) -> list[Any]:
    """The dataset's first `size` items (fewer where it has fewer), read before any batch: an item
    that raises is one line (data_failure), as in the loop."""
    n = min(size, len(dataset))  # type: ignore[arg-type]
    try:
        return [dataset[i] for i in range(n)]
    except HookrunError:
        raise
    except Exception as exc:
        from hookrun.runner.data_errors import data_failure

        raise data_failure(exc, f"data: loading the first {n} item(s) before the run failed:") from exc


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
