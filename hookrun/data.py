"""Datasets that need no download, the image-folder reader, and the batch plumbing of the loop.

    ds = synthetic(size=64)                # FakeData images, fixed per index
    ds = image_folder("photos/")           # ImageFolder layout or a flat folder, ImageNet transform
    loader = make_loader(ds, batch_size=16, num_workers=0)  # yields (indices, batch)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from hookrun.errors import ConfigError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm"}


def synthetic(size: int = 64, image_size: tuple = (3, 224, 224), num_classes: int = 1000, seed: int = 0) -> Dataset:
    """Random RGB images with random labels, the same for an index on every call (FakeData)."""
    from torchvision import datasets, transforms

    return datasets.FakeData(
        size=size, image_size=tuple(image_size), num_classes=num_classes,
        transform=transforms.ToTensor(), random_offset=seed,
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


class ImageFiles(Dataset):
    """Every image file directly in `root`, sorted by name; items are tensors (no target)."""

    def __init__(self, root: str, transform: Any = None) -> None:
        self.root = Path(root)
        self.samples = [(str(p), -1) for p in sorted(self.root.iterdir()) if p.suffix.lower() in IMAGE_SUFFIXES]
        self.transform = transform

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> torch.Tensor:
        from PIL import Image

        with Image.open(self.samples[i][0]) as img:
            img = img.convert("RGB")
            return self.transform(img) if self.transform else img


def image_folder(root: str | None, resize: int = 256, crop: int = 224) -> Dataset:
    """Real images with the standard ImageNet resize, centre crop and normalisation.

    `root` in torchvision's ImageFolder layout (one subfolder per class) gives (image, class)
    items; a flat folder of images gives images alone.
    """
    from torchvision import datasets, transforms

    if not root:
        raise ConfigError("data.root is not set; data=image_folder needs data.root=PATH (a folder of images)")
    path = Path(root)
    if not path.is_dir():
        raise ConfigError(f"data.root: {root!r} is not a folder")
    tf = transforms.Compose([
        transforms.Resize(resize), transforms.CenterCrop(crop), transforms.ToTensor(),
        transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
    ])
    if any(p.is_dir() for p in path.iterdir()):
        return datasets.ImageFolder(str(path), transform=tf)
    files = ImageFiles(str(path), transform=tf)
    if not len(files):
        raise ConfigError(f"data.root: {root!r} holds no images ({', '.join(sorted(IMAGE_SUFFIXES))})")
    return files


class Indexed(Dataset):
    """Wraps a dataset so each item comes with its index: the loader yields (indices, batch).
    `start` skips the first items (a resumed run); the indices stay the dataset's own."""

    def __init__(self, dataset: Dataset, start: int = 0) -> None:
        self.dataset = dataset
        self.start = start

    def __len__(self) -> int:
        return max(0, len(self.dataset) - self.start)

    def __getitem__(self, i: int) -> tuple[int, Any]:
        return self.start + i, self.dataset[self.start + i]


def check_item(item: Any) -> None:
    """A dataset item must be a tensor or a tuple (input, target, ...) whose input is a tensor."""
    first = item[0] if isinstance(item, tuple | list) and len(item) else item
    if not isinstance(first, torch.Tensor):
        got = type(item).__name__ + (f" whose first element is a {type(first).__name__}" if first is not item else "")
        raise ConfigError(
            f"data.dataset: an item is a {got}; hookrun needs a tensor or a tuple (input, target, ...) "
            f"with a tensor input (add a transform such as torchvision.transforms.ToTensor)"
        )


def make_loader(dataset: Dataset, batch_size: int, num_workers: int, start: int = 0) -> DataLoader:
    if batch_size < 1:
        raise ConfigError(f"data.batch_size must be at least 1, got {batch_size}")
    if num_workers < 0:
        raise ConfigError(f"data.num_workers must be 0 or more, got {num_workers}")
    return DataLoader(Indexed(dataset, start), batch_size=batch_size, shuffle=False, num_workers=num_workers)


def split_batch(batch: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(input, target) of a collated batch; target is None where items carry none."""
    if isinstance(batch, torch.Tensor):
        return batch, None
    inputs = batch[0]
    target = batch[1] if len(batch) > 1 and isinstance(batch[1], torch.Tensor) else None
    return inputs, target


def sample_paths(dataset: Dataset, indices: list[int]) -> list[str] | None:
    """The file path of each sample, where the dataset keeps them (ImageFolder's `samples`)."""
    samples = getattr(dataset, "samples", None)
    if not isinstance(samples, list | tuple) or not samples:
        return None
    first = samples[0]
    if isinstance(first, tuple | list) and first and isinstance(first[0], str):
        return [samples[i][0] for i in indices]
    if isinstance(first, str):
        return [samples[i] for i in indices]
    return None
