"""Every class the run will attribute, checked before any batch where the labels can be read without
loading the items: a bad label in a later batch is then one ConfigError line, not a RunError after
the first batches were attributed and written.

    check_labels(dataset, spec, "label", n=len(dataset), classes=4)   # ConfigError naming the sample

Labels read cheaply (read_labels): an in-memory list or tuple of items (their label, or the item key
`target` names), a TensorDataset's label tensor, torchvision's `targets` (a data set without a
`target_transform`, whose items are (input, label)). Any other data set (items built on access:
files, rendered shapes) is checked batch by batch as it comes (Engine.targets): a bad label stops
the run with one RunError line and the file marked failed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hookrun.errors import ConfigError

W = "attribution"


def check_labels(dataset: Any, spec: Any, target: Any, n: int, classes: int) -> None:
    """Refuse, in one line, a label of the first `n` items that is no class of the model."""
    labels = read_labels(dataset, spec, target, n)
    if labels is None:
        return
    whole = labels == labels.round()
    if not bool(whole.all()):
        i = int((~whole).nonzero()[0, 0])
        raise ConfigError(f"{W}.target={target}: sample {i}'s {labels[i].item():g} is not a class number (a whole "
                          f"number, 0 or more); the attribution is of one class's logit")
    bad = (labels < 0) | (labels >= classes)
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ConfigError(f"{W}.target={target}: class {int(labels[i])} of sample {i} is out of range: the model has "
                          f"{classes} classes (0 to {classes - 1})")


def read_labels(dataset: Any, spec: Any, target: Any, n: int) -> torch.Tensor | None:
    """The first `n` items' labels (float64, one per item), or None where they cannot be read cheaply
    or are not one number per item (the batches' own check says what is wrong with those)."""
    from torch.utils.data import TensorDataset

    from hookrun.runner.calls import AUTO, CallSpec

    if dataset is None or n <= 0 or not isinstance(target, str) or target == "predicted":
        return None
    spec = spec or CallSpec()
    try:
        if isinstance(dataset, list | tuple):
            key = spec.target_key(dataset[0]) if target == "label" else target
            values: Any = None if key is None else [item[key] for item in dataset[:n]]
        elif target != "label":
            return None
        elif isinstance(dataset, TensorDataset):
            key = spec.target_key(tuple(dataset.tensors))
            values = dataset.tensors[key][:n] if isinstance(key, int) and 0 < key < len(dataset.tensors) else None
        else:
            values = getattr(dataset, "targets", None)
            if getattr(dataset, "target_transform", None) is not None or spec.target not in (AUTO, 1) or \
                    not isinstance(values, list | tuple | torch.Tensor | np.ndarray) or len(values) != len(dataset):
                return None
            values = values[:n]
        if values is None:
            return None
        if isinstance(values, list | tuple):
            values = [torch.as_tensor(v) for v in values]
            if any(v.numel() != 1 or v.dtype == torch.bool or v.is_complex() for v in values):
                return None
            values = torch.stack([v.reshape(()).double() for v in values])
        values = torch.as_tensor(values)
    except (KeyError, IndexError, TypeError, ValueError, RuntimeError):
        return None
    if values.dim() > 1 and values.shape[1:].numel() == 1:
        values = values.reshape(-1)
    if values.dim() != 1 or values.dtype == torch.bool or values.is_complex():
        return None
    return values.double()
