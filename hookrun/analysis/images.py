"""Samples as pictures: a batch of inputs as images, and maps resized to them.

    pictures = as_pictures(batch, norm)         # (n, C, H, W) -> [H x W x 3 in [0, 1]], Normalize undone
    norm = normalization(dataset)               # its Normalize's mean and std, or None (hookrun/data/__init__.py)
    maps = fit_maps(maps, pictures[0].shape[:2])   # (n, h, w) -> (n, H, W), bilinear
    rows = map_rows(run, info, n)               # a map capture's first n rows, (n, C, H, W) even where stored channels last

Grad-CAM's and the kinds' maps (plot and report alike) are resized here, once.
"""

from __future__ import annotations

import numpy as np


def channels_last(info: object) -> bool:
    """Whether a capture's rows are channels-last maps: its dims `sample, height, width, channel` (timm's
    Swin, a Linear inside a ConvNeXt block; docs/format.md)."""
    return tuple(getattr(info, "dims", None) or ())[1:] == ("height", "width", "channel")


def map_rows(run: object, info: object, n: int, dtype: type = np.float64) -> np.ndarray:
    """A map capture's first n rows as (n, C, H, W): a channels-last capture turned channels first, as
    every picture of maps (feature maps, Grad-CAM, a map's channels under top examples) reads them."""
    rows = np.asarray(run.file[info.path][:n], dtype=dtype)
    return rows.transpose(0, 3, 1, 2) if channels_last(info) else rows


MIN_MAX = "input min-max scaled per image (its normalisation not recorded)"  # (said in a title where as_pictures guessed)


def guessed(batch: np.ndarray, norm: dict | None) -> bool:
    """Whether as_pictures min-max scales values that are no pixels in [0, 1] (a normalised input
    whose mean and std the file lacks): a title then says MIN_MAX."""
    return norm is None and bool(np.size(batch)) and (float(np.min(batch)) < 0 or float(np.max(batch)) > 1)


def as_pictures(batch: np.ndarray, norm: dict | None = None) -> list[np.ndarray]:
    """(n, C, H, W) with C 1 or 3 -> H x W x 3 images in [0, 1]: the data set's Normalize undone
    exactly where `norm` ({"mean": [...], "std": [...]}, one per channel) is known, each image
    min-max scaled on its own otherwise (one scale over its channels: a normalised photo's colours cast)."""
    out = []
    undo = norm is not None and len(norm["mean"]) == len(norm["std"]) and len(norm["mean"]) in (1, np.shape(batch)[1])
    for x in np.asarray(batch, dtype=np.float64):
        if undo:
            x = np.clip(x * np.asarray(norm["std"])[:, None, None] + np.asarray(norm["mean"])[:, None, None], 0, 1)
        x = np.moveaxis(x, 0, -1)
        x = x if undo else (x - x.min()) / max(float(x.max() - x.min()), 1e-8)
        out.append(x if x.shape[-1] == 3 else np.repeat(x, 3, axis=-1))
    return out


def fit_maps(maps: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """(n, h, w) maps resized to the pictures' (H, W), bilinear (unchanged where they fit already); a
    cell with no value (NaN, inf) covers its own area, NaN."""
    if tuple(maps.shape[-2:]) == tuple(size):
        return maps
    import torch
    import torch.nn.functional as F

    bad = ~np.isfinite(maps)  # a NaN or inf cell stays one cell of no value (bilinear would spread it to its neighbours)
    out = F.interpolate(torch.from_numpy(np.ascontiguousarray(np.where(bad, 0, maps)))[:, None], size=tuple(size), mode="bilinear",
                        align_corners=False)[:, 0].numpy()
    if bad.any():
        out[F.interpolate(torch.from_numpy(bad.astype(np.float32))[:, None], size=tuple(size), mode="nearest")[:, 0].numpy() > 0] = np.nan
    return out
