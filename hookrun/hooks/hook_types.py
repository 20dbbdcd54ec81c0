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

The backward_pre, backward, tensor and param types are hooks/grad_hooks.py's, imported when a config
names one (HOOK_TYPES.get), so a forward record loads no backward hook code.

A hook point: one hook spec on one module or parameter, with its per-step call counter.

    point = HookPoint("fmap", "forward", "layer1.0", model.layer1[0])   # hook, type, module, target
    point.next_forward_call()  # 0, then 1 for a second call in the same forward pass
    split_site("transformer.h.0/add.1", set(dict(model.named_modules())))  # ("transformer.h.0", "add", 1)

`last_roles(module, model)` (HookPoint.last, set at plan time) says which of a module's 4-D tensors are
channels last, (batch, height, width, channels): timm's Swin, torchvision's Permute to NHWC (channels_last()).
`split_site` tells an op site's name (`MODULE/FN[.k]`) from a module's when a plan is made; the
sites themselves (hooks/sites.py) load only where a plan names one.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from hookrun.errors import RunError, module_label
from hookrun.hooks import Event, flatten, rebuild
from hookrun.registry import Registry

_GRAPH_TASK = getattr(torch._C, "_current_graph_task_id", None)  # (-1 outside a backward; in torch 2.1+)
SITE = re.compile(r"^(?P<module>.*)/(?P<fn>[A-Za-z_][A-Za-z0-9_]*)(?:\.(?P<call>\d+))?$")  # an op site's name (hooks/sites.py)


@dataclass
class HookPoint:
    """One hook spec on one module or parameter, with its per-step call counter."""

    hook: str
    type: str
    module: str  # the module's path ('' is the whole model) or the parameter's name
    target: Any  # nn.Module or nn.Parameter
    actions: list = field(default_factory=list)
    globbed: bool = False  # reached only through a glob of `at:` (not named there): may have nothing to record
    site: tuple | None = None  # an op site (hooks/sites.py): (FN, call or None); target is the module whose code calls FN
    axes: dict = field(default_factory=dict)  # an op site: (FN, k, role) -> axis names from its module's calls' structure (site_axes)
    last: tuple = ()  # the role families whose 4-D tensors are channels last (last_roles())
    forward_calls: int = 0  # a backward hook's firing is bound to the call that made it (grad_hooks._full_backward)

    def reset(self) -> None:
        self.forward_calls = 0

    def channel_axis(self, x: torch.Tensor, role: str) -> int:
        """The channels' axis of a tensor hooked here: 1, or 3 where it is a channels-last map (`last`)."""
        return 3 if x.dim() == 4 and role.split(".", 1)[0] in self.last else 1

    def next_forward_call(self) -> int:
        if _GRAPH_TASK is not None and _GRAPH_TASK() != -1:  # (a forward run by a backward: activation checkpointing)
            raise RunError(recomputed(self))
        self.forward_calls += 1
        return self.forward_calls - 1


def recomputed(point: HookPoint) -> str:
    """The one line for a hooked module that runs again inside the backward pass: activation
    checkpointing recomputes its forward there, a call the hooks would number as a new one (a second
    record of it, an op's noise drawn anew under another call number: gradients of another forward)."""
    return (f"hooks.{point.hook}: {module_label(point.module)} ran its forward again inside the backward pass (activation checkpointing "
            f"recomputes it: torch.utils.checkpoint, transformers' gradient_checkpointing_enable()), which the "
            f"hooks would take for another call; run without checkpointing (model.gradient_checkpointing_disable(), "
            f"or call the checkpointed modules directly)")


def split_site(at: str, modules: set[str]) -> tuple[str, str, int | None] | None:
    """(module pattern, FN, call or None) of an op-site name; None where `at` names a module (a
    module whose own name holds a '/' stays a module)."""
    if at in modules:
        return None
    m = SITE.match(at)
    if not m:
        return None
    return m.group("module"), m.group("fn"), int(m.group("call")) if m.group("call") else None


def channels_last(module: nn.Module, model: nn.Module) -> bool:
    """Whether a module's 4-D output is (batch, height, width, channels): a timm model that says so
    (`output_fmt` NHWC: Swin) or a module of its own that does (timm's PatchEmbed), a Linear or a
    LayerNorm over the last axis (inside a ConvNeXt block), a module built of these alone (timm's Mlp),
    an activation or dropout after one (its sibling before it, or its token-wise parent), a Swin block
    or patch merging, torchvision's Permute to NHWC, an nn.Sequential whose last module is one of these;
    never a torch *1d/2d/3d module (Conv2d, BatchNorm2d, timm's LayerNorm2d, pools)."""
    kind = type(module).__name__
    if isinstance(module, nn.Sequential) and len(module):  # (an SAE spliced at it joins as a last child that passes through)
        kids = [m for m in module if not getattr(m, "passes_through", False)]
        return channels_last((kids or list(module))[-1], model)
    if kind == "Permute" and isinstance(getattr(module, "dims", None), list | tuple):
        return list(module.dims) == [0, 2, 3, 1]
    if kind.endswith(("1d", "2d", "3d")):
        return False
    fmt = getattr(module, "output_fmt", None)
    if fmt is not None:
        return str(getattr(fmt, "value", fmt)) == "NHWC"
    if _last_axis(module) or kind.startswith(("Swin", "PatchMerging")) or _token_wise(module):
        return True
    if _elementwise(module) and _after_last_axis(module, model):
        return True
    fmt = getattr(model, "output_fmt", None)
    return str(getattr(fmt, "value", fmt)) == "NHWC"


