"""The model as captum calls it: the attributed input first, the call's other batched tensors after it,
the target's logits out.

    f = Forward(model, call)          # call: a batch's ModelCall (runner/calls.py)
    logits = f(f.input, *f.extras)    # (n, classes): a token model's last position

`f.watch = x` keeps the logits of the first call on that very tensor (`f.seen`): the methods' own
forward of the unperturbed inputs gives the model's logits without a forward of their own.
The attributed input is the call's first positional tensor, else its `input_ids` keyword, else its
first tensor keyword. The other tensors whose first axis is the batch's go to captum as
`additional_forward_args`, so that it repeats them with the interpolation steps and occluded copies.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hookrun.errors import ConfigError


class Forward:
    def __init__(self, model: nn.Module, call: Any) -> None:
        self.model = model
        args, kwargs = list(call.args), dict(call.kwargs)
        if args and isinstance(args[0], torch.Tensor):
            self.slot: int | str = 0
        else:
            names = [k for k, v in kwargs.items() if isinstance(v, torch.Tensor)]
            if not names:
                raise ConfigError(f"attribution: the forward call ({call.describe()}) passes no tensor to attribute to")
            self.slot = "input_ids" if "input_ids" in names else names[0]
        self.input = args[0] if self.slot == 0 else kwargs[self.slot]
        n = self.input.shape[0] if self.input.dim() else 0
        batched = lambda v: isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == n  # noqa: E731
        self.places = [i for i, v in enumerate(args) if i != self.slot and batched(v)]
        self.places += [k for k, v in kwargs.items() if k != self.slot and batched(v)]
        self.extras = tuple(args[p] if isinstance(p, int) else kwargs[p] for p in self.places)
        self.args, self.kwargs = args, kwargs
        self.watch: torch.Tensor | None = None  # the batch's own input: its logits are kept when captum runs it
        self.seen: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor, *extras: torch.Tensor) -> torch.Tensor:
        args, kwargs = list(self.args), dict(self.kwargs)
        for place, value in ((self.slot, x), *zip(self.places, extras, strict=True)):
            if isinstance(place, int):
                args[place] = value
            else:
                kwargs[place] = value
        logits = logits_of(self.model(*args, **kwargs))
        if x is self.watch and self.seen is None:  # captum's own forward of the inputs (occlusion's first, IG's delta)
            self.seen = logits.detach()
        return logits


def logits_of(out: Any) -> torch.Tensor:
    """The classes' logits of a model's output: a tensor (n, classes); `.logits` or the first item of a
    tuple; a sequence's (n, positions, classes) at its last position."""
    if not isinstance(out, torch.Tensor):
        out = getattr(out, "logits", None) if not isinstance(out, tuple | list) else out[0]
    if not isinstance(out, torch.Tensor) or out.dim() not in (2, 3):
        raise ConfigError("attribution: the model's output is not logits (n, classes) or (n, positions, classes); "
                          "attribution needs a classifier's or a language model's logits")
    return out[:, -1] if out.dim() == 3 else out
