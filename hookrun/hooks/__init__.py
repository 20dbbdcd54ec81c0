"""Hooks on a model: the plan (which modules), hook types, the session that owns the handles,
events, actions, ops, the patch op, the probe-direction ops. It may import config/, sae/ and store/ (records and the file
schema); never HDF5 writing, never analysis/. The in-memory capture and the module lister,
which drive these hooks from a notebook, are in hookrun/notebook/.

    from hookrun.hooks.plan import make_plan          # the hook points a config's specs name
    from hookrun.hooks.session import HookSession     # owns every handle, removes them in reverse

The package itself holds the event (Event): what an action sees when a hook fires, the tensors by
role, and the right to replace one; the hook point (HookPoint: one hook spec on one module or
parameter, with its per-step call counter); and the hook types: how each kind of PyTorch hook is
registered, and which roles it shows.

    ev.tensors         # {"input": x, "output": y} for a forward hook
    ev.replace("output", y * 0)   # checked: same shape, dtype and device (hookrun.hooks.roles)
    point = HookPoint("fmap", "forward", "layer1.0", model.layer1[0])   # hook, type, module, target
    point.next_forward_call()  # 0, then 1 for a second call in the same forward pass
    HOOK_TYPES.get("forward").attach(point, fire)  # -> [RemovableHandle, ...]

Roles name the tensors a hook sees: `input`, `output`, `grad_input`, `grad_output`, `grad`; the
parts of a tuple get `.0`, `.1`, ... (`input.1`), of a dict `.KEY`. A one-element tuple, the usual
`(x,)` of a module's positional input, is just `input`.

| type         | PyTorch call                          | roles (replaceable first)       |
|--------------|---------------------------------------|---------------------------------|
| forward_pre  | register_forward_pre_hook(with_kwargs) | input (keywords: input.NAME)   |
| forward      | register_forward_hook(with_kwargs)    | output, input                   |
| backward_pre | register_full_backward_pre_hook       | grad_output                     |
| backward     | register_full_backward_hook           | grad_input, grad_output         |
| tensor       | Tensor.register_hook on the output    | grad                            |
| param        | Parameter.register_hook               | grad                            |

`fire(call, tensors, writable)`, made by the session for each point, runs that point's actions and
returns the Event; where an action replaced a tensor, the hook hands PyTorch the rebuilt value. The
forward type is here; forward_pre and what a call's values other than `(x,) -> y` need (flatten's
tuples and dicts, rebuild, the inputs as they came in) are hooks/roles.py's, and the backward_pre,
backward, tensor and param types hooks/grad_hooks.py's, each imported when a config or a call first
needs it (HOOK_TYPES.get), so a forward record of a plain module loads neither.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from hookrun.errors import Registry, RunError, module_label

_GRAPH_TASK = getattr(torch._C, "_current_graph_task_id", None)  # (-1 outside a backward; in torch 2.1+)


class Phase:
    """Which actions run in one of a batch's forwards (a run kind hands it to HookSession.phase).

    every:     every action runs and the firing counts (the plain forward)
    modifying: (where not every) the modifying actions run, the others not
    ablate:    the modifying actions return env.ablation(x, module, role) instead of their op's result
    """

    __slots__ = ("name", "every", "modifying", "ablate")

    def __init__(self, name: str, every: bool = False, modifying: bool = False, ablate: bool = False) -> None:
        self.name, self.every, self.modifying, self.ablate = name, every, modifying, ablate

    def __repr__(self) -> str:
        return f"Phase({self.name!r})"


# the forwards of a batch of a kind that compares them: clean (hooks attached, no action runs), intervened
# (as configured: also every plain run's one forward), ablated (modify actions return the ablation)
CLEAN = Phase("clean")
INTERVENED = Phase("intervened", every=True)
ABLATED = Phase("ablated", modifying=True, ablate=True)
REPLAY = Phase("replay", modifying=True)  # a resumed run's kept batches: the hooks' modifying actions only (runner/extra_forwards.py replay)


class StopForward(Exception):
    """Raised at the stop point of a step under early_stop (hooks/early_stop.py): the rest of the
    forward is skipped; whoever runs a forward catches it as the end of that forward."""


@dataclass
class StepState:
    """The batch in flight: set by the loop, read by every event of the step."""

    step: int = -1
    batch_size: int = 0
    sample_index: torch.Tensor | None = None  # dataset indices of the batch's samples
    attention_mask: torch.Tensor | None = None  # (batch, tokens), 1 = a real token, 0 = padding; None: no mask
    phase: Phase = INTERVENED  # which actions run in the forward in flight (a run kind's phases)
    batch: Any = None  # the batch's items as the model call has them (a dict of tensors: logit_lens' target)
    first_map: Callable[[torch.Tensor | None], Any] | None = None  # HookSession.begin_step's: the step's first TokenMap
    _calls: list | None = field(default_factory=list, repr=False)  # None: `calls` not yet asked for this step
    _call_tokens: Any = field(default=None, repr=False)

    @property
    def calls(self) -> list:
        """The TokenMap of each model call of the step (hooks/tokens.py). The first, begin_step's map of
        the batch's attention mask, is made by `first_map` when first asked for: a step that nothing
        asks about its tokens (an image model's `record`) runs no token code."""
        if self._calls is None:
            self._call_tokens = self.first_map(self.attention_mask)
            self._calls = [self._call_tokens]
        return self._calls

    @calls.setter
    def calls(self, value: list | None) -> None:
        self._calls = value

    @property
    def call_tokens(self) -> Any:
        """The TokenMap of the model call in flight (the last of `calls`)."""
        return self._call_tokens if self._calls is not None else self.calls[-1]

    @call_tokens.setter
    def call_tokens(self, value: Any) -> None:
        self.calls  # noqa: B018 (the step's first map made, if not yet: `calls` keeps it)
        self._call_tokens = value


class Event:
    """One firing of one hook point (a plain class with __slots__: one is made per firing)."""

    __slots__ = ("hook", "type", "module", "target", "call", "state", "tensors", "writable", "replaced", "raw")

    def __init__(self, hook: str, type: str, module: str, target: Any, call: int, state: StepState,
                 tensors: dict[str, torch.Tensor], writable: str | None = None, raw: Any = None) -> None:
        self.hook = hook
        self.type = type
        self.module = module  # module path ('' is the whole model) or parameter name
        self.target = target  # the nn.Module or the parameter
        self.call = call  # which call of the module in this forward (0, 1, ...)
        self.state = state
        self.tensors = tensors
        self.writable = writable  # the role family actions may replace (e.g. "output")
        self.replaced: set[str] | None = None  # roles an action replaced
        self.raw = raw  # a forward hook's output where it is a list (one item per sample: detection)

    @property
    def step(self) -> int:
        return self.state.step

    def replace(self, role: str, value: torch.Tensor) -> None:
        """Put ``value`` in place of the tensor ``role``; PyTorch then uses it (checked: hookrun.hooks.roles)."""
        from hookrun.hooks.roles import replace

        replace(self, role, value)

    def can_replace(self, role: str) -> bool:
        return self.writable is not None and role in self.tensors and family(role) == self.writable

    @property
    def where(self) -> str:
        name = module_label(self.module)
        return f"{name}" + (f" call {self.call}" if self.call else "")


def family(role: str) -> str:
    """'input.1' -> 'input'."""
    return role.split(".", 1)[0]


def flatten(obj: Any, prefix: str) -> dict[str, torch.Tensor]:
    """The tensors inside ``obj`` (a tensor, or tuples/lists/dicts of them) by role name."""
    if type(obj) is tuple and len(obj) == 1 and isinstance(obj[0], torch.Tensor):
        return {prefix: obj[0]}  # the common case, a module's (x,): no recursion
    if isinstance(obj, torch.Tensor):
        return {prefix: obj}
    out: dict[str, torch.Tensor] = {}

    def walk(o: Any, name: str) -> None:
        if isinstance(o, torch.Tensor):
            out[name] = o
        elif isinstance(o, tuple | list):
            if len(o) == 1 and name == prefix:
                walk(o[0], name)
            else:
                for i, x in enumerate(o):
                    walk(x, f"{name}.{i}")
        elif isinstance(o, dict):
            for k, x in o.items():
                walk(x, f"{name}.{k}")

    walk(obj, prefix)
    return out


def inputs(args: tuple, kwargs: dict) -> dict[str, Tensor]:
    """A call's tensors by role: positional ones as `input`, `input.1`, ..., keyword ones as
    `input.NAME` (`input.hidden_states`)."""
    tensors = flatten(args, "input")
    for name, value in kwargs.items():
        tensors.update(flatten(value, f"input.{name}"))
    return tensors


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
            from hookrun.hooks.grad_hooks import recomputed

            raise RunError(recomputed(self))
        self.forward_calls += 1
        return self.forward_calls - 1


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
HOOK_TYPES.register_lazy("forward_pre", "hookrun.hooks.roles")  # (these modules register them when imported)
for _name in ("backward_pre", "backward", "tensor", "param"):
    HOOK_TYPES.register_lazy(_name, "hookrun.hooks.grad_hooks")


def _hook_type(name: str, roles, writable, needs_grad=False, on="module", per_step=False):
    def add(attach):
        hook_type = HookType(name, roles, writable, needs_grad, on, per_step, attach)
        object.__setattr__(hook_type, "__module__", attach.__module__)  # (the registry's check: a lazy name's own module)
        HOOK_TYPES.register(name)(hook_type)
        return attach

    return add


@_hook_type("forward", ("output", "input"), "output")
def _forward(point: HookPoint, fire: Fire) -> list:
    before: dict[int, dict[str, tuple[Tensor, int]]] = {}  # (an action reads the input: by call, as it came in)
    reads_input = any(getattr(a, "wants", lambda role: False)("input") for a in point.actions)
    if reads_input:  # (bound once here, not at each firing)
        from hookrun.hooks.roles import as_it_came, note_inputs

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
            from hookrun.hooks.roles import rebuild

            return rebuild(output, "output", ev.tensors)
        return None

    handles = [point.target.register_forward_hook(hook, with_kwargs=True)]
    if reads_input:
        handles.append(note_inputs(point, before))
    return handles
