"""Datasets hookrun ships, named by `_target_` in conf/data/ (hookrun.data.synthetic, ...).
They need no download: synthetic images and tensors, and readers of the user's own files.

    ds = hookrun.data.synthetic(size=64)              # FakeData images, fixed per index
    ds = hookrun.data.image_folder("photos/")         # ImageFolder layout or a flat folder, ImageNet transform
    ds = hookrun.data.text(files=["notes.txt"])       # imports data/text.py only

The synthetic data and the helpers every data set shares (`whole`, `normalization`) are here; the
others' modules (the image-folder reader's image_folder.py, text.py, ...) are imported when the name
is first used (hookrun/errors.py: lazy_names).
"""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

from hookrun.errors import ConfigError, lazy_names

__all__ = ["ByteTokenizer", "ImageFiles", "collate_lists", "text", "RandomTensors", "image_folder", "shapes", "synthetic"]
lazy_names(__name__, {"collate_lists": "collate", "shapes": "shapes", "ByteTokenizer": "text", "text": "text",
                      "ImageFiles": "image_folder", "image_folder": "image_folder"})

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def whole(name: str, value: object, low: int) -> int:
    """data.dataset.`name` as a whole number >= `low`, or one line naming it (the data sets' own errors were
    tracebacks: FakeData's '__len__() should return >= 0', numpy's 'scale < 0')."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"data.dataset.{name}: expected a whole number >= {low}, got {value!r}")
    return value


def synthetic(size: int = 64, image_size: tuple = (3, 224, 224), num_classes: int = 1000, seed: int = 0) -> Dataset:
    """Random RGB images with random labels, the same for an index on every call (FakeData). Item i is
    drawn from torch seed `(seed * 0x9E3779B1 + i) mod 2**32` (the CPU generator keeps 32 bits): another
    seed is another draw, far along the seeds (FakeData's own offset only shifts the index: seed 1's item i
    was seed 0's item i + 1). Seed 0 is FakeData's."""
    from torchvision import datasets, transforms

    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise ConfigError(f"data.dataset.seed: expected a whole number from 0 to {2**32 - 1}, got {seed!r}")
    whole("size", size, 1)
    whole("num_classes", num_classes, 1)
    if not isinstance(image_size, list | tuple) or len(image_size) != 3 or \
            not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in image_size):
        raise ConfigError(f"data.dataset.image_size: expected [channels, height, width], whole numbers >= 1, got {image_size!r}")
    return datasets.FakeData(
        size=size, image_size=tuple(image_size), num_classes=num_classes,
        transform=transforms.ToTensor(), random_offset=seed * 0x9E3779B1 % 2**32,
    )


class RandomTensors(Dataset):
    """`n` tensors of `shape` (standard normal) with integer labels, fixed by `seed`."""

    def __init__(self, n: int = 64, shape: tuple = (16,), num_classes: int = 10, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, *shape, generator=g)
        self.y = torch.randint(0, num_classes, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


def normalization(dataset: object) -> dict | None:
    """{"mean", "std"} of the torchvision Normalize in a data set's transform (a Compose's too, a
    Subset's data set's), or None: the run writes it (root attribute `input_normalize`) for as_pictures."""
    for _ in range(4):
        tf = getattr(dataset, "transform", None)
        for t in [tf, *getattr(tf, "transforms", [])]:
            if type(t).__name__ == "Normalize" and hasattr(t, "mean") and hasattr(t, "std"):
                mean, std = torch.broadcast_tensors(*(torch.atleast_1d(torch.as_tensor(v, dtype=torch.float64)) for v in (t.mean, t.std)))
                return {"mean": mean.tolist(), "std": std.tolist()}
        dataset = getattr(dataset, "dataset", None)
        if dataset is None:
            return None
    return None
