"""The hook types that show gradients: backward_pre, backward (PyTorch's full backward hooks, set up
per forward call), tensor (Tensor.register_hook on a module's outputs) and param (Parameter.register_hook).
Registered in HOOK_TYPES (hooks/hook_types.py) when a config first names one, so a forward record
never loads this module.

    HOOK_TYPES.get("backward").attach(point, fire)  # imports this module, then -> [handle, ...]
"""

from __future__ import annotations

from functools import partial

import torch
from torch import Tensor
from torch.utils.hooks import BackwardHook

from hookrun.errors import RunError, module_label
from hookrun.hooks import flatten, rebuild
from hookrun.hooks.hook_types import Fire, HookPoint, _hook_type, disable_inplace


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
