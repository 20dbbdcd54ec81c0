"""The run's options a plain record leaves off, loaded only where a config gives them: data.collate built
(build_collate), the batch's keys data.store keeps per sample (stored_keys), and the hooks early_stop=true
takes (check_early_stop).

    collate = build_collate(cfg.data.collate)                # a function that takes the list of items
    stored = stored_keys(batch, ("input_ids",))              # {key: host array}, one row per sample
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from hookrun.errors import ConfigError
from hookrun.hooks.actions import ACTIONS
from hookrun.runner.loop import host_copy


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


def stored_keys(batch: Any, keys: tuple[str, ...]) -> dict[str, np.ndarray] | None:
    """The batch's tensors named by data.store, as host arrays (one row per sample); prepare asks it of
    the first item's batch, so a key the items lack is refused before the file opens."""
    if not keys:
        return None
    if not isinstance(batch, Mapping):
        raise ConfigError(f"data.store={list(keys)} names keys of dict items, but a batch is a {type(batch).__name__} "
                          f"(tuple or tensor items have no keys); remove data.store (data.store=[])")
    out = {}
    for k in keys:
        v = batch.get(k)
        if not isinstance(v, torch.Tensor):
            raise ConfigError(f"data.store: the batch has no tensor {k!r}; its keys: {', '.join(map(str, batch))}")
        out[k] = host_copy(v)
    return out


def check_early_stop(points: list) -> None:
    name = lambda a: ACTIONS.name_of(type(a)) or "a _target_ action"  # noqa: E731 (the `name:` the hook gave)
    whole = next((a for p in points for a in p.actions if getattr(a, "whole_forward", False)), None)
    if whole is not None:
        raise ConfigError(f"early_stop=true cuts the forward after the last hook, but {whole.where} needs the whole "
                          f"forward ({name(whole)} reads the model's output); drop early_stop")
    for p in points:
        if p.type not in ("forward", "forward_pre") or not all(a.records and not a.modifies for a in p.actions):
            raise ConfigError(
                f"early_stop=true needs hooks that only record (forward or forward_pre with record actions); "
                f"hooks.{p.hook} is type {p.type} with {', '.join(name(a) for a in p.actions)}"
            )
