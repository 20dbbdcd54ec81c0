"""The roles of what a hook sees beyond a module's plain `(x,) -> y`: an action's replacement checked
and put back into the call's values (rebuild), an input named by argument found where it came
positionally, a forward hook's inputs as the call got them (an action that reads the input of a module
that works in place), and the forward_pre hook type. Loaded where an action replaces a tensor, reads
a module's input or names one by argument, or a config names type: forward_pre (HOOK_TYPES.get).

    ev.replace("output", y * 0)   # replace(ev, "output", y * 0): same shape, dtype and device, or one RunError line
    rebuild(output, "output", ev.tensors)   # the output with the replaced tensors in place
    positional_index(module, "hidden_states")   # 0 where forward(self, hidden_states, ...) takes it first
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import Tensor

from hookrun.errors import RunError, module_label
from hookrun.hooks import Event, Fire, HookPoint, _hook_type, flatten, inputs


def replace(ev: Event, role: str, value: torch.Tensor) -> None:
    """Event.replace: put ``value`` in place of the tensor ``role``; PyTorch then uses it."""
    if not ev.can_replace(role):
        raise RunError(f"hook {ev.hook!r} ({ev.type}) at {ev.where}: role {role!r} cannot be replaced")
    old = ev.tensors[role]
    if not isinstance(value, torch.Tensor):
        raise RunError(
            f"hook {ev.hook!r} at {ev.where}: the replacement for {role} is a "
            f"{type(value).__name__}, expected a tensor of shape {tuple(old.shape)}"
        )
    if value.shape != old.shape or value.dtype != old.dtype or value.device != old.device:
        raise RunError(
            f"hook {ev.hook!r} at {ev.where}: the replacement for {role} has shape "
            f"{tuple(value.shape)} {value.dtype} on {value.device}, expected shape "
            f"{tuple(old.shape)} {old.dtype} on {old.device}"
        )
    ev.tensors[role] = value
    if ev.replaced is None:
        ev.replaced = set()
    ev.replaced.add(role)


def positional_index(module: Any, name: str) -> int | None:
    """Where argument `name` sits among `module.forward`'s positional parameters (None: nowhere):
    `hidden_states` may come positionally (GPT-2 attention) or as a keyword (LLaMA attention)."""
    try:
        params = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError, AttributeError):
        return None
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return positional.index(name) if name in positional else None


def positional_role(tensors: dict, family: str, position: int) -> str | None:
    """The role of the positional input at `position` in an event's tensors (`input`, `input.1`)."""
    role = f"{family}.{position}"
    if role in tensors:
        return role
    if position == 0 and family in tensors:
        return family
    return None


def rebuild(obj: Any, prefix: str, tensors: dict[str, torch.Tensor]) -> Any:
    """``obj`` with each tensor leaf swapped for ``tensors[role]`` (the inverse of flatten)."""

    def walk(o: Any, name: str) -> Any:
        if isinstance(o, torch.Tensor):
            return tensors.get(name, o)
        if isinstance(o, tuple | list):
            if len(o) == 1 and name == prefix:
                items = [walk(o[0], name)]
            else:
                items = [walk(x, f"{name}.{i}") for i, x in enumerate(o)]
            if isinstance(o, list):
                return items
            return type(o)(*items) if hasattr(o, "_fields") else type(o)(items)
        if isinstance(o, dict):
            new = dict(o) if type(o) is dict else o.__class__(o)
            for k, x in o.items():
                new[k] = walk(x, f"{name}.{k}")
            return new
        return o

    return walk(obj, prefix)


@_hook_type("forward_pre", ("input",), "input")
def _forward_pre(point: HookPoint, fire: Fire) -> list:
    def hook(module, args, kwargs):
        ev = fire(point.next_forward_call(), inputs(args, kwargs) if kwargs else flatten(args, "input"), "input")
        if ev.replaced:
            new = {k: rebuild(v, f"input.{k}", ev.tensors) for k, v in kwargs.items()}
            return rebuild(args, "input", ev.tensors), new
        return None

    return [point.target.register_forward_pre_hook(hook, with_kwargs=True)]


def note_inputs(point: HookPoint, before: dict) -> Any:
    """The pre-hook that keeps a forward hook's inputs as the call got them, by call, in `before`."""

    def note(module, args, kwargs):  # (a copy where the module works in place: ReLU(inplace=True))
        copy = bool(getattr(module, "inplace", False))
        before[point.forward_calls] = {r: (t.detach().clone() if copy else t, -1 if copy else tensor_version(t))
                                       for r, t in inputs(args, kwargs).items() if isinstance(t, Tensor)}

    return point.target.register_forward_pre_hook(note, with_kwargs=True)


def tensor_version(t: Tensor) -> int:
    try:
        return t._version
    except RuntimeError:  # (an inference-mode tensor keeps no version: it cannot be changed in place either)
        return -2


def as_it_came(point: HookPoint, seen: dict[str, tuple[Tensor, int]], tensors: dict) -> dict[str, Tensor]:
    """A forward hook's inputs as the call got them: the copy of an in-place module's; an input the
    module changed in place otherwise (its version moved) is refused, never recorded as it left."""
    out = {}
    for role, (t, version) in seen.items():
        if version == -1:
            out[role] = t
        elif version >= 0 and tensor_version(t) != version and role in tensors:
            raise RunError(f"hooks.{point.hook}: {module_label(point.module)} changed its {role} in place during its "
                           f"forward, so a forward hook sees the changed values; record it with type: forward_pre "
                           f"(the input as it came in), or the output of the module before")
    return out
