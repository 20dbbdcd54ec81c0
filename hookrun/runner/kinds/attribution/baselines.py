"""The baseline a batch's inputs are compared with: integrated gradients' start, occlusion's fill,
and what deletion / insertion remove pixels to.

    b = Baselines(block, first_input, dataset, spec); b.of(call, x)    # a tensor of x's shape

| baseline   | what                                                                       |
|------------|----------------------------------------------------------------------------|
| zero       | zeros of the input's shape and dtype                                       |
| mean       | the data set's mean input, from one pass over it when the engine is built  |
| blur       | the input blurred with a gaussian of `sigma` pixels (images)               |
| an item key| that key of each item (same shape as the input)                             |
"""

from __future__ import annotations

import math
from typing import Any

import torch

from hookrun.errors import ConfigError, RunError, close_matches
from hookrun.runner.kinds.attribution.block import Block

W = "attribution.baseline"


class Baselines:
    def __init__(self, block: Block, x: torch.Tensor, dataset: Any = None, spec: Any = None) -> None:
        self.kind, self.sigma = block.baseline, block.sigma
        self.mean = None
        if self.kind in ("mean", "blur") and not x.is_floating_point():
            raise ConfigError(f"{W}={self.kind}: the attributed input is {str(x.dtype).replace('torch.', '')} (token "
                              f"ids?); use zero (token id 0) or an item key")
        if self.kind == "blur" and x.dim() != 4:
            raise ConfigError(f"{W}=blur: blurs images (sample, channel, height, width); the input has shape "
                              f"{list(x.shape)}; use zero, mean or an item key")
        if self.kind == "mean":
            self.mean = mean_input(dataset, spec, x)

    def of(self, call: Any, x: torch.Tensor, first: bool = False) -> torch.Tensor:
        if self.kind == "zero":
            return torch.zeros_like(x)
        if self.kind == "mean":
            return self.mean.to(x.device, x.dtype).expand_as(x).contiguous()
        if self.kind == "blur":
            from torchvision.transforms.functional import gaussian_blur

            size = 2 * math.ceil(3 * self.sigma) + 1
            size = min(size, 2 * ((min(x.shape[-2:]) - 1) // 2) + 1)  # odd, and at most the image
            return gaussian_blur(x, [size, size], [self.sigma, self.sigma])
        err = ConfigError if first else RunError
        batch = call.batch
        if not isinstance(batch, dict) or self.kind not in batch:
            keys = [str(k) for k in batch] if isinstance(batch, dict) else []
            hint = close_matches(self.kind, keys, n=1)
            raise err(f"{W}={self.kind!r}: not zero, mean or blur, and the items have no key {self.kind!r}"
                      f"{f'; did you mean {hint[0]}?' if hint else ''} (their keys: {', '.join(keys) or 'none'})")
        value = torch.as_tensor(batch[self.kind]).to(x.device)
        if value.shape != x.shape:
            raise err(f"{W}={self.kind!r}: the baseline's shape {list(value.shape)[1:]} differs from the input's "
                      f"{list(x.shape)[1:]} (per item); give a baseline of the input's shape")
        return value.to(x.dtype)


def mean_input(dataset: Any, spec: Any, x: torch.Tensor) -> torch.Tensor:
    """The data set's mean input (one pass, in float64): what `baseline: mean` starts from."""
    from hookrun.runner.calls import CallSpec
    from hookrun.runner.kinds.attribution.forward import Forward

    if dataset is None:
        raise ConfigError(f"{W}=mean: needs the data set")
    spec = spec or CallSpec()
    loader = torch.utils.data.DataLoader(dataset, batch_size=64)
    total, n = None, 0
    for batch in loader:
        inp = Forward(torch.nn.Identity(), spec.split(batch)).input.double()
        total = inp.sum(0) if total is None else total + inp.sum(0)
        n += inp.shape[0]
    return (total / n).to(x.dtype)[None]
