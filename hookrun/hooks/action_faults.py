"""What an action gets wrong, said in one line naming it: a user's action watched as it fires (a
capture that shares the hooked tensor's memory copied, a change in place it does not declare refused),
and an action that raised. Loaded where a user's action fires, or an action fails (HookSession).

    user_action(action, ev, captures)        # HookSession's firing of a user's action
    raise action_failure(action, ev, exc)    # RunError: hooks.h.actions.0: action my_fn failed at layer1 ...
"""

from __future__ import annotations

from typing import Any

import torch

from hookrun.errors import RunError, foreign_failure
from hookrun.hooks import Event
from hookrun.hooks.roles import tensor_version
from hookrun.store.records import StepCaptures


def action_name(action: Any) -> str:
    """The action's `name:` in the config, or a `_target_` action's function name."""
    from hookrun.hooks.actions import ACTIONS

    return ACTIONS.name_of(type(action)) or getattr(action, "name", None) or type(action).__name__


def user_action(action: Any, ev: Event, captures: StepCaptures) -> None:
    """A user's action, watched: a capture it added that holds the hooked tensor's memory (no .clone()) is
    copied now, before the model goes on (a ReLU(inplace=True) after the module would change the rows the
    writer stores later); and where it does not declare `modifies`, a change it made to one of its
    tensors in place (x.div_(...)), which the model computes on from there while every check (early_stop,
    resume, a kind's clean forward) treats the action as one that only reads, is refused, naming it."""
    before = [(role, t, tensor_version(t)) for role, t in ev.tensors.items() if isinstance(t, torch.Tensor)]
    had = captures.count()
    action(ev)
    captures.copy_shared(had, {t.untyped_storage().data_ptr() for _, t, _ in before})
    for role, t, version in before if not action.modifies else ():
        if version >= 0 and tensor_version(t) != version:
            raise RunError(f"{getattr(action, 'where', f'hooks.{ev.hook}')}: action {action_name(action)} changed the {role} of "
                           f"{ev.where} in place, but does not declare modifies = True, so the model went on with the "
                           f"changed values unannounced; change a copy (x = x.clone()), or declare modifies = True and "
                           f"give the new tensor with ev.replace(role, new)")


def action_failure(action: Any, ev: Event, exc: BaseException) -> RunError:
    """An action's own exception as one line naming the hook, the action (its `name:`) and where it
    fired; model_forward would otherwise say the model's forward failed."""
    where = getattr(action, "where", f"hooks.{ev.hook}")
    return foreign_failure(f"{where}: action {action_name(action)} failed at {ev.where} ({ev.type} hook, batch {ev.step}):", exc)
