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
from hookrun.errors import HookrunError, RunError, foreign_failure
from hookrun.runner.calls import ModelCall
from hookrun.runner.kinds import NOTHING, KindContext, RunKind, StepAdds, register_kind
from hookrun.runner.losses import call_loss, loss_name

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
        with torch.enable_grad():  # (whatever the caller's mode: hookrun.run under a notebook's torch.no_grad())
            return self._step(model, call)

    def _step(self, model: nn.Module, call: ModelCall) -> StepAdds:
        for t in call.tensors():
            if t.is_floating_point():
                t.requires_grad_(True)
        output = call.run(model)
        loss = call_loss(self.loss, self.takes_batch, output, call)
        name = f"loss: {loss_name(self.loss)}(output, target)"
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            got = f"a tensor of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else type(loss).__name__
            raise RunError(f"{name} returned {got}; mode=grad needs a scalar tensor (e.g. a .mean() over the batch)")
        if not loss.requires_grad:  # (backward() would be torch's traceback: 'element 0 of tensors does not require grad')
            raise RunError(f"{name} returned a tensor that does not require grad, so no gradient can reach a hook: "
                           f"compute it from the output with torch operations (no .detach(), .item(), torch.tensor(...), numpy)")
        try:
            loss.backward()
        except RuntimeError as exc:
            if "BackwardHookFunctionBackward" in str(exc):
                raise RunError(IN_PLACE) from None
            if isinstance(exc, HookrunError):  # (an action's own line, from a backward hook)
                raise
            raise foreign_failure(f"{name}: its backward() raised", exc) from exc
        finally:
            model.zero_grad(set_to_none=True)
        return NOTHING


def takes_batch(loss: Any) -> bool:
    """Whether the loss accepts batch= (loss=lm reads input_ids from it)."""
    try:
        return "batch" in inspect.signature(loss).parameters
    except (TypeError, ValueError):
        return False

