"""Datasets hookrun ships, named by `_target_` in conf/data/ (hookrun.data.synthetic, ...).
They need no download: synthetic images and tensors, and readers of the user's own files."""

from hookrun.data.collate import collate_lists
from hookrun.data.datasets import ImageFiles, RandomTensors, image_folder, synthetic
from hookrun.data.shapes import shapes
from hookrun.data.text import ByteTokenizer, text

__all__ = ["ByteTokenizer", "ImageFiles", "collate_lists", "text", "RandomTensors", "image_folder", "shapes", "synthetic"]
