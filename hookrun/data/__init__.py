"""Datasets hookrun ships, named by `_target_` in conf/data/ (hookrun.data.synthetic, ...).
They need no download: synthetic images and tensors, and readers of the user's own files.

    ds = hookrun.data.synthetic(size=8, image_size=[3, 32, 32])   # imports data/datasets.py only

Each name's module is imported when the name is first used (hookrun/registry.py: lazy_names).
"""

from hookrun.registry import lazy_names

__all__ = ["ByteTokenizer", "ImageFiles", "collate_lists", "text", "RandomTensors", "image_folder", "shapes", "synthetic"]
lazy_names(__name__, {"collate_lists": "collate", "ImageFiles": "datasets", "RandomTensors": "datasets",
                      "image_folder": "datasets", "synthetic": "datasets", "shapes": "shapes",
                      "ByteTokenizer": "text", "text": "text"})
