"""Real images from a folder (`data=image_folder data.root=PATH`), with the standard ImageNet resize,
centre crop and normalisation; imported when hookrun.data.image_folder is first used.

    ds = hookrun.data.image_folder("photos/")   # photos/cat/*.jpg -> (image, class); a flat folder -> images
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from hookrun.data import IMAGENET_MEAN, IMAGENET_STD, whole
from hookrun.errors import ConfigError

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm"}


class ImageFiles(Dataset):
    """Every image file directly in `root`, sorted by name; items are tensors (no target)."""

    def __init__(self, root: str, transform: Any = None) -> None:
        self.root = Path(root)
        self.samples = [(str(p), -1) for p in sorted(self.root.iterdir())  # (hidden `._x.jpg`: macOS metadata)
                        if p.suffix.lower() in IMAGE_SUFFIXES and not p.name.startswith(".")]
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
    from torchvision import transforms

    from hookrun.data.class_folders import ClassFolders, visible_folders

    if not root:
        raise ConfigError("data.root is not set; data=image_folder needs data.root=PATH (a folder of images)")
    path = Path(root)
    if not path.is_dir():
        raise ConfigError(f"data.root: {root!r} is not a folder")
    sides = list(resize) if isinstance(resize, list | tuple) and len(resize) == 2 else [resize]
    for side in sides:
        whole("resize", side, 1)
    if min(sides) < whole("crop", crop, 1):  # (CenterCrop pads a smaller image with zeros: black borders, no word)
        raise ConfigError(f"data.dataset.crop={crop} is larger than data.dataset.resize={resize} (the resized image's "
                          f"shorter side): the centre crop would pad it with black borders; give crop <= resize")
    tf = transforms.Compose([
        transforms.Resize(resize), transforms.CenterCrop(crop), transforms.ToTensor(),
        transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
    ])
    folders = visible_folders(path)  # (hidden ones are no class)
    if folders:
        loose = sorted(p.name for p in path.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES
                       and not p.name.startswith("."))
        if loose:
            raise ConfigError(
                f"data.root: {root!r} holds class folders ({', '.join(folders[:3])}{', ...' if len(folders) > 3 else ''}) "
                f"and {len(loose)} image(s) beside them ({', '.join(loose[:3])}{', ...' if len(loose) > 3 else ''}), which "
                f"the class-folder layout does not read; move them into a class folder, or give a folder of images alone")
        return ClassFolders(str(path), transform=tf)
    files = ImageFiles(str(path), transform=tf)
    if not len(files):
        raise ConfigError(f"data.root: {root!r} holds no images ({', '.join(sorted(IMAGE_SUFFIXES))})")
    return files
