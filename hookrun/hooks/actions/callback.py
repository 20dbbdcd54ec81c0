"""A user's own action given as a `_target_` node: any callable that takes the Event, wrapped as an
Action (hookrun.hooks.actions), reading the same declarations from the callable's attributes
(`fn.records = True`). Loaded where a hook's actions name one (make_plan).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hookrun.hooks import Event
from hookrun.hooks.actions import Action, ActionEnv

if TYPE_CHECKING:
    from hookrun.hooks import HookPoint, HookType


class Callback(Action):
    """A user's `_target_` action: any callable taking the Event, with its declarations (records,
    modifies, positions, check_mode, reset, restore) read from the callable where it has them."""

    def __init__(self, fn: Callable[[Event], Any], point: HookPoint, hook_type: HookType, env: ActionEnv,
                 where: str = "") -> None:
        super().__init__(point, hook_type, env, where)
        self.fn = fn
        inner = getattr(fn, "func", None)  # (`_partial_: true` built a functools.partial: the function declares)
        for name in ("records", "modifies", "positions"):
            for source in (fn, inner):
                if hasattr(source, name):
                    setattr(self, name, getattr(source, name))
                    break
        for name in ("check_mode", "reset", "restore", "check_item", "check_tensor", "state", "load_state", "finish"):
            if callable(getattr(fn, name, None)):
                setattr(self, name, getattr(fn, name))

    @property
    def name(self) -> str:
        """The callable's name in messages (a partial's function's)."""
        fn = getattr(self.fn, "func", self.fn)
        return getattr(fn, "__qualname__", type(fn).__name__)

    def __call__(self, ev: Event) -> None:
        self.fn(ev)
