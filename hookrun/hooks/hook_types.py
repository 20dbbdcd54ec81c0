"""Hook types: how each kind of PyTorch hook is registered, and which roles it shows.

    HOOK_TYPES.get("forward").attach(point, fire)  # -> [RemovableHandle, ...]

| type         | PyTorch call                          | roles (replaceable first)       |
|--------------|---------------------------------------|---------------------------------|
| forward_pre  | register_forward_pre_hook(with_kwargs) | input (keywords: input.NAME)   |
| forward      | register_forward_hook(with_kwargs)    | output, input                   |
| backward_pre | register_full_backward_pre_hook       | grad_output                     |
| backward     | register_full_backward_hook           | grad_input, grad_output         |
| tensor       | Tensor.register_hook on the output    | grad                            |
| param        | Parameter.register_hook               | grad                            |

`fire(call, tensors, writable)`, made by the session for each point, runs that point's actions and
returns the Event; where an action replaced a tensor, the hook hands PyTorch the rebuilt value.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor
from torch.utils.hooks import BackwardHook

from hookrun.errors import RunError, module_label
from hookrun.hooks.events import Event, flatten, rebuild
from hookrun.hooks.points import HookPoint
from hookrun.registry import Registry

Fire = Callable[..., Event]  # fire(call, tensors, writable, raw=None)


@dataclass(frozen=True)
class HookType:
    name: str
    roles: tuple[str, ...]  # role families the hook shows
    writable: str  # the role family actions may replace
    needs_grad: bool  # only meaningful with mode=grad
    on: str  # "module" or "param"
    per_step: bool  # one row per step (no batch dimension)
    attach: Callable[[HookPoint, Fire], list]


HOOK_TYPES: Registry[HookType] = Registry("hook type")


def _hook_type(name: str, roles, writable, needs_grad=False, on="module", per_step=False):
    def add(attach):
        HOOK_TYPES.register(name)(HookType(name, roles, writable, needs_grad, on, per_step, attach))
        return attach

    return add


def inputs(args: tuple, kwargs: dict) -> dict[str, Tensor]:
    """A call's tensors by role: positional ones as `input`, `input.1`, ..., keyword ones as
    `input.NAME` (`input.hidden_states`)."""
    tensors = flatten(args, "input")
    for name, value in kwargs.items():
        tensors.update(flatten(value, f"input.{name}"))
    return tensors


@_hook_type("forward_pre", ("input",), "input")
def _forward_pre(point: HookPoint, fire: Fire) -> list:
    def hook(module, args, kwargs):
        ev = fire(point.next_forward_call(), inputs(args, kwargs) if kwargs else flatten(args, "input"), "input")
        if ev.replaced:
            new = {k: rebuild(v, f"input.{k}", ev.tensors) for k, v in kwargs.items()}
            return rebuild(args, "input", ev.tensors), new
        return None

    return [point.target.register_forward_pre_hook(hook, with_kwargs=True)]


@_hook_type("forward", ("output", "input"), "output")
def _forward(point: HookPoint, fire: Fire) -> list:
    before: dict[int, dict[str, tuple[Tensor, int]]] = {}  # (an action reads the input: by call, as it came in)

    def hook(module, args, kwargs, output):
        if not kwargs and len(args) == 1 and isinstance(output, Tensor) and isinstance(args[0], Tensor):
            tensors = {"input": args[0], "output": output}  # the common case, what flatten gives
        else:
            tensors = inputs(args, kwargs)
            tensors.update(flatten(output, "output"))
        if before:  # (keyed by the call about to fire: a step cut short leaves none for the next step's)
            tensors.update(as_it_came(point, before.pop(point.forward_calls, {}), tensors))
        ev = fire(point.next_forward_call(), tensors, "output", output if type(output) is list else None)
        if ev.replaced:
            return rebuild(output, "output", ev.tensors)
        return None

    handles = [point.target.register_forward_hook(hook, with_kwargs=True)]
    if any(getattr(a, "wants", lambda role: False)("input") for a in point.actions):
        def note(module, args, kwargs):  # (a copy where the module works in place: ReLU(inplace=True))
            copy = bool(getattr(module, "inplace", False))
            before[point.forward_calls] = {r: (t.detach().clone() if copy else t, -1 if copy else _version(t))
                                           for r, t in inputs(args, kwargs).items() if isinstance(t, Tensor)}

        handles.append(point.target.register_forward_pre_hook(note, with_kwargs=True))
    return handles


def _version(t: Tensor) -> int:
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
        elif version >= 0 and _version(t) != version and role in tensors:
            raise RunError(f"hooks.{point.hook}: {module_label(point.module)} changed its {role} in place during its "
                           f"forward, so a forward hook sees the changed values; record it with type: forward_pre "
                           f"(the input as it came in), or the output of the module before")
    return out


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


def disable_inplace(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Turn off `inplace=True` (ReLU and friends) in `model` and every module inside it; the modules
    turned off. The numbers are the same, and full backward hooks cannot follow a tensor that a later
    module overwrites (mode=grad's runs: the whole model; a backward hook in hookrun.capture: its module)."""
    turned = [m for m in model.modules() if getattr(m, "inplace", None) is True]
    for m in turned:
        m.inplace = False
    return turned


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
