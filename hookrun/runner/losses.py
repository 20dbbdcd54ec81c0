"""Losses for mode=grad: callables (output, target) -> scalar.

    loss: {_target_: hookrun.runner.losses.cross_entropy, _partial_: true}
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hookrun.errors import RunError


def _need_target(target: torch.Tensor | None, name: str) -> torch.Tensor:
    if target is None:
        raise RunError(f"loss={name} needs a target, but the dataset returns no (input, target) tuple; use loss=sum")
    return target


def cross_entropy(output: torch.Tensor, target: torch.Tensor | None) -> torch.Tensor:
    """Mean cross entropy over the batch."""
    return F.cross_entropy(output, _need_target(target, "cross_entropy").long())


def sum_output(output: torch.Tensor, target: torch.Tensor | None = None) -> torch.Tensor:
    """The sum of every output element: each gradient is then d(sum)/d(x)."""
    return output.sum()


def target_logit(output: torch.Tensor, target: torch.Tensor | None) -> torch.Tensor:
    """The sum over the batch of each sample's logit at its target class (as Grad-CAM uses)."""
    target = _need_target(target, "target_logit").long()
    return output.gather(1, target.view(-1, 1)).sum()
