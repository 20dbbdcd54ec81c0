"""Actions over a run: their look at their tensor before any batch, their state on resume, their end.
Loaded only where a run has such an action (record with a select, top_examples, a lens) or resumes.

    check_tensors(tensor_checked(points), forward)   # prepare(): each action's look at its tensor, listening to `forward` (run once)
    restore_states(env, old_file, kept, store)   # resume: the state saved with the kept batches
    finish_actions(env, store)                   # a complete run: the actions' end-of-run captures

An action declares what it needs (hookrun.hooks.actions): `check_item(item)` sees the
dataset's first item (prepare() asks it), `check_tensor(role, tensor)` the tensor its hook sees in one sample's
forward (run with plain forward hooks, nothing of the run's attached; an action whose `what` names
a tensor that forward did not give is refused here); `state()` is saved at each
flush (store/run_state.py) and handed back to `load_state()` on resume; `finish()` returns the
captures written when the run completes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import h5py
import torch

from hookrun.errors import ConfigError
from hookrun.hooks import HookPoint, flatten
from hookrun.hooks.actions import ActionEnv
from hookrun.store.records import RunStore


def check_tensors(checked: list[tuple[HookPoint, Any]], run_one: Callable[[], Any]) -> None:
    """`run_one()` (one sample's forward, which the site and splice checks listen to as well) with a
    plain hook on each module whose action checks its tensor (a width, an axis: prepare's
    `tensor_checked`); then the checks. prepare() composes it onto the one forward of the checks
    before the first batch."""
    seen: dict[int, dict] = {}

    def keep(key: int, pre: bool) -> Callable:
        if pre:
            def hook(module, args, kwargs) -> None:
                seen.setdefault(key, {**flatten(args, "input"), **{f"input.{k}": v for k, v in kwargs.items()}})
            return hook

        def hook(module, args, out) -> None:
            seen.setdefault(key, flatten(out, "output"))
        return hook

    handles = []
    try:
        for p, _ in checked:
            pre = p.type == "forward_pre"
            handles.append(p.target.register_forward_pre_hook(keep(id(p), True), with_kwargs=True) if pre
                           else p.target.register_forward_hook(keep(id(p), False)))
        run_one()
    finally:
        for h in handles:
            h.remove()
    for p, a in checked:
        roles = seen.get(id(p))
        what = getattr(a, "what", None)  # (lens, top_examples: the tensor `what` names, or its .0)
        if roles is not None and isinstance(what, str) and what and \
                not any(isinstance(roles.get(r), torch.Tensor) for r in (what, f"{what}.0")):
            raise ConfigError(f"{a.where}: {p.module} gives no tensor {what} in one sample's forward; it gives: "
                              f"{', '.join(r for r, t in roles.items() if isinstance(t, torch.Tensor)) or 'none'} (what: one of them)")
        for role, t in (roles or {}).items():
            a.check_tensor(role, t)


def restore_states(env: ActionEnv, old: h5py.File | None, kept: int, store: RunStore) -> None:
    """A resumed run: each stateful action's state of the `kept` batches, from the old file; the
    store saves it again at its next flush. No state for kept batches: ConfigError (the action's
    result would miss them)."""
    if not env.stateful or old is None:
        return
    from hookrun.store.run_state import read_state

    states = read_state(old, kept) if kept else {}
    for a in env.stateful:
        if a.state_key in states:
            a.load_state(states[a.state_key])
        elif kept:
            raise ConfigError(f"resume: {old.filename} holds no state of {a.where} at {a.point.module} for its {kept} "
                              f"kept batches (written by an older hookrun?); start a new run (output.overwrite=true)")
    if kept and callable(getattr(store, "keep_state", None)):
        store.keep_state(env.snapshot())


def finish_actions(env: ActionEnv, store: RunStore) -> None:
    """The end of a complete run: the stateful actions' end-of-run captures, written by the store."""
    captures = [c for a in env.stateful for c in a.finish()]
    if captures:
        store.write_features(captures)


def restore_limits(points: list[HookPoint], store: RunStore) -> None:
    """Give `record limit=N` the rows the replayed batches already hold."""
    for key_path, rows in store.rows_by_key().items():
        hook, module, role, call = key_path
        for p in points:  # an op site MODULE/FN stored its calls as MODULE/FN.k
            if p.hook == hook and (p.module == module or (p.site is not None and module.rpartition(".")[0] == p.module)):
                for action in p.actions:
                    action.restore(role, call, rows, module)
