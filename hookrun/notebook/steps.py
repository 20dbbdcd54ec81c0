"""The steps of a capture() block: each call of the model given to capture is one step (one batch of a
file run), its captures collected when the next begins.

    steps = Steps(env, cap)
    model.register_forward_pre_hook(steps.begin(session), with_kwargs=True, prepend=True)
    model.register_forward_hook(steps.left, always_call=True)
    env.hold.on_close(steps.direct(model))   # model.forward(...) called directly is a step too

A call begins a step: the step before is collected (its backward included), call counters restart,
and its samples get the next sample indices (inside generate, a new token's call keeps its samples').
A hooked module that runs outside a call of the model is said once in a warning.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch
from torch import nn

from hookrun.hooks.actions import ActionEnv
from hookrun.hooks.session import HookSession
from hookrun.hooks.tokens import continues, token_columns, token_input

log = logging.getLogger(__name__.rsplit(".", 1)[0] + ".capture")


class Steps:
    """Each call of the model is a step: the captures of the one before are collected, the call
    counters restart, and the samples get the next sample indices."""

    def __init__(self, env: ActionEnv, cap: Any) -> None:  # (cap: capture.py's Captured, which holds the steps' rows)
        self.env, self.cap, self.seen = env, cap, 0
        self.inside, self.warned = 0, False  # how deep in calls of the model given to capture

    def left(self, *_: Any) -> None:
        self.inside -= 1

    def direct(self, model: nn.Module) -> Any:
        """`model.forward(...)` called directly (TransformerLens' run_with_hooks does) goes through
        `model(...)`, so that its step begins as a call's does; returns the undo."""
        if hasattr(model, "_orig_mod"):  # (torch.compile's wrapper: its forward is left alone)
            return lambda: None
        own, original = model.__dict__.get("forward"), model.forward

        @functools.wraps(original)  # (its signature: transformers' generate reads which arguments forward takes)
        def forward(*args: Any, **kwargs: Any) -> Any:
            return original(*args, **kwargs) if self.inside else model(*args, **kwargs)

        model.forward = forward

        def undo() -> None:
            if own is None:
                del model.forward
            else:
                model.forward = own

        return undo

    def outside(self, model: nn.Module, name: str):
        def hook(module: nn.Module, args: tuple) -> None:
            if not self.inside and not self.warned:
                self.warned = True
                log.warning("capture: module %r ran outside a call of the model given to capture (%s), so its "
                            "captures share no step with the model's (their rows and shapes are not a run's); call "
                            "that model inside the block, or pass the submodule as the model: hookrun.capture(model.%s, "
                            "...)", name, type(model).__name__, name)

        return hook

    def begin(self, session: HookSession):
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            self.inside += 1
            self.end_step()  # the step before, its backward included
            n = _batch_size(args, kwargs)
            state = self.env.state
            if continues(args, kwargs) and state.sample_index is not None and len(state.sample_index) == n:
                index = state.sample_index  # the next token of the same samples (inside generate)
            else:
                index = torch.arange(self.seen, self.seen + n) if n else None
                self.seen += n
            session.begin_step(self.cap.steps, n, index, attention_mask=_step_mask(args, kwargs), batch=kwargs)  # (as a run's)
            self.cap.steps += 1

        return hook

    def end_step(self) -> None:
        """Collect the step's captures, with its token map where a capture is one row per token."""
        captures = self.env.captures.take()
        self.cap.add(captures, token_columns(captures, self.env.state, with_generated=True))


def _step_mask(args: tuple, kwargs: dict) -> torch.Tensor | None:
    """The call's attention_mask where it covers the call's tokens (tokens.token_input, as a run's
    CallTracker reads them: input_ids, keyword or first positional, else inputs_embeds (batch, tokens,
    width)). Inside generate a later call's mask covers the cache too (batch, past + 1) and is left out."""
    mask, tokens = kwargs.get("attention_mask"), token_input(args, kwargs)
    if not isinstance(mask, torch.Tensor) or tokens is None or mask.dim() != 2 or tokens.dim() < 2:
        return None
    return mask if tuple(mask.shape) == tuple(tokens.shape[:2]) else None


def _batch_size(args: tuple, kwargs: dict) -> int:
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return int(value.shape[0])
    return 0
