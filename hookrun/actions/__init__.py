"""Actions: what runs when a hook fires, in the order the config lists them.

    @register_action("my_action")
    class MyAction(Action):
        def __call__(self, ev): ...

Each action is built once per hook point as ``cls(point, hook_type, env, **params)`` and called
with every Event of that point. A user's own action is a `_target_` node instead: any callable
that takes the Event.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from hookrun.captures import StepCaptures
from hookrun.events import Event, StepState
from hookrun.registry import Registry


@dataclass
class ActionEnv:
    """What actions share within a run."""

    captures: StepCaptures = field(default_factory=StepCaptures)
    state: StepState = field(default_factory=StepState)
    store_dtype: torch.dtype | None = None  # None: keep the tensor's dtype


class Action:
    fits: frozenset[str] | None = None  # hook types it may be used with; None: all

    def __init__(self, point: Any, hook_type: Any, env: ActionEnv) -> None:
        self.point = point
        self.hook_type = hook_type
        self.env = env

    def __call__(self, ev: Event) -> None:
        raise NotImplementedError


ACTIONS: Registry[type[Action]] = Registry("action")
register_action = ACTIONS.register

from hookrun.actions import record  # noqa: E402,F401  (registers the built-in actions)
