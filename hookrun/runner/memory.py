"""What a run costs in memory, measured and configured: shared by the kinds that size their work to a
budget (a kind's cells or rows per forward, and its `memory` key).

    logits, nbytes = measure_bytes(model, lambda: model(x))
    (a `memory` key's bytes: hookrun.errors.parse_bytes, every size key's one parser)

measure_bytes on CUDA: the peak allocated during the forward above what was allocated before it.
Elsewhere: the bytes of every tensor a module of the model returned in that forward (the
activations it made).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn


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
