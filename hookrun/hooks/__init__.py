"""Hooks on a model: the plan (which modules), hook types, the session that owns the handles,
events, actions, ops, the patch op, the probe-direction ops. It may import config/, sae/ and store/ (records and the file
schema); never HDF5 writing, never analysis/. The in-memory capture and the module lister,
which drive these hooks from a notebook, are in hookrun/notebook/.

    from hookrun.hooks.plan import make_plan          # the hook points a config's specs name
    from hookrun.hooks.session import HookSession     # owns every handle, removes them in reverse

The package itself holds the event (Event): what an action sees when a hook fires, the tensors by
role, and the right to replace one.

    ev.tensors         # {"input": x, "output": y} for a forward hook
    ev.replace("output", y * 0)   # checked: same shape, dtype and device

Roles name the tensors a hook sees: `input`, `output`, `grad_input`, `grad_output`, `grad`; the
parts of a tuple get `.0`, `.1`, ... (`input.1`), of a dict `.KEY`. A one-element tuple, the usual
`(x,)` of a module's positional input, is just `input`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from hookrun.errors import RunError, module_label


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
REPLAY = Phase("replay", modifying=True)  # a resumed run's kept batches: the hooks' modifying actions only (RunKind.replay)


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
        """Put ``value`` in place of the tensor ``role``; PyTorch then uses it."""
        if not self.can_replace(role):
            raise RunError(f"hook {self.hook!r} ({self.type}) at {self.where}: role {role!r} cannot be replaced")
        old = self.tensors[role]
        if not isinstance(value, torch.Tensor):
            raise RunError(
                f"hook {self.hook!r} at {self.where}: the replacement for {role} is a "
                f"{type(value).__name__}, expected a tensor of shape {tuple(old.shape)}"
            )
        if value.shape != old.shape or value.dtype != old.dtype or value.device != old.device:
            raise RunError(
                f"hook {self.hook!r} at {self.where}: the replacement for {role} has shape "
                f"{tuple(value.shape)} {value.dtype} on {value.device}, expected shape "
                f"{tuple(old.shape)} {old.dtype} on {old.device}"
            )
        self.tensors[role] = value
        if self.replaced is None:
            self.replaced = set()
        self.replaced.add(role)

    def can_replace(self, role: str) -> bool:
        return self.writable is not None and role in self.tensors and family(role) == self.writable

    @property
    def where(self) -> str:
        name = module_label(self.module)
        return f"{name}" + (f" call {self.call}" if self.call else "")


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
