"""The forward call's parts that only keyword inputs and token models have, loaded where a run's items or
model have them (runner/calls.py asks): the items' keys checked against the forward's arguments
(check_keywords), a left-padded attention mask the forward is not passed (refuse_unpassed), `position_ids`
for left-padded rows (with_positions), and input_ids longer than the model's position table (check_positions).

    kwargs = with_positions(model, call.kwargs, call.attention_mask)   # GPT-2's positions from the first real token
    check_positions(model, item, position_limit(model), "item 7 holds")
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from hookrun.errors import ConfigError

MASK = "attention_mask"  # a dict item's mask key (calls.py's MASK_KEY)


def check_keywords(model: nn.Module, item: Any, keys: list | Mapping, first: Any, inputs: Any, target: Any) -> bool:
    """CallSpec.check_forward for items passed as keywords (a dict item, data.inputs `inputs` as a mapping, or
    a (dict, label) item whose dict is `first`; `target`: a dict item's target key): whether a dict item's
    attention_mask, which the forward takes, is not passed (refused here where it is left-padded)."""
    unpassed = (isinstance(item, Mapping) and isinstance(item.get(MASK), torch.Tensor)
                and MASK not in [*keys, *(keys.values() if isinstance(keys, Mapping) else ())] and _takes(type(model), MASK))
    refuse_unpassed(inputs, item.get(MASK) if unpassed else None, "the first item")
    if isinstance(keys, Mapping):
        names = [str(a) for a in keys]
    elif isinstance(first, Mapping):
        names = [str(k) for k in first]
    else:
        return unpassed
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return unpassed
    unknown = [n for n in names if n not in params]
    if any(p.kind is p.VAR_KEYWORD for p in params.values()) or not unknown:
        return unpassed
    takes = [n for n, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    fit = dict(zip(takes, [n for n in names if n not in takes], strict=False))
    line = "{" + ", ".join(f"{a}: {k}" for a, k in fit.items()) + "}"
    raise ConfigError(
        f"data: the items' keys ({', '.join(names)}{f'; target {target}' if target else ''}) are passed as keyword "
        f"arguments, and {type(model).__name__}.forward takes {', '.join(takes) or 'none'}, not "
        f"{', '.join(unknown)}; map them with data.inputs='{line}'")


def refuse_unpassed(inputs: Any, mask: Any, where: str) -> None:
    """The items' left-padded mask not passed (data.inputs `inputs` leaves it out): the model attends to the
    padding (tiny_lm's h.1: 1.08 off)."""
    if isinstance(mask, torch.Tensor) and mask.dim() in (1, 2) and bool(((mask[..., 0] == 0) & mask.bool().any(-1)).any()):
        raise ConfigError(f"data.inputs={inputs!r}: the items' attention_mask is left-padded ({where} starts with padding) and "
                          "the model is called without it, so it attends to the padding; add attention_mask: attention_mask to data.inputs")


def with_positions(model: nn.Module, kwargs: dict, mask: Any) -> dict:
    """`kwargs` with `position_ids` counted from the attention `mask` where a row is left-padded and the
    model's forward takes them: each item's first real token at position 0, as generate() and TransformerLens
    count them (GPT-2's learned positions started at the padding, so its activations moved with it). As
    given where no row is left-padded (the same positions), the call names its own, or the model takes none."""
    if (not isinstance(mask, torch.Tensor) or mask.dim() != 2 or "position_ids" in kwargs
            or not _takes(type(model), "position_ids") or bool(mask[:, 0].all())):
        return kwargs
    return {**kwargs, "position_ids": (mask.long().cumsum(-1) - 1).clamp(min=0)}


@functools.cache
def _takes(cls: type, argument: str) -> bool:
    try:
        return argument in inspect.signature(cls.forward).parameters
    except (TypeError, ValueError):
        return False


def check_positions(model: nn.Module, items: Any, table: tuple[int, str] | None, who: str = "the items hold") -> None:
    """Items' `input_ids` (an item, or a collated batch) longer than the model's position `table`
    (position_limit) is one line naming them (`who`: "the items hold", "item 7 holds", "batch 3 (items
    24..31) holds"): the forward's own error was 'IndexError: index out of range in self'. prepare()
    checks the first item, every item of a data set held in memory (a list), and the loop each batch."""
    ids = items.get("input_ids") if isinstance(items, Mapping) else None
    if table is None or not isinstance(ids, torch.Tensor) or ids.dim() == 0 or ids.shape[-1] <= table[0]:
        return
    raise ConfigError(f"data: {who} {ids.shape[-1]} tokens (input_ids), more than the {table[0]} positions of "
                      f"{type(model).__name__} ({table[1]}); set data.dataset.max_length={table[0]} or less "
                      f"(data=text cuts each text to it), or give shorter items")
