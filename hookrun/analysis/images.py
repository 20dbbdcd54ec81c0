"""Samples as pictures: a batch of inputs as images, and maps resized to them.

    pictures = as_pictures(batch)               # (n, C, H, W) -> [H x W x 3 in [0, 1]]
    maps = fit_maps(maps, pictures[0].shape[:2])   # (n, h, w) -> (n, H, W), bilinear

Grad-CAM's and the kinds' maps (plot and report alike) are resized here, once.
"""

from __future__ import annotations

import numpy as np


def as_pictures(batch: np.ndarray) -> list[np.ndarray]:
    """(n, C, H, W) with C 1 or 3 -> H x W x 3 images in [0, 1], each scaled on its own."""
    out = []
    for x in np.asarray(batch, dtype=np.float64):
        x = np.moveaxis(x, 0, -1)
        x = (x - x.min()) / max(float(x.max() - x.min()), 1e-8)
        out.append(x if x.shape[-1] == 3 else np.repeat(x, 3, axis=-1))
    return out


def fit_maps(maps: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """(n, h, w) maps resized to the pictures' (H, W), bilinear (unchanged where they fit already)."""
    if tuple(maps.shape[-2:]) == tuple(size):
        return maps
    import torch
    import torch.nn.functional as F

    return F.interpolate(torch.from_numpy(np.ascontiguousarray(maps))[:, None], size=tuple(size), mode="bilinear",
                         align_corners=False)[:, 0].numpy()
