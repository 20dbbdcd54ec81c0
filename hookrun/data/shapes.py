"""Generated shapes: small grey images of a circle, square, triangle or cross at a random place.

    ds = shapes(size=256)            # ds[i] -> (image (1, 32, 32) float32 in [0, 1], label 0..3)
    SHAPES[ds[0][1]]                 # 'circle', 'square', 'triangle' or 'cross'

Drawn with numpy from the index alone (seed + index), so every install makes the same images
with nothing to download: the data model=tiny_cnn was trained on (examples/train_tiny_cnn.py)
and the images of experiment=shapes_gradcam. A little noise is added so no pixel is exactly flat.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Dataset

from hookrun.data import whole
from hookrun.errors import ConfigError

SHAPES = ("circle", "square", "triangle", "cross")


def draw(kind: int, cx: float, cy: float, r: float, n: int) -> np.ndarray:
    """One shape of half-size `r` centred on (cx, cy) in an n x n image, 1 inside and 0 outside."""
    y, x = np.mgrid[0:n, 0:n].astype(np.float64) + 0.5
    dx, dy = x - cx, y - cy
    if kind == 0:
        return (dx**2 + dy**2 <= r**2).astype(np.float32)
    if kind == 1:
        return ((np.abs(dx) <= r * 0.85) & (np.abs(dy) <= r * 0.85)).astype(np.float32)
    if kind == 2:  # apex up: inside the base and both slanted sides
        return ((dy <= r * 0.8) & (dy >= -r) & (np.abs(dx) <= (dy + r) * 0.6)).astype(np.float32)
    w = max(1.0, r * 0.3)
    return (((np.abs(dx) <= w) & (np.abs(dy) <= r)) | ((np.abs(dy) <= w) & (np.abs(dx) <= r))).astype(np.float32)


class Shapes(Dataset):
    """`size` images of `image_size` pixels, each the same for its index on every call."""

    classes = SHAPES  # the class names, as torchvision's data sets name theirs

    def __init__(self, size: int = 256, image_size: int = 32, seed: int = 0, noise: float = 0.05) -> None:
        self.size, self.n, self.seed, self.noise = int(size), int(image_size), int(seed), float(noise)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if not 0 <= i < self.size:
            raise IndexError(f"shapes: index {i} out of range 0..{self.size - 1}")
        rng = np.random.default_rng([self.seed, i])
        kind = int(rng.integers(len(SHAPES)))
        r = float(rng.uniform(0.16, 0.26)) * self.n
        cx, cy = rng.uniform(r + 1, self.n - r - 1, size=2)
        image = draw(kind, cx, cy, r, self.n) * float(rng.uniform(0.7, 1.0))
        image = np.clip(image + rng.normal(0, self.noise, image.shape), 0, 1).astype(np.float32)
        return torch.from_numpy(image)[None], kind


def shapes(size: int = 256, image_size: int = 32, seed: int = 0, noise: float = 0.05) -> Dataset:
    """The generated shapes dataset (see the module docstring)."""
    whole("size", size, 1)
    whole("image_size", image_size, 8)
    whole("seed", seed, 0)
    if isinstance(noise, bool) or not isinstance(noise, int | float) or not noise >= 0:
        raise ConfigError(f"data.dataset.noise: expected a standard deviation >= 0, got {noise!r}")
    return Shapes(size, image_size, seed, noise)
