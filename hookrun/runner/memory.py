"""What a run costs in memory, measured and configured: shared by the kinds that size their work to a
budget (a kind's cells or rows per forward, and its `memory` key).

    logits, nbytes = measure_bytes(model, lambda: model(x))
    parse_bytes("2GiB", "block.memory")   # -> 2147483648; a ConfigError line naming the key otherwise

measure_bytes on CUDA: the peak allocated during the forward above what was allocated before it.
Elsewhere: the bytes of every tensor a module of the model returned in that forward (the
activations it made).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from hookrun.errors import ConfigError

UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "kib": 1 << 10, "m": 1e6, "mb": 1e6, "mib": 1 << 20, "g": 1e9,
         "gb": 1e9, "gib": 1 << 30, "t": 1e12, "tb": 1e12, "tib": 1 << 40}


def parse_bytes(value: Any, where: str) -> int:
    """1000000, '512MB', '2GiB' -> bytes."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*", str(value))
    if m is None or m.group(2).lower() not in UNITS or float(m.group(1)) <= 0:
        raise ConfigError(f"{where}={value!r}; give bytes as a number or with a unit (512MB, 2GiB)")
    return max(1, int(float(m.group(1)) * UNITS[m.group(2).lower()]))


def measure_bytes(model: nn.Module, run: Callable[[], Any]) -> tuple[Any, int]:
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        out = run()
        torch.cuda.synchronize(device)
        return out, max(1, torch.cuda.max_memory_allocated(device) - before)
    total = [0]

    def count(module: nn.Module, args: Any, output: Any) -> None:
        total[0] += _bytes(output)

    handle = nn.modules.module.register_module_forward_hook(count)
    try:
        out = run()
    finally:
        handle.remove()
    return out, max(1, total[0])


def _bytes(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, tuple | list):
        return sum(_bytes(o) for o in obj)
    return 0
