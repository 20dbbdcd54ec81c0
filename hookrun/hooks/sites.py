"""Op sites: the torch functions a module's own forward calls, as hook points (`at: MODULE/FN`).

    hooks: {attn: {at: "transformer.h.*.attn/softmax", type: forward, actions: [record]}}
    # captures/attn/transformer.h.0.attn%2Fsoftmax.0/output: the attention pattern of layer 0

A site is named `MODULE/FN.k`: the k-th call (0, 1, ... in call order within one forward of
MODULE) of the torch function FN that MODULE's own code makes; `MODULE/FN` means every call. The
root model's sites are `/FN`. Calls made inside a child module belong to the child; those inside an
nn.Module that is none of the model's (the `kernels` package runs transformers' apply_rotary_pos_emb
as one) are the caller's own code, as a plain helper function's are. FN is the
function's own name (`softmax`, `matmul`, `flatten`, `gelu`, `add` for `a + b` and `torch.add`,
`add_` for `a += b`); `hookrun.modules(model, x, ops=True)` lists a model's sites with shapes.

Interception costs only where sites are: a forward pre-hook of a module that holds sites enters a
`torch.overrides.TorchFunctionMode` and, while that forward runs, module pre/forward hooks note
which module's code is running; its forward hook (always called, also on an exception) leaves
them. Torch itself is never patched, and a run without sites is unchanged. Each matching call
fires its points with an Event like any module's: `forward_pre` sees the call's tensor arguments
(`input.0`, `input.1`, ...; replace_input replaces them), `forward` its result (`output`; record,
modify_output), `tensor` the gradient of its result in mode=grad. An in-place op (`add_`) is
recorded after the op; replacing its result is refused before any batch; replacing its input.0
writes the replacement into the tensor the op changes (the model's own).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.overrides import TorchFunctionMode

from hookrun.errors import ConfigError
from hookrun.hooks import HookPoint, flatten
from hookrun.hooks.roles import rebuild

OPERATORS = {"__add__": "add", "__radd__": "add", "__iadd__": "add_", "__sub__": "sub", "__rsub__": "sub",
             "__isub__": "sub_", "__mul__": "mul", "__rmul__": "mul", "__imul__": "mul_", "__matmul__": "matmul",
             "__rmatmul__": "matmul", "__truediv__": "div", "__rtruediv__": "div", "__itruediv__": "div_",
             "__neg__": "neg", "__pow__": "pow"}
SKIP = {"__get__", "__set__", "__getitem__", "__setitem__", "__len__", "__iter__", "__bool__", "__format__",
        "__repr__", "size", "dim", "numel", "is_floating_point", "__hash__", "__eq__", "__ne__"}


def fn_name(func: Any) -> str | None:
    """The readable name of an intercepted torch function (None for attribute reads and the like)."""
    name = getattr(func, "__name__", None)
    if name is None or name in SKIP:
        return None
    return OPERATORS.get(name, name)


_NAMES: dict[Any, str | None] = {}  # func -> fn_name(func), filled as calls arrive (a few hundred torch functions)


def cached_name(func: Any) -> str | None:
    """fn_name(func), looked up once per function (the interception's hot path)."""
    try:
        return _NAMES[func]
    except KeyError:
        name = _NAMES[func] = fn_name(func)
        return name
    except TypeError:  # an unhashable callable
        return fn_name(func)


def fn_label(func: Any) -> str:
    """Where an intercepted function lives, for the lister: torch.matmul, Tensor.add, F.softmax."""
    name = getattr(func, "__name__", None) or repr(func)
    qual = getattr(func, "__qualname__", None) or name
    owner, module = qual.rpartition(".")[0], getattr(func, "__module__", None) or ""
    if owner in ("TensorBase", "Tensor", "_TensorBase"):
        return f"Tensor.{name}"
    if owner == "_VariableFunctionsClass" or module == "torch":
        return f"torch.{name}"
    if module == "torch.nn.functional":
        return f"F.{name}"
    return f"{module}.{qual}" if module else qual


def in_place(fn: str) -> bool:
    return fn.endswith("_") and not fn.startswith("_")


@dataclass
class Site:
    """The op-site points of one module: FN -> [(call or None, point, fire)]."""

    module: nn.Module
    points: dict[str, list] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)  # calls of each FN in the forward in flight


