"""The hook session: attaches every planned hook, dispatches firings to actions, removes all.

    with HookSession(points, env) as session:
        session.begin_step(step, batch_size, sample_index)
        model(x)  # hooks fire; actions run

Every RemovableHandle is owned here and removed in reverse order when the block ends, on an
exception too, so no hook outlives the run. What only some runs need is loaded where they need it:
a user's action watched and an action's failure (hooks/action_faults.py), the early_stop probe's
muted step (hooks/early_stop.py), an encoder-decoder's decoder tokens (hooks/sides.py).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import torch

from hookrun.errors import PASSED, HookrunError, module_label
from hookrun.hooks import HOOK_TYPES, INTERVENED, Event, Fire, HookPoint, Phase, StopForward
from hookrun.hooks.actions import ActionEnv

__all__ = ["HookSession", "StopForward", "warn_never_fired"]
log = logging.getLogger("hookrun")


class HookSession:
    def __init__(self, points: list[HookPoint], env: ActionEnv, early_stop: bool = False) -> None:
        self.points = points
        self.env = env
        self.early_stop = None  # (hooks/early_stop.py, loaded only under early_stop=true)
        if early_stop:
            from hookrun.hooks.early_stop import EarlyStop

            self.early_stop = EarlyStop()
        self.fired = [0] * len(points)  # firings of each point over the run
        self.interceptor = None  # op sites' calls (hooks/sites.py: made only where a point is a site)
        self._handles: list = []

    def __enter__(self) -> HookSession:
        decoder = None
        try:
            for i, point in sorted(enumerate(self.points), key=_grad_last):
                if point.site is not None:  # an op site: the interceptor fires it (hooks/sites.py)
                    fn, call = point.site
                    if self.interceptor is None:
                        from hookrun.hooks.sites import Interceptor

                        self.interceptor = Interceptor(self.env.model)
                    self._handles.extend(self.interceptor.add(point.target, fn, call, point, self._firing(point, i)))
                    continue
                self._handles.extend(HOOK_TYPES.get(point.type).attach(point, self._firing(point, i)))
            if self.points and getattr(getattr(self.env.model, "config", None), "is_encoder_decoder", False):
                from hookrun.hooks.sides import (  # (an encoder-decoder model alone needs it)
                    Decoder,
                    decoder_calls,
                )

                decoder = Decoder.of(self.env.model)
            if decoder is not None:  # (after the points' hooks: one at the decoder itself sees its tokens)
                self._handles.extend(decoder.attach(*decoder_calls(self.env.state)))
            self.env.hold.on_close(self.remove)  # the run's one owner removes them too, if this session is never exited
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def remove(self) -> None:
        if self.early_stop is not None:
            self.early_stop.close()
        while self._handles:
            self._handles.pop().remove()
        self.env.hold.forget(self.remove)

    def begin_step(self, step: int, batch_size: int, sample_index: torch.Tensor | None,
                   attention_mask: torch.Tensor | None = None, batch: Any = None) -> None:
        state = self.env.state
        state.step, state.batch_size, state.sample_index = step, batch_size, sample_index
        state.batch = batch
        state.attention_mask = attention_mask
        state.first_map, state.calls = _first_map, None  # the batch's TokenMap, made when first asked for (a
        # CallTracker replaces it at each model call)
        for point in self.points:
            point.reset()
        if self.early_stop is not None:
            self.early_stop.begin_step(step)

    def end_step(self) -> None:
        """Under early_stop: the first step notes where to stop; later ones are checked against it."""
        if self.early_stop is not None:
            self.early_stop.end_step()

    def probe(self, sample_index: torch.Tensor, attention_mask: torch.Tensor | None = None,
              model: torch.nn.Module | None = None, batch: Any = None) -> AbstractContextManager[None]:
        """A step that only fires the hooks (every action muted, nothing recorded, no firing
        counted): early_stop learns from it where to cut, so batch 0 is cut too. Given the `model`,
        the probe stops itself once past every hooked module (early_stop.probe_guard).

            with session.probe(index, model=model):
                model(first_sample)
        """
        from hookrun.hooks.early_stop import probe_step

        return probe_step(self, sample_index, attention_mask, model, batch)

    @contextmanager
    def phase(self, phase: Phase) -> Iterator[None]:
        """One of a run kind's forwards of the batch in flight (hookrun.hooks.Phase: CLEAN,
        INTERVENED, ABLATED): the points' call counters restart (at the block's start and end), and
        the phase's flags say which actions run: in a clean forward none (the hooks stay attached:
        a check of one attribute is cheaper than detaching); in an ablated one only the modifying
        actions, returning the ablation (actions/modify.py).

            with session.phase(CLEAN):
                clean = model(x)
        """
        state = self.env.state
        for point in self.points:
            point.reset()
        state.phase = phase
        try:
            yield
        finally:
            state.phase = INTERVENED
            for point in self.points:  # a forward after the block counts its calls from 0 again
                point.reset()

    def never_fired(self) -> list[HookPoint]:
        """The points whose hook has not fired once in this session (a module that never ran)."""
        return [p for p, n in zip(self.points, self.fired, strict=True) if not n]


    def _firing(self, point: HookPoint, i: int) -> Fire:
        """The point's fire(call, tensors, writable): what it needs is bound once, here, so that a
        firing touches as few objects as it can (a hook fires 10^5-10^7 times in a run)."""
        hook, kind, module, target, actions, state = point.hook, point.type, point.module, point.target, point.actions, self.env.state
        at_firing = self.early_stop.at_firing if self.early_stop is not None else None
        fired = self.fired
        session = self
        watched: dict[int, Any] = {}  # id(action) -> None, or what watches its firings (a user's action)
        captures = self.env.captures

        def watch(action: Any) -> Any:  # (hooks/action_faults.py: loaded, and bound, where a user's action fires)
            watcher = None
            if user_code(action):
                from hookrun.hooks.action_faults import user_action as watcher
            watched[id(action)] = watcher
            return watcher

        def fire(call: int, tensors: dict, writable: str, raw=None, module: str = module) -> Event:
            ev = Event(hook, kind, module, target, call, state, tensors, writable, raw)
            phase = state.phase
            sites = session.interceptor  # (op sites: the actions' own torch calls are no module's, hooks/sites.py)
            hushed = sites is not None and sites.hush()
            action = None
            try:
                if not phase.every:  # a run kind's other forward (phase()): a clean one, an ablated one
                    if phase.modifying:
                        for action in actions:
                            if action.modifies:
                                action(ev)
                    return ev
                fired[i] += 1
                for action in actions:
                    watcher = watched.get(id(action), watch)
                    if watcher is watch:
                        watcher = watch(action)
                    if watcher is not None:  # (a user's action: its firings are watched)
                        watcher(action, ev, captures)
                    else:
                        action(ev)
            except (HookrunError, StopForward, *PASSED):
                raise
            except BaseException as exc:  # a user's action (or a bug in one of hookrun's): named, not the model
                from hookrun.hooks.action_faults import action_failure

                raise action_failure(action, ev, exc) from exc
            finally:
                if hushed:
                    sites.unhush()
            if at_firing is not None:
                at_firing(point, call)
            return ev

        return fire


def user_code(action: Any) -> bool:
    """An action of a user's (a registered class of theirs, or a `_target_` callable): not hookrun's own."""
    fn = getattr(action, "fn", None) if type(action).__name__ == "Callback" else action
    return not type(fn).__module__.startswith("hookrun.") if fn is not None else False


def _first_map(attention_mask: torch.Tensor | None) -> Any:
    """A step's first TokenMap, of its batch's attention mask (hooks/tokens.py, loaded when a step asks)."""
    from hookrun.hooks.tokens import TokenMap

    return TokenMap.of_batch(attention_mask)


def _grad_last(item: tuple[int, HookPoint]) -> bool:
    """Gradient hooks on modules attach after the others, as PyTorch sets up its own full backward
    hooks after a module's forward hooks: their gradients are those of the output the rest of the
    model sees (after a modify_output) and of the input the module got (after a replace_input),
    whatever the order of the hooks in the config."""
    point = item[1]
    return point.site is None and HOOK_TYPES.get(point.type).needs_grad


def warn_never_fired(hook: str, module: str, where: str = "in any batch", then: str = "so the file has no capture from it",
                     needs_grad: bool = False) -> None:
    """The one warning for a hook that never fired (a file run's end report, hookrun.capture's end);
    a hook type that fires in backward (`needs_grad`) also says that no backward() may have reached it."""
    why = ", or no backward() reached it (under no_grad, or no backward() called)" if needs_grad else ""
    log.warning("hook %r never fired: module %r did not run %s%s (%s)", hook, module_label(module), where, why, then)


def warn_cast(overflow: dict[tuple, int], underflow: dict[tuple, int]) -> None:
    """The warnings for values the record dtype's cast turned into inf or 0, per capture (hook, module,
    role, call): a file run's end report and hookrun.capture's end say them alike."""
    for (hook, module, role, call), n in sorted(overflow.items()):
        log.warning("hook %r at %s: %d value(s) of %s%s became inf when stored as the record dtype "
                    "(they exceed its range); record in float32, or set check_finite=true to stop at the first",
                    hook, module_label(module), n, role, f"@{call}" if call else "")
    for (hook, module, role, call), n in sorted(underflow.items()):
        log.warning("hook %r at %s: %d nonzero value(s) of %s%s became 0 when stored as the record dtype "
                    "(below its smallest magnitude: float16's is 6e-8, a small gradient's scale); record in "
                    "float32, or bfloat16 (float32's range, fewer digits)", hook, module_label(module), n, role,
                    f"@{call}" if call else "")
