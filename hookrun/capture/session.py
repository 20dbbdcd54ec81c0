"""The hook session: attaches every planned hook, dispatches firings to actions, removes all.

    with HookSession(points, env) as session:
        session.begin_step(step, batch_size, sample_index)
        model(x)  # hooks fire; actions run

Every RemovableHandle is owned here and removed in reverse order when the block ends, on an
exception too, so no hook outlives the run.
"""

from __future__ import annotations

import torch

from hookrun.capture.actions import ActionEnv
from hookrun.capture.events import Event
from hookrun.capture.hooks import HOOK_TYPES, Fire
from hookrun.capture.plan import HookPoint


class StopForward(Exception):
    """Raised by the last hook of a step under early_stop: the rest of the forward is skipped."""


class HookSession:
    def __init__(self, points: list[HookPoint], env: ActionEnv, early_stop: bool = False) -> None:
        self.points = points
        self.env = env
        self.early_stop = early_stop
        self._handles: list = []
        self._last: tuple[HookPoint, int] | None = None  # the latest firing of the first step
        self._stop_at: tuple[HookPoint, int] | None = None  # early_stop: the step's last firing

    def __enter__(self) -> HookSession:
        try:
            for point in self.points:
                self._handles.extend(HOOK_TYPES.get(point.type).attach(point, self._firing(point)))
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def remove(self) -> None:
        while self._handles:
            self._handles.pop().remove()

    def begin_step(self, step: int, batch_size: int, sample_index: torch.Tensor | None,
                   attention_mask: torch.Tensor | None = None) -> None:
        state = self.env.state
        state.step, state.batch_size, state.sample_index = step, batch_size, sample_index
        state.attention_mask, state.token_map = attention_mask, None
        for point in self.points:
            point.reset()

    def end_step(self) -> None:
        """After the first full step, remember its last firing: later steps stop right after it
        (early_stop assumes the hooked modules run in the same order in every batch)."""
        if self.early_stop and self._stop_at is None:
            self._stop_at = self._last

    def _firing(self, point: HookPoint) -> Fire:
        """The point's fire(call, tensors, writable): what it needs is bound once, here, so that a
        firing touches as few objects as it can (a hook fires 10^5-10^7 times in a run)."""
        hook, kind, name, target, actions, state = point.hook, point.type, point.name, point.target, point.actions, self.env.state
        at_firing = self._at_firing if self.early_stop else None

        def fire(call: int, tensors: dict, writable: str, raw=None) -> Event:
            ev = Event(hook, kind, name, target, call, state, tensors, writable, raw)
            for action in actions:
                action(ev)
            if at_firing is not None:
                at_firing(point, call)
            return ev

        return fire

    def _at_firing(self, point: HookPoint, call: int) -> None:
        if self._stop_at is None:
            self._last = (point, call)
        elif self._stop_at[0] is point and self._stop_at[1] == call:
            raise StopForward
