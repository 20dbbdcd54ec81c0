"""The hook types that show gradients: backward_pre, backward (PyTorch's full backward hooks, set up
per forward call), tensor (Tensor.register_hook on a module's outputs) and param (Parameter.register_hook).
Registered in HOOK_TYPES (hookrun.hooks) when a config first names one, so a forward record
never loads this module. Here too what only gradients need of the plan and of a hook point: a param
hook's frozen and tied parameters (trainable, once_each), the inplace flags turned off for full
backward hooks (disable_inplace), and the one line for a forward recomputed inside the backward pass
(recomputed: activation checkpointing).

    HOOK_TYPES.get("backward").attach(point, fire)  # imports this module, then -> [handle, ...]
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.hooks import BackwardHook

from hookrun.errors import ConfigError, RunError, module_label
from hookrun.hooks import Fire, HookPoint, _hook_type, flatten
from hookrun.hooks.roles import rebuild

log = logging.getLogger("hookrun")


def _positional_only(point: HookPoint, args: tuple, kwargs: dict) -> None:
    """A module whose tensors all come as keywords is refused (full backward hooks see positional
    inputs only)."""
    if kwargs and not any(isinstance(a, Tensor) for a in flatten(args, "input").values()):
        named = [k for k, v in kwargs.items() if flatten(v, "input")]
        if named:
            raise RunError(
                f"hooks.{point.hook}: a {point.type} hook on {module_label(point.module)} sees positional inputs "
                f"only (PyTorch's full backward hooks), and {module_label(point.module)} gets its tensors as "
                f"keywords ({', '.join(named)}); use type: tensor on the same module (the gradient of its "
                f"output), or hook the enclosing block"
            )


@_hook_type("backward_pre", ("grad_output",), "grad_output", needs_grad=True)
def _backward_pre(point: HookPoint, fire: Fire) -> list:
    def hook(call, module, grad_output):
        ev = fire(call, flatten(grad_output, "grad_output"), "grad_output")
        if ev.replaced:
            return rebuild(grad_output, "grad_output", ev.tensors)
        return None

    return _full_backward(point, pre_hook=hook)


@_hook_type("backward", ("grad_input", "grad_output"), "grad_input", needs_grad=True)
def _backward(point: HookPoint, fire: Fire) -> list:
    def hook(call, module, grad_input, grad_output):
        tensors = flatten(grad_input, "grad_input")
        tensors.update(flatten(grad_output, "grad_output"))
        ev = fire(call, tensors, "grad_input")
        if ev.replaced:
            return rebuild(grad_input, "grad_input", ev.tensors)
        return None

    return _full_backward(point, hook=hook)


def _full_backward(point: HookPoint, hook=None, pre_hook=None) -> list:
    """PyTorch's full backward hook (torch.utils.hooks.BackwardHook, as Module.__call__ sets it up),
    set up by a forward pre-hook and a forward hook of our own, so that the outputs its consumer
    sees are copies it may modify in place: `out += identity` after a ResNet block's bn2 would
    otherwise fail on the hook's view (the gradients are the same: a copy passes them through).
    Each forward call gets its own BackwardHook, bound to that call's number: its gradients are
    filed under the call that made them, in whatever order (or not at all) they come back."""
    pending: list[BackwardHook] = []  # one per call in flight (a module called inside itself)

    def setup(module, args, kwargs):
        call = point.next_forward_call()
        _positional_only(point, args, kwargs)
        bw = BackwardHook(module, [partial(hook, call)] if hook else [], [partial(pre_hook, call)] if pre_hook else [])
        pending.append(bw)
        return bw.setup_input_hook(args), kwargs

    def finish(module, args, output):
        if not pending:
            return None
        bw = pending.pop()
        if not isinstance(output, Tensor | tuple):
            _unseen_output(point, output)
        output = bw.setup_output_hook(output)
        return _copies(output) if torch.is_grad_enabled() else output

    handles = [point.target.register_forward_pre_hook(setup, with_kwargs=True), point.target.register_forward_hook(finish)]
    return [*handles, _NotInPlace(point.target)]


class _NotInPlace:
    """`inplace` off, while the hook is attached, in the module and the modules inside it (ReLU(inplace=True):
    PyTorch refuses an in-place op on the view its hook makes of the input; a file run turns off every
    module's already), back on at removal: the same numbers."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.modules = disable_inplace(module)

    def remove(self) -> None:
        for m in self.modules:
            m.inplace = True


def _unseen_output(point: HookPoint, output) -> None:
    """Full backward hooks see an output that is a tensor or a tuple; on any other output that holds
    tensors (a dict, a ModelOutput, a list) they never fire: refused, not left silent."""
    roles = list(flatten(output, "output"))
    if roles:
        name = module_label(point.module)
        raise RunError(
            f"hooks.{point.hook}: a {point.type} hook on {name} never fires: PyTorch's full backward hooks see an "
            f"output that is a tensor or a tuple of tensors, and {name} returns a {type(output).__name__} "
            f"({', '.join(roles[:4])}{', ...' if len(roles) > 4 else ''}); use type: tensor on the same module "
            f"(it records the gradient of each output tensor: grad{roles[0][len('output'):]} for {roles[0]}), "
            f"or hook the module inside that makes the tensor"
        )


def _copies(obj):
    if isinstance(obj, Tensor):
        return obj.clone()
    if isinstance(obj, tuple):
        return tuple(_copies(o) for o in obj)
    return obj


@_hook_type("tensor", ("grad",), "grad", needs_grad=True)
def _tensor(point: HookPoint, fire: Fire) -> list:
    def on_grad(role, call, grad):
        ev = fire(call, {role: grad}, "grad")
        return ev.tensors[role] if ev.replaced else None

    def hook(module, args, output):
        call = point.next_forward_call()
        for role, t in flatten(output, "grad").items():
            if t.requires_grad:
                t.register_hook(partial(on_grad, role, call))

    return [point.target.register_forward_hook(hook)]


@_hook_type("param", ("grad",), "grad", needs_grad=True, on="param", per_step=True)
def _param(point: HookPoint, fire: Fire) -> list:
    def hook(grad):  # (one firing per backward: the gradient summed over the forward's uses)
        ev = fire(0, {"grad": grad}, "grad")
        return ev.tensors["grad"] if ev.replaced else None

    return [point.target.register_hook(hook)]


def recomputed(point: HookPoint) -> str:
    """The one line for a hooked module that runs again inside the backward pass: activation
    checkpointing recomputes its forward there, a call the hooks would number as a new one (a second
    record of it, an op's noise drawn anew under another call number: gradients of another forward)."""
    return (f"hooks.{point.hook}: {module_label(point.module)} ran its forward again inside the backward pass (activation checkpointing "
            f"recomputes it: torch.utils.checkpoint, transformers' gradient_checkpointing_enable()), which the "
            f"hooks would take for another call; run without checkpointing (model.gradient_checkpointing_disable(), "
            f"or call the checkpointed modules directly)")


def disable_inplace(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Turn off `inplace=True` (ReLU and friends) in `model` and every module inside it; the modules
    turned off. The numbers are the same, and full backward hooks cannot follow a tensor that a later
    module overwrites (mode=grad's runs: the whole model; a backward hook in hookrun.capture: its module)."""
    turned = [m for m in model.modules() if getattr(m, "inplace", None) is True]
    for m in turned:
        m.inplace = False
    return turned


def once_each(found: list[tuple[str, Any]], patterns: Iterable[str], where: str) -> list[tuple[str, Any]]:
    """A tied parameter reached by two of its names (a glob's `**.weight`, or both named: GPT-2's
    transformer.wte.weight and lm_head.weight) is one tensor: hooked twice, its gradient would be edited
    twice (scale 0.5 giving 0.25) and recorded twice. It is kept once, by the name `at:` gives exactly,
    else its first; one warning names the others."""
    exact, kept, dropped = set(patterns), {}, []
    for name, target in found:
        first = kept.setdefault(id(target), (name, target))
        if first[0] != name:
            if name in exact and first[0] not in exact:
                kept[id(target)] = (name, target)
                name = first[0]
            dropped.append((name, kept[id(target)][0]))
    if dropped:
        log.warning("%s: %s: one tensor under two names (tied), hooked once", where,
                    ", ".join(f"{a} is {b}" for a, b in dropped))
    return [x for x in found if kept[id(x[1])][0] == x[0]]


def trainable(spec: Any, targets: list) -> list:
    """A param hook's parameters that get a gradient: a frozen one (requires_grad=False; PyTorch refuses a
    hook on it) named exactly, or the only kind a glob reaches, is an error; a glob's others are left out."""
    frozen = [name for name, t, _ in targets if isinstance(t, nn.Parameter) and not t.requires_grad]
    if not frozen:
        return targets
    kept = [x for x in targets if x[0] not in frozen]
    named = [name for name in frozen if name in spec.at]
    if named or not kept:
        what = f"parameter {named[0]!r} is" if named else f"every parameter it reaches ({', '.join(frozen[:4])}) is"
        raise ConfigError(f"hooks.{spec.name}.at: {what} frozen (requires_grad=False), so no gradient reaches it and "
                          f"a param hook cannot be set; unfreeze it (.requires_grad_(True)) or hook one that trains; "
                          f"the gradient of a module's output: type: tensor")
    log.warning("hooks.%s: %d frozen parameter(s) (requires_grad=False) that a glob of `at:` reached left out, as no "
                "gradient reaches them: %s", spec.name, len(frozen), ", ".join(frozen[:8]) + (", ..." if len(frozen) > 8 else ""))
    return kept
