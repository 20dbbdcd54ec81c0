"""Forward hooks at a model's `at` modules, each output pooled to one row of features per item.

    taps = Taps(model, ["layer1", "layer2"], "similarity.at", pool="mean")
    with taps.attached(call.attention_mask):
        model(x)
    taps.take()      # [(rows, features) tensors], in the modules' order

pool: flatten (every value of an item's output is a feature) or mean (over the space of a feature
map (rows, channels, ...), over the tokens of (rows, tokens, features): padding never enters).
A module's output with no feature axis (one value per item) is refused.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from hookrun.errors import ConfigError, RunError
from hookrun.hooks.plan import resolve_targets


class Taps:
    def __init__(self, model: nn.Module, patterns: list[str], where: str, pool: str) -> None:
        self.targets = resolve_targets(model, patterns, hook="similarity", where=where)
        self.names = [name for name, _ in self.targets]
        self.where, self.pool = where, pool
        self.out: dict[str, torch.Tensor] = {}

    @contextmanager
    def attached(self, mask: torch.Tensor | None) -> Iterator[None]:
        """The hooks on for one forward; every handle removed after it, also when it fails."""
        handles = []
        self.out = {}
        try:
            for name, module in self.targets:
                handles.append(module.register_forward_hook(self._hook(name, mask)))
            yield
        finally:
            for h in reversed(handles):
                h.remove()

    def _hook(self, name: str, mask: torch.Tensor | None) -> Any:
        def hook(module: nn.Module, inputs: Any, output: Any) -> None:
            if name in self.out:
                raise RunError(f"{self.where}: {name} ran twice in one forward (a shared module); name a module "
                               f"that runs once per forward")
            self.out[name] = pool(first_tensor(output), self.pool, mask, f"{self.where}: {name}")

        return hook

    def take(self) -> list[torch.Tensor]:
        missing = [n for n in self.names if n not in self.out]
        if missing:
            raise ConfigError(f"{self.where}: {missing[0]} did not run in the model's forward; name a module "
                              f"the forward calls (python -m hookrun.modules lists them)")
        return [self.out[n] for n in self.names]


def first_tensor(output: Any) -> torch.Tensor | None:
    """A module's output, or the first tensor of a tuple / list / dict (a transformer block's)."""
    if isinstance(output, torch.Tensor):
        return output
    values = output.values() if isinstance(output, dict) else output if isinstance(output, tuple | list) else ()
    return next((v for v in values if isinstance(v, torch.Tensor)), None)


def pool(t: torch.Tensor | None, how: str, mask: torch.Tensor | None, where: str) -> torch.Tensor:
    """(rows, ...) -> (rows, features): flattened, or averaged over space / the real tokens (float64); always
    new memory, made in the hook: the forward may change a module's output in place once its hooks have
    returned (conv -> ReLU(inplace=True)), and the rows are the output the hook saw."""
    if t is None or t.dim() < 2 or not t.is_floating_point():
        shape = "no tensor" if t is None else f"shape {tuple(t.shape)} {t.dtype}"
        raise ConfigError(f"{where} gives {shape}: no feature axis (one value per item, or no floating "
                          f"tensor); name a module whose output has features per item")
    t = t.detach()
    tokens = mask is not None and t.dim() == 3 and mask.dim() == 2 and tuple(mask.shape) == tuple(t.shape[:2])
    if how == "flatten":
        if tokens and not bool(mask.bool().all()):
            raise ConfigError(f"{where}: pool=flatten over token rows with padding would make the padding features; "
                           f"use similarity.pool=mean (padding left out), or batches without padding")
        return t.reshape(len(t), -1).clone()  # (a copy: the forward may change its output in place after the hook)
    if t.dim() == 2:
        return t.to(torch.float64, copy=True)
    t = t.to(torch.float64)
    if tokens:
        m = mask.to(device=t.device, dtype=torch.float64).unsqueeze(-1)
        return (t * m).sum(dim=1) / m.sum(dim=1).clamp_min(1.0)
    return t.mean(dim=1) if t.dim() == 3 else t.flatten(2).mean(dim=2)
