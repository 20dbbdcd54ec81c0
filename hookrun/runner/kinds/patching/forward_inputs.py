"""The arguments of every patching forward: the clean or corrupted ids at `patching.input`, and
every other input `data.inputs` maps (an attention_mask, token_type_ids), repeated for the copies
of the items a packed forward holds.

    call = ForwardCall(block, {"input_ids": "clean", "attention_mask": "mask"}, items)
    model(**call(ids))   # ids: (items x copies, T) -> {input_ids: ids, attention_mask: items["mask"] x copies}
    call.extra           # {"attention_mask": "mask"}: what goes beside the ids (the suffix route is off then)

A mapped input is the item's own in every forward (clean, corrupted, patched, atp's, the edges
kinds'): the clean and corrupted runs of an item share it. Refused in one ConfigError line (before
any forward): a list (patching passes inputs by name), `patching.input` mapped to another key than
the clean input, the clean or corrupted input mapped to another argument, a key that is not a
tensor of the items. Items with an attention_mask that no forward receives: one warning line.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch

from hookrun.errors import ConfigError
from hookrun.runner.calls import MASK_KEY

log = logging.getLogger("hookrun")


def check_inputs(block: Any, inputs: Any) -> dict[str, str]:
    """{argument: item key} of the inputs beside `patching.input` (none where `inputs` is None)."""
    if inputs is None:
        return {}
    ids = (block.clean, block.corrupt)
    if not isinstance(inputs, Mapping):
        if isinstance(inputs, list | tuple) and all(k == block.clean for k in inputs):
            return {}  # [clean]: the ids, as patching.input passes them
        raise ConfigError(f"data.inputs={list(inputs) if isinstance(inputs, list | tuple) else inputs!r}: a patching run "
                          f"passes its inputs by name; give a mapping such as {{{block.input}: {block.clean}, "
                          f"attention_mask: attention_mask}} (patching.input={block.input!r} takes the clean and "
                          f"corrupted inputs)")
    extra = {}
    for arg, key in inputs.items():
        arg, key = str(arg), str(key)
        if arg == block.input:
            if key not in ids:
                raise ConfigError(f"data.inputs.{arg}={key!r}: patching.input={arg!r} takes the clean and corrupted inputs "
                                  f"(patching.clean={block.clean!r}, patching.corrupt={block.corrupt!r}); map it to "
                                  f"{block.clean!r} or drop it")
        elif key in ids:
            raise ConfigError(f"data.inputs.{arg}={key!r} is the clean or corrupted input, which patching sends to "
                              f"patching.input={block.input!r}; set patching.input={arg}, or map {arg} to another key")
        else:
            extra[arg] = key
    return extra


class ForwardCall:
    """The keyword arguments of a patching forward of `ids` (the items repeated some number of times)."""

    def __init__(self, block: Any, inputs: Any, items: Mapping[str, torch.Tensor]) -> None:
        self.input = block.input
        self.extra = check_inputs(block, inputs)
        self.mask_key = self.extra.get(MASK_KEY)  # the item key every forward's attention_mask comes from (ce reads it)
        self.items = items
        self.n = items[block.clean].shape[0]
        if MASK_KEY in items and MASK_KEY not in self.extra.values() and block.input != MASK_KEY:
            log.warning("patching: the items have an %r that no forward receives, so the model runs unmasked; map it "
                        "with data.inputs {%s: %s, attention_mask: attention_mask} (patch_grid: inputs={...})",
                        MASK_KEY, block.input, block.clean)
        for arg, key in self.extra.items():
            if not isinstance(items.get(key), torch.Tensor):
                raise ConfigError(f"data.inputs.{arg}={key!r}: the items have no tensor {key!r} (their tensors: "
                                  f"{', '.join(map(str, items))}); patching passes each item's tensor to every forward")

    def __call__(self, ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """The forward's own copies (a model may change its inputs in place: x.sub_(mean); the next
        forward must get the items as they are)."""
        copies = ids.shape[0] // self.n
        call = {self.input: ids.clone()}
        for arg, key in self.extra.items():
            call[arg] = repeat_items(self.items[key], copies)
        return call


def repeat_items(x: torch.Tensor, copies: int) -> torch.Tensor:
    """`copies` copies of a batch along its first axis, whatever its rank (token ids, images, masks): new memory."""
    return x.repeat(copies, *[1] * (x.dim() - 1))
