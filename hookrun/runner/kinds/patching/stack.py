"""The model's stack of blocks, and running only the blocks at and above a patched one.

    stack = BlockStack.find(model)            # TL `blocks`, GPT-2 `transformer.h`; None: no stack
    stack.keep_outputs(model_run)             # the base run: every block's output, the modules' order
    stack.level("blocks.2.attn.hook_z")       # 2 (a module that runs after the stack: len(stack))
    with stack.skip_below(2, copies=8):       # blocks 0, 1 return their kept outputs (8 copies)
        model(x)

The stack is the largest nn.ModuleList whose children are all of one class. Below the lowest
patched block the packed forward would recompute what the base run computed: each of those
blocks' call is replaced, for the forward, by its kept output repeated for the copies: the output
the base run's call returned after the block's hooks (hookrun's, a user's own, global ones), so the
skipped block runs no hook again (`returning`).

What runs before and after the stack is the order modules run in the base run (observed by
keep_outputs), never the order they were registered in (`self.blocks = ...; self.embed = ...`
registers the embedding after the blocks though it runs first). A module is after the stack when
every call of it starts after the last block's call ended; every other module outside the stack
is level 0 (no block skipped). Where the order cannot be established (no base run observed, a
block that runs twice or not at all, blocks that do not run one after another in their order) the
skip is off: every forward runs every block.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn


class BlockStack:
    def __init__(self, prefix: str, blocks: nn.ModuleList, model: nn.Module) -> None:
        self.prefix, self.blocks, self.model = prefix, blocks, model
        self.after: set[str] = set()
        self.kept: list[Any] = []
        self.ordered = False  # the base run showed the blocks running once each, in order

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
        return cls(best[0], best[1], model)

    def __len__(self) -> int:
        return len(self.blocks)

    def level(self, module: str) -> int:
        """The block a module (or op site MODULE/FN) belongs to; modules before the stack 0, after it len."""
        name = module.split("/")[0]
        if name.startswith(self.prefix + "."):
            return int(name[len(self.prefix) + 1:].split(".")[0])
        return len(self.blocks) if name in self.after else 0

    def keep_outputs(self, run: Callable[[], Any], watch: Iterable[str] | None = None) -> Any:
        """Run the base forward, keeping each block's output (a detached copy) and the order the blocks and the
        modules of `watch` (the sites' modules; None: every module) start and end their calls in
        (what is before and after the stack)."""
        kept: list[Any] = [None] * len(self.blocks)
        calls: dict[str, list[list[int]]] = {}  # module -> [start, end] of each call, in a forward-wide count
        clock = [0]

        def tick() -> int:
            clock[0] += 1
            return clock[0]

        def pre(name: str) -> Callable:
            def fn(module: nn.Module, args: Any) -> None:
                calls.setdefault(name, []).append([tick(), 0])
            return fn

        def post(name: str, i: int | None) -> Callable:
            def fn(module: nn.Module, args: Any, out: Any) -> None:
                open_calls = [c for c in calls.get(name, []) if not c[1]]
                if open_calls:
                    open_calls[-1][1] = tick()
                if i is not None:  # a copy: a block after it may change the tensor in place (x += f(x))
                    kept[i] = _map(out, lambda t: t.detach().clone())
            return fn

        index = {id(b): i for i, b in enumerate(self.blocks)}
        handles = []
        wanted = None if watch is None else {n.split("/")[0] for n in watch} | {f"{self.prefix}.{i}" for i in range(len(self.blocks))}
        for name, m in self.model.named_modules():
            if name and (wanted is None or name in wanted):
                handles.append(m.register_forward_pre_hook(pre(name)))
                handles.append(m.register_forward_hook(post(name, index.get(id(m)))))
        try:
            result = run()
        finally:
            for h in handles:
                h.remove()
        self.kept = kept
        self.ordered, self.after = self._order(calls)
        return result

    def _order(self, calls: dict[str, list[list[int]]]) -> tuple[bool, set[str]]:
        """(whether the blocks ran once each, one after another in order; the modules after the stack)."""
        spans = [calls.get(f"{self.prefix}.{i}", []) for i in range(len(self.blocks))]
        if any(len(s) != 1 or not s[0][1] for s in spans):
            return False, set()
        if any(spans[i + 1][0][0] < spans[i][0][1] for i in range(len(spans) - 1)):
            return False, set()
        end = spans[-1][0][1]
        inside = f"{self.prefix}."
        after = {n for n, cs in calls.items() if not n.startswith(inside) and n != self.prefix and all(c[0] > end for c in cs)}
        return True, after

    @contextmanager
    def skip_below(self, level: int, copies: int) -> Iterator[None]:
        """Blocks below `level` return their kept output, repeated `copies` times along the batch."""
        level = min(level, len(self.blocks))
        if not self.ordered or not self.kept or any(k is None for k in self.kept[:level]):
            yield
            return
        with returning([(self.blocks[i], _map(self.kept[i], lambda t: t.repeat(copies, *[1] * (t.dim() - 1))))
                        for i in range(level)]):
            yield


@contextmanager
def returning(pairs: Iterable[tuple[nn.Module, Any]]) -> Iterator[None]:
    """Each (module, value): a call of the module returns the value, running neither its forward nor
    any of its hooks (its own, with_kwargs ones, global ones): the value is what a whole call returned,
    after its hooks, so they must not apply again (a splice, a user's forward hook). The call itself
    is replaced on the instance (nn.Module.__call__ goes through self._call_impl, or a compiled
    module's _compiled_call_impl, set aside meanwhile)."""
    swapped = []
    try:
        for module, value in pairs:
            swapped.append((module, module._compiled_call_impl))
            module._compiled_call_impl = None
            module._call_impl = lambda *a, _value=value, **k: _value
        yield
    finally:
        for module, compiled in swapped:
            del module._call_impl
            module._compiled_call_impl = compiled


def _map(obj: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple | list):
        return type(obj)(_map(o, fn) for o in obj)
    return obj
