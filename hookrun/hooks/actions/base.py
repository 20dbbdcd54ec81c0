"""The action base: what every action is given (ActionEnv) and the registry of action names.

    @register_action("my_action")
    class MyAction(Action):
        def __call__(self, ev): ...

Each action is built once per hook point as ``cls(point, hook_type, env, **params)`` and called
with every Event of that point. A user's own action is a `_target_` node instead: any callable
that takes the Event.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from hookrun.hooks.events import Event, StepState
from hookrun.hooks.registry import Registry
from hookrun.store.records import StepCaptures


@dataclass
class ActionEnv:
    """What actions share within a run."""

    captures: StepCaptures = field(default_factory=StepCaptures)
    state: StepState = field(default_factory=StepState)
    store_dtype: torch.dtype | None = None  # None: keep the tensor's dtype
    planned_samples: np.ndarray | None = None  # the dataset indices this run will see
    closers: list[Callable[[], None]] = field(default_factory=list)  # run at the end of the run

    def close(self) -> None:
        while self.closers:
            self.closers.pop()()


class Action:
    fits: frozenset[str] | None = None  # hook types it may be used with; None: all

    def __init__(self, point: Any, hook_type: Any, env: ActionEnv, where: str = "") -> None:
        self.point = point
        self.hook_type = hook_type
        self.env = env
        self.where = where or f"hooks.{point.hook}"

    def __call__(self, ev: Event) -> None:
        raise NotImplementedError


ACTIONS: Registry[type[Action]] = Registry("action")
register_action = ACTIONS.register
