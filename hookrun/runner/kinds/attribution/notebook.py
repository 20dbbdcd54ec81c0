"""hookrun.attribute: an attribution block's rows over a data set, in memory, for notebooks.

    rows = hookrun.attribute(model, dataset, method="integrated_gradients", steps=32, batch_size=16)
    rows["attribution"].shape     # (len(dataset), channels, height, width): a numpy array
    rows["target"], rows["prob"], rows["delta"]     # one value per sample

The same block, engine and checks as a file run (`attribution:`): only where the rows go differs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from torch import nn

from hookrun.errors import ConfigError
from hookrun.hooks.actions import ModelHold
from hookrun.runner.calls import CallSpec
from hookrun.runner.kinds.attribution.block import parse_block
from hookrun.runner.kinds.attribution.engine import Engine


def attribute(model: nn.Module, dataset: Any, batch_size: int = 16, inputs: Any = None, target_key: Any = "auto",
              **block: Any) -> dict[str, np.ndarray]:
    """Attribute every sample of `dataset` (map-style: tensors, tuples or dicts, as a file run's data).

    Args:
        model: the classifier (or language model); it comes back in the mode it went in.
        dataset: the samples, batched `batch_size` at a time in order.
        inputs, target_key: `data.inputs` and `data.target` of a file run (which item parts are the
            model's inputs, which the label).
        **block: the keys of the `attribution:` block (method, at, target, baseline, steps, rule,
            window, strides, composite, low, high, relu, sigma, memory, measure).

    Returns:
        {"attribution": (n, ...), "target", "logit", "prob": (n,), "delta" (integrated gradients),
        "deletion" / "insertion": (n, N + 1) and their "..._area" (measure)}: numpy arrays, one row per sample.

    Raises:
        ConfigError: a bad block or a bad input, one line, before any batch.
    """
    import torch

    if not isinstance(model, nn.Module):
        raise ConfigError(f"attribute: expected a torch.nn.Module, got {type(model).__name__}")
    # numpy's and torch's scalars (np.int64(2), torch.tensor(2)) as the plain numbers a config holds
    b = parse_block({k: v.item() if getattr(v, "ndim", None) == 0 and hasattr(v, "item") else v for k, v in block.items()})
    if isinstance(batch_size, bool) or not isinstance(batch_size, int | np.integer) or batch_size < 1:
        raise ConfigError(f"attribute: batch_size must be a whole number of at least 1 (data.batch_size of a file run), "
                          f"got {batch_size!r}")
    from hookrun.config.build import check_dataset

    if len(check_dataset(dataset, "attribute: got")) == 0:
        raise ConfigError("attribute: the data set is empty")
    spec = CallSpec(inputs, target_key)
    spec.check(dataset[0])
    loader = torch.utils.data.DataLoader(dataset, batch_size=int(batch_size), shuffle=False)
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    # each module's flags, devices and grads come back as they were (a model of mixed modes too), and
    # a caller's torch.inference_mode() is left outside: the engine takes gradients
    with torch.inference_mode(False), ModelHold(model):
        model.eval()
        batches = iter(loader)
        first = spec.split(next(batches)).to(device)
        engine = Engine(model, b, first, dataset, spec)
        parts: dict[str, list[np.ndarray]] = {}
        call = first
        while call is not None:
            for k, v in engine.batch(call).items():
                parts.setdefault(k, []).append(v.detach().cpu().numpy())
            nxt = next(batches, None)
            call = spec.split(nxt).to(device) if nxt is not None else None
    return {k: np.concatenate(v) for k, v in parts.items()}