HOOK = object()  # on the stack while a hook's own code runs (hush): its torch calls belong to no module


class Interceptor:
    """Owns the mode and the hooks that attribute torch calls to the innermost running module."""

    def __init__(self, model: nn.Module | None = None) -> None:
        self.sites: dict[nn.Module, Site] = {}
        self.model = model
        self.known: set[nn.Module] = set()  # the model's modules (and the hooked ones'), at the forward's start
        self.stack: list[nn.Module] = []  # every one of them whose forward runs inside a hooked one
        self.depth = 0  # hooked modules in flight
        self._mode: _SiteMode | None = None
        self._global: list = []

    def add(self, module: nn.Module, fn: str, call: int | None, point: HookPoint, fire: Callable) -> list:
        """Attach one point; returns the handles to remove (the module's enter/leave hooks, once)."""
        site = self.sites.get(module)
        handles = []
        if site is None:
            site = self.sites[module] = Site(module)
            handles = [module.register_forward_pre_hook(self._enter, prepend=True),
                       module.register_forward_hook(self._leave, always_call=True), _Closer(self)]
        site.points.setdefault(fn, []).append((call, point, fire))
        return handles

    def _enter(self, module: nn.Module, args: Any) -> None:
        site = self.sites[module]
        site.counts = {}
        for entries in site.points.values():  # which call of the module this forward is (a shared ReLU's 2nd: 1)
            for _, point, _ in entries:
                point.next_forward_call()
        if self.depth == 0:
            self.known = set()
            for root in (self.model, *self.sites):
                if root is not None and root not in self.known:
                    self.known.update(root.modules())
            self._global = [register_module_forward_pre_hook(self._push),
                            register_module_forward_hook(self._pop, always_call=True)]
            self._mode = _SiteMode(self)
            self._mode.__enter__()
        self.depth += 1
        self.stack.append(module)

    def _leave(self, module: nn.Module, args: Any, output: Any) -> None:
        if self.stack and self.stack[-1] is module:
            self.stack.pop()
        self.depth -= 1
        if self.depth == 0:
            self.close()

    def hush(self) -> bool:
        """A hook's actions are about to run inside a hooked forward: their torch calls (an op's `x + v`,
        a record's copy) are no module's own code, so they neither fire nor number a site (a child's
        forward hook runs after the child has left the stack: its calls were counted as the parent's).
        Modules the hook calls (a splice's SAE) push themselves as usual. True: unhush() after."""
        if self.depth:
            self.stack.append(HOOK)
            return True
        return False

    def unhush(self) -> None:
        if self.stack and self.stack[-1] is HOOK:
            self.stack.pop()

    def _push(self, module: nn.Module, args: Any) -> None:
        if module not in self.sites and module in self.known:  # (a hooked module pushes itself, first)
            self.stack.append(module)

    def _pop(self, module: nn.Module, args: Any, output: Any) -> None:
        if module not in self.sites and self.stack and self.stack[-1] is module:
            self.stack.pop()

    def close(self) -> None:
        if self._mode is not None:
            self._mode.__exit__(None, None, None)
            self._mode = None
        while self._global:
            self._global.pop().remove()
        self.stack.clear()
        self.depth = 0

    def call(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """One intercepted call: fire the points of the innermost module's site for it, if any. Most
        calls fire nothing (a child's, or an FN no point names): they cost two dict look-ups."""
        stack = self.stack
        site = self.sites.get(stack[-1]) if stack else None
        if site is not None:
            name = cached_name(func)
            entries = site.points.get(name)
            if entries:
                return self._fire(site, name, entries, func, args, kwargs)
        return func(*args, **kwargs)

    def _fire(self, site: Site, name: str, entries: list, func: Any, args: tuple, kwargs: dict) -> Any:
        k = site.counts.get(name, 0)
        site.counts[name] = k + 1
        chosen = [(point, fire, point.module if call is not None else f"{point.module}.{k}")
                  for call, point, fire in entries if call is None or call == k]
        first = args[0] if args else None
        for point, fire, where in chosen:
            if point.type == "forward_pre":
                ev = fire(point.forward_calls - 1, flatten(args, "input"), "input", module=where)
                if ev.replaced:
                    args = rebuild(args, "input", ev.tensors)
        if in_place(name) and isinstance(first, torch.Tensor) and args[0] is not first:
            # the tensor an in-place op changes is the model's own (`x.mul_(3)`, its result unused): the
            # replacement is written into it, and the op runs on it, as it would on the edited input
            first.copy_(args[0])
            args = (first, *args[1:])
        result = func(*args, **kwargs)
        for point, fire, where in chosen:
            if point.type == "forward":
                ev = fire(point.forward_calls - 1, {"output": result} if isinstance(result, torch.Tensor)
                          else flatten(result, "output"), "output", module=where)
                if ev.replaced:
                    result = rebuild(result, "output", ev.tensors)
        for point, fire, where in chosen:  # (after every forward's edit: the gradient of the result the model sees)
            if point.type == "tensor":
                for role, t in flatten(result, "grad").items():
                    if t.requires_grad:
                        t.register_hook(partial(_on_grad, fire, role, where, point.forward_calls - 1))
        return result


class Listener(Interceptor):
    """Every torch call of the watched modules' own forwards, numbered as sites are, for the lister:
    `on_call(module, fn, k, func, args, result)` after each call (same attribution as Interceptor).

        listener = Listener(lambda module, fn, k, func, args, result: print(fn, k), model)
        handles = [h for m in model.modules() for h in listener.watch(m)]
    """

    def __init__(self, on_call: Callable, model: nn.Module | None = None) -> None:
        super().__init__(model)
        self.on_call = on_call

    def watch(self, module: nn.Module) -> list:
        site = self.sites.get(module)
        if site is not None:
            return []
        self.sites[module] = Site(module)
        return [module.register_forward_pre_hook(self._enter, prepend=True),
                module.register_forward_hook(self._leave, always_call=True), _Closer(self)]

    def call(self, func: Any, args: tuple, kwargs: dict) -> Any:
        site = self.sites.get(self.stack[-1]) if self.stack else None
        result = func(*args, **kwargs)
        name = cached_name(func) if site is not None else None
        if name is not None:
            k = site.counts.get(name, 0)
            site.counts[name] = k + 1
            self.on_call(site.module, name, k, func, args, result)
        return result


def _on_grad(fire: Callable, role: str, where: str, call: int, grad: torch.Tensor) -> torch.Tensor | None:
    ev = fire(call, {role: grad}, "grad", module=where)  # (the forward call that made it: backward comes in reverse)
    return ev.tensors[role] if ev.replaced else None


class _Closer:
    """A handle whose remove() leaves any mode still entered (the session removes handles)."""

    def __init__(self, owner: Interceptor) -> None:
        self.owner = owner

    def remove(self) -> None:
        self.owner.close()


class _SiteMode(TorchFunctionMode):
    def __init__(self, owner: Interceptor) -> None:
        super().__init__()
        self.owner = owner

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return self.owner.call(func, args, kwargs or {})


def check_site_actions(point: HookPoint, fn: str) -> None:
    """Replacing the result of an in-place op would not change what the op wrote: refused."""
    if in_place(fn) and point.type == "forward" and any(getattr(a, "modifies", False) for a in point.actions):
        raise ConfigError(f"hooks.{point.hook}: {point.module} is an in-place op ({fn}): its result is the tensor it "
                          f"changed, so replacing it would not undo the op; modify its input instead "
                          f"(type: forward_pre, replace_input), or the op site before it")
