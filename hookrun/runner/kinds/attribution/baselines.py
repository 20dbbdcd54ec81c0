"""The baseline a batch's inputs are compared with: integrated gradients' start, occlusion's fill,
and what deletion / insertion remove pixels to.

    b = Baselines(block, first_input, dataset, spec); b.of(call, x)    # a tensor of x's shape

| baseline   | what                                                                       |
|------------|----------------------------------------------------------------------------|
| zero       | zeros of the input's shape and dtype                                       |
| mean       | the data set's mean input, from one pass over it when the engine is built  |
| blur       | the input blurred with a gaussian of `sigma` pixels (images)               |
| an item key| that key of each item (same shape as the input)                             |

Deletion and insertion curves (curves, below; Petsiuk et al. 2018, RISE): how fast the target's
probability falls as the most important pixels are set to the baseline, and rises as they are put back.
`rows = curves(f, x, baseline, target, attribution, {"deletion": 16, "insertion": 16}, rows_per_forward)`:
rows["deletion"] (n, 17) is the target's probability after removing k/16 of the pixels, k = 0..16;
rows["deletion_area"] (n,) the trapezoid rule's area under it over [0, 1]. Each sample's pixels (or
positions of a sequence: token ids are set to the baseline's ids, or features) are ranked by the
attribution summed over channels (features), largest first, ties in pixel order; a layer's map is
first resized to the input's (bilinear). Step k of N sets the first k*P//N of the P pixels to the
baseline (every channel) for deletion; insertion starts from the baseline and puts the same pixels
back. The masked inputs of every step share forwards, `rows_per_forward` at a time.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from hookrun.errors import ConfigError, HookrunError, RunError, close_matches
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
    try:
        for batch in loader:
            inp = Forward(torch.nn.Identity(), spec.split(batch)).input.double()
            total = inp.sum(0) if total is None else total + inp.sum(0)
            n += inp.shape[0]
    except HookrunError:
        raise
    except Exception as exc:  # an item that raises: one line, as the run's own batches say it (data_errors.data_failure)
        from hookrun.runner.data_errors import data_failure

        hint = f" (the dataset's len() is {len(dataset)}: does it have that many items?)" if isinstance(exc, IndexError) else ""
        raise data_failure(exc, f"{W}=mean: reading the data set's items {n}..{min(n + 64, len(dataset)) - 1} for its mean input failed:",
                           hint) from exc
    return (total / n).to(x.dtype)[None]


def scores(attr: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """(n, P): each sample's pixel (position, feature) scores, the attribution summed over channels."""
    if x.dim() == 4:
        s = attr.sum(1, keepdim=True)
        if s.shape[-2:] != x.shape[-2:]:
            s = F.interpolate(s.float(), size=x.shape[-2:], mode="bilinear", align_corners=False)
        return s.flatten(1)
    if x.dim() == 3 or (x.dim() == 2 and attr.dim() == 3):  # a sequence's positions (token ids: their embeddings')
        return attr.sum(-1)
    return attr.reshape(x.shape[0], -1)


def measurable(attr_shape: tuple[int, ...], x: torch.Tensor) -> bool:
    """Whether an attribution of this shape ranks x's pixels as `scores` does: an image's map has
    spatial axes (resized to the input's), a sequence's has the input's positions, anything else
    has one score per input element."""
    if x.dim() == 4:
        return len(attr_shape) == 4
    if x.dim() == 3 or (x.dim() == 2 and len(attr_shape) == 3):
        return len(attr_shape) == 3 and attr_shape[1] == x.shape[1]
    return math.prod(attr_shape[1:]) == math.prod(pixel_shape(x))


def masks(s: torch.Tensor, steps: int) -> torch.Tensor:
    """(n, steps + 1, P) booleans: the pixels removed (or put back) after each step."""
    n, p = s.shape
    order = torch.argsort(s, dim=1, descending=True, stable=True)
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(p, device=s.device).expand(n, p))
    counts = torch.tensor([k * p // steps for k in range(steps + 1)], device=s.device)
    return rank[:, None, :] < counts[None, :, None]


def random_scores(s: torch.Tensor) -> torch.Tensor:
    """Scores that order each sample's pixels at random: the reference curve every reader of a
    deletion or insertion curve looks for (a seeded generator per batch, so a resumed run and each
    rank draw the same orders)."""
    g = torch.Generator(device="cpu").manual_seed(0)
    return torch.rand(s.shape, generator=g, dtype=torch.float64).to(s.device)


def curves(f: Any, x: torch.Tensor, baseline: torch.Tensor, target: torch.Tensor, attr: torch.Tensor,
           measure: dict[str, int], rows_per_forward: int) -> dict[str, torch.Tensor]:
    """The target's probability as the most important pixels are removed (deletion) or put back
    (insertion), step by step, and the same with the pixels in a random order (`..._random`)."""
    s = scores(attr, x)
    jobs = []
    for name, steps in measure.items():
        jobs.append((name, name, steps, masks(s, steps)))
        jobs.append((f"{name}_random", name, steps, masks(random_scores(s), steps)))
    out = {}
    for name, way, steps, m in jobs:
        n, k1, _ = m.shape
        probs = torch.empty(n * k1, dtype=torch.float64, device=x.device)
        flat = m.reshape(n * k1, -1)
        for start in range(0, n * k1, rows_per_forward):
            rows = torch.arange(start, min(start + rows_per_forward, n * k1), device=x.device)
            i = rows // k1
            mask = flat[rows].reshape(len(rows), *pixel_shape(x)).to(x.dtype)
            removed, kept = (baseline[i], x[i]) if way == "deletion" else (x[i], baseline[i])
            inputs = kept * (1 - mask) + removed * mask
            with torch.no_grad():
                logits = f(inputs, *(e[i] for e in f.extras))
            probs[rows] = torch.softmax(logits.double(), 1).gather(1, target[i][:, None])[:, 0]
        curve = probs.reshape(n, k1)
        out[name] = curve
        out[f"{name}_area"] = ((curve[:, 1:] + curve[:, :-1]) / 2).sum(1) / steps
    return out


def pixel_shape(x: torch.Tensor) -> tuple[int, ...]:
    """How a row's pixel mask broadcasts over one input: images (1, h, w), sequences (t, 1), else as is."""
    if x.dim() == 4:
        return (1, *x.shape[-2:])
    if x.dim() == 3:
        return (x.shape[1], 1)
    return tuple(x.shape[1:])
