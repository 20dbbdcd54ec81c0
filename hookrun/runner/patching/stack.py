"""The model's stack of blocks, and running only the blocks at and above a patched one.

    stack = BlockStack.find(model)            # TL `blocks`, GPT-2 `transformer.h`; None: no stack
    stack.level("blocks.2.attn.hook_z")       # 2 (a module after the stack: len(stack))
    stack.keep_outputs(model_run)             # the base run's output of every block
    with stack.skip_below(2, copies=8):       # blocks 0, 1 return their kept outputs (8 copies)
        model(x)

The stack is the largest nn.ModuleList whose children are all of one class. Below the lowest
patched block the packed forward would recompute what the base run computed: each of those
blocks' forward is replaced, for the forward, by its kept output repeated for the copies.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn


class BlockStack:
    def __init__(self, prefix: str, blocks: nn.ModuleList, order: list[str]) -> None:
        self.prefix, self.blocks = prefix, blocks
        self.after = {n for n in order[order.index(f"{prefix}.{len(blocks) - 1}"):] if not n.startswith(f"{prefix}.")}
        self.kept: list[Any] = []

    @classmethod
    def find(cls, model: nn.Module) -> BlockStack | None:
        best, size = None, 0
        for name, m in model.named_modules():
            if isinstance(m, nn.ModuleList) and len(m) > 1 and name and len({type(c) for c in m}) == 1:
                n = sum(p.numel() for p in m.parameters())
                if n > size:
                    best, size = (name, m), n
        if best is None:
            return None
        return cls(best[0], best[1], [n for n, _ in model.named_modules()])

    def __len__(self) -> int:
        return len(self.blocks)

    def level(self, module: str) -> int:
        """The block a module (or op site MODULE/FN) belongs to; modules before the stack 0, after it len."""
        name = module.split("/")[0]
        if name.startswith(self.prefix + "."):
            return int(name[len(self.prefix) + 1:].split(".")[0])
        return len(self.blocks) if name in self.after else 0

    def keep_outputs(self, run: Callable[[], Any]) -> Any:
        """Run the base forward, keeping each block's output (detached)."""
        kept: list[Any] = [None] * len(self.blocks)

        def hook(i: int) -> Callable:
            def fn(module: nn.Module, args: Any, out: Any) -> None:
                kept[i] = _map(out, lambda t: t.detach())
            return fn

        handles = [b.register_forward_hook(hook(i)) for i, b in enumerate(self.blocks)]
        try:
            result = run()
        finally:
            for h in handles:
                h.remove()
        self.kept = kept
        return result

    @contextmanager
    def skip_below(self, level: int, copies: int) -> Iterator[None]:
        """Blocks below `level` return their kept output, repeated `copies` times along the batch."""
        level = min(level, len(self.blocks))
        if not self.kept or any(k is None for k in self.kept[:level]):
            yield
            return
        swapped = []
        try:
            for i in range(level):
                out = _map(self.kept[i], lambda t: t.repeat(copies, *[1] * (t.dim() - 1)))
                self.blocks[i].forward = lambda *a, _out=out, **k: _out
                swapped.append(self.blocks[i])
            yield
        finally:
            for b in swapped:
                del b.forward


def _map(obj: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple | list):
        return type(obj)(_map(o, fn) for o in obj)
    return obj
