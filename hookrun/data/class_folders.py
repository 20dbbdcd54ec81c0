"""torchvision's ImageFolder over the class folders a person sees: hidden folders (`.ipynb_checkpoints`,
`.DS_Store`'s kin) are not classes, hidden files (`._photo.jpg`) not images. Imported only where data=image_folder finds class folders.

    ds = ClassFolders("photos/", transform=tf)   # photos/cat/*.jpg, photos/dog/*.jpg -> classes cat, dog
"""

from __future__ import annotations

import os
from pathlib import Path

from torchvision import datasets


def visible_folders(root: str | os.PathLike) -> list[str]:
    """The class folders under `root`, sorted as ImageFolder sorts them: the subfolders not hidden."""
    return sorted(p.name for p in Path(root).iterdir() if p.is_dir() and not p.name.startswith("."))


def visible_image(path: str) -> bool:
    """An image file ImageFolder reads (its extensions) that is not hidden: macOS's `._name.jpg` AppleDouble
    files (metadata, not images) stopped the run at their item."""
    return not Path(path).name.startswith(".") and path.lower().endswith(datasets.folder.IMG_EXTENSIONS)


class ClassFolders(datasets.ImageFolder):
    def __init__(self, root: str, transform: object = None) -> None:
        super().__init__(root, transform=transform, is_valid_file=visible_image)

    def find_classes(self, directory: str | os.PathLike) -> tuple[list[str], dict[str, int]]:
        classes = visible_folders(directory)
        return classes, {name: i for i, name in enumerate(classes)}
