"""The grad kind (mode=grad): forward, loss and backward per batch (no optimizer step).

    kind = GradKind(ctx)          # ctx.loss: the built loss (loss=cross_entropy, loss=lm, ...)
    kind.step(model, call, session)   # forward and backward hooks fire; gradients are zeroed after

The batch's floating-point inputs require grad (input gradients reach backward hooks); a loss
that takes `batch=` gets the batch too (loss=lm reads input_ids from it).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn

from hookrun.config.schema import Mode
from hookrun.errors import RunError
from hookrun.runner.calls import ModelCall
from hookrun.runner.kinds import register_kind
from hookrun.runner.kinds.run_kind import NOTHING, KindContext, RunKind, StepAdds
from hookrun.runner.losses import call_loss

IN_PLACE = ("a backward hook's module has its output modified in place later in the forward pass "
            "(e.g. `out += identity` in a ResNet block), which full backward hooks cannot follow; "
            "hook the enclosing block instead, or use type: tensor on the same module")


@register_kind("grad")
class GradKind(RunKind):
    mode = Mode.grad
    uses_loss = True

    def __init__(self, ctx: KindContext) -> None:
        super().__init__(ctx)
        self.loss = ctx.loss
        self.takes_batch = takes_batch(self.loss)

    def step(self, model: nn.Module, call: ModelCall, session: Any) -> StepAdds:
        for t in call.tensors():
            if t.is_floating_point():
                t.requires_grad_(True)
        output = call.run(model)
        loss = call_loss(self.loss, self.takes_batch, output, call)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise RunError(f"loss: expected a scalar tensor, got {type(loss).__name__} {getattr(loss, 'shape', '')}")
        try:
            loss.backward()
        except RuntimeError as exc:
            if "BackwardHookFunctionBackward" in str(exc):
                raise RunError(IN_PLACE) from None
            raise
        finally:
            model.zero_grad(set_to_none=True)
        return NOTHING


def takes_batch(loss: Any) -> bool:
    """Whether the loss accepts batch= (loss=lm reads input_ids from it)."""
    try:
        return "batch" in inspect.signature(loss).parameters
    except (TypeError, ValueError):
        return False

