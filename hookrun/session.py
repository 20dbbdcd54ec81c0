"""The hook session: attaches every planned hook, dispatches firings to actions, removes all.

    with HookSession(points, env) as session:
        session.begin_step(step, batch_size, sample_index)
        model(x)  # hooks fire; actions run

Every RemovableHandle is owned here and removed in reverse order when the block ends, on an
exception too, so no hook outlives the run.
"""

from __future__ import annotations

import torch

from hookrun.actions import ActionEnv
from hookrun.events import Event
from hookrun.hooks import HOOK_TYPES
from hookrun.plan import HookPoint


class HookSession:
    def __init__(self, points: list[HookPoint], env: ActionEnv) -> None:
        self.points = points
        self.env = env
        self._handles: list = []

    def __enter__(self) -> HookSession:
        try:
            for point in self.points:
                self._handles.extend(HOOK_TYPES.get(point.type).attach(point, self._fire))
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def remove(self) -> None:
        while self._handles:
            self._handles.pop().remove()

    def begin_step(self, step: int, batch_size: int, sample_index: torch.Tensor | None) -> None:
        state = self.env.state
        state.step, state.batch_size, state.sample_index = step, batch_size, sample_index
        for point in self.points:
            point.reset()

    def _fire(self, point: HookPoint, call: int, tensors: dict, writable: str) -> Event:
        ev = Event(
            hook=point.hook,
            type=point.type,
            module=point.name,
            target=point.target,
            call=call,
            state=self.env.state,
            tensors=tensors,
            writable=writable,
        )
        for action in point.actions:
            action(ev)
        return ev