def _last_axis(m: nn.Module) -> bool:  # a Linear, or a LayerNorm over the last axis (not a LayerNorm2d)
    return not type(m).__name__.endswith(("1d", "2d", "3d")) and (
        isinstance(m, nn.Linear) or (isinstance(m, nn.LayerNorm) and len(m.normalized_shape) == 1))


def _elementwise(m: nn.Module) -> bool:
    """A module with no weights and no children that keeps its input's layout: an activation, a dropout, Identity."""
    where = type(m).__module__
    return not m._modules and not m._parameters and (isinstance(m, nn.Identity) or where in (
        "torch.nn.modules.activation", "torch.nn.modules.dropout") or where.startswith("timm.layers.activations"))


def _activation(m: nn.Module) -> bool:  # an elementwise non-linearity (GELU, SiLU, Sigmoid), not a softmax
    where = type(m).__module__
    return _elementwise(m) and (where == "torch.nn.modules.activation" or where.startswith("timm.layers.activations")) \
        and "softm" not in type(m).__name__.lower()


def _token_wise(m: nn.Module) -> bool:
    """A per-token MLP: Linear layers, last-axis LayerNorms and elementwise modules alone, an activation among
    them (timm's Mlp, GluMlp, SwiGLU); not an attention module (its 4-D scores are not a map)."""
    kids = list(m.children())
    return (not isinstance(m, nn.Sequential) and any(isinstance(k, nn.Linear) for k in kids)
            and any(_activation(k) for k in kids) and all(_last_axis(k) or _elementwise(k) for k in kids))


def _after_last_axis(module: nn.Module, model: nn.Module) -> bool:
    """An elementwise module's layout: its token-wise parent's, or in an nn.Sequential the nearest module
    before it that is not elementwise."""
    for parent in model.modules():
        kids = list(parent.children())
        if any(k is module for k in kids):
            if _token_wise(parent):
                return True
            if isinstance(parent, nn.Sequential):
                before = [k for k in kids[:next(i for i, k in enumerate(kids) if k is module)] if not _elementwise(k)]
                return bool(before) and channels_last(before[-1], model)
            return False
    return False


def last_roles(module: Any, model: nn.Module) -> tuple[str, ...]:
    """The role families whose 4-D tensors are channels last at a module (HookPoint.last): its output and
    the gradients of it, where channels_last(); its inputs too where its (first) module keeps their layout
    (a Linear, a LayerNorm, a module of these, an elementwise module, a Swin block or stage, patch merging;
    not a Permute, a PatchEmbed, a conv)."""
    if not isinstance(module, nn.Module) or not channels_last(module, model):
        return ()
    first = module[0] if isinstance(module, nn.Sequential) and len(module) else module
    keeps = (_last_axis(first) or _token_wise(first) or _elementwise(first)
             or type(first).__name__.startswith(("Swin", "PatchMerging")))
    return ("output", "grad_output", "grad") + (("input", "grad_input") if keeps else ())


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
for _name in ("backward_pre", "backward", "tensor", "param"):  # (hooks/grad_hooks.py registers them when imported)
    HOOK_TYPES.register_lazy(_name, "hookrun.hooks.grad_hooks")


def _hook_type(name: str, roles, writable, needs_grad=False, on="module", per_step=False):
    def add(attach):
        hook_type = HookType(name, roles, writable, needs_grad, on, per_step, attach)
        object.__setattr__(hook_type, "__module__", attach.__module__)  # (the registry's check: a lazy name's own module)
        HOOK_TYPES.register(name)(hook_type)
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


def disable_inplace(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Turn off `inplace=True` (ReLU and friends) in `model` and every module inside it; the modules
    turned off. The numbers are the same, and full backward hooks cannot follow a tensor that a later
    module overwrites (mode=grad's runs: the whole model; a backward hook in hookrun.capture: its module)."""
    turned = [m for m in model.modules() if getattr(m, "inplace", None) is True]
    for m in turned:
        m.inplace = False
    return turned


