"""A caller's live model comes back as it went in: `run(cfg, model=m)` borrows it.

    with borrowed(model):
        ...   # the run puts it in eval mode, turns off inplace=True in grad mode, moves it, hooks it

What a run changes on a model it was handed is put back on the way out, on an exception too:
every module's training flag and `inplace` flag, each parameter's and buffer's device and
requires_grad, and each parameter's .grad. Hooks are the session's and are removed by it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn


@contextmanager
def borrowed(model: nn.Module | None) -> Iterator[None]:
    if not isinstance(model, nn.Module):
        yield
        return
    modes = [(m, m.training, getattr(m, "inplace", None)) for m in model.modules()]
    params = [(p, p.device, p.requires_grad, p.grad) for p in model.parameters()]
    buffers = [(b, b.device) for b in model.buffers()]
    try:
        yield
    finally:
        for m, training, inplace in modes:
            m.training = training
            if inplace is not None:
                m.inplace = inplace
        for p, device, requires_grad, grad in params:
            if p.device != device:
                p.data = p.data.to(device)
            p.requires_grad_(requires_grad)
            p.grad = grad
        for b, device in buffers:
            if b.device != device:
                b.data = b.data.to(device)

