"""Actions: what runs when a hook fires (record, replace_input, modify_output, modify_grad,
top_examples, logit_lens), and the action base: what every action is given (ActionEnv, and its
ModelHold: the one owner of what a run attaches to a model), what it declares it can do, the
registry of action names, and an action built from its config (action_class, action_params: checked
alike by make_plan and by the config's own check, hooks/spec_check.py). The built-in actions are registered by name with their module, imported
when a config names them (ACTIONS.get(name)), so a run that only records loads no lens, SAE or
top-examples code: `ACTIONS.get("logit_lens")` imports hookrun/hooks/actions/lens.py.

    @register_action("my_action")
    class MyAction(Action):
        records = True                   # it writes captures (env.captures.add): the runner's checks see it
        def __call__(self, ev): ...

Each action is built once per hook point as ``cls(point, hook_type, env, **params)`` and called
with every Event of that point. The runner never asks an action's class; it asks what the action
declares:

| declared        | default  | what reads it                                                              |
|-----------------|----------|----------------------------------------------------------------------------|
| `records`       | False    | the "no hook records anything" warning; generate's beam check              |
| `modifies`      | False    | early_stop (only hooks that record and modify nothing may be cut short)    |
| `whole_forward` | False    | early_stop refused: the action reads the model's output (logit_lens)       |
| `keeps_mask`    | False    | the run stores /samples/attention_mask, named in data.store or not (lens)  |
| `positions`     | "all"    | mode=generate: which model calls it acts on (prompt / generated / all)     |
| `check_mode()`  | accepts  | prepare(): refuse the action for a mode before any batch (one ConfigError) |
| `reset()`       | no-op    | after the dry-run estimate: forget what the estimate's sample counted      |
| `restore()`     | no-op    | resume: the rows a replayed file already holds per (role, call)            |
| `skipped`       | None     | the end report: why a point a glob reached had nothing to record           |
| `check_item()`  | accepts  | prepare(): the dataset's first item, before any batch (a missing key)      |
| `check_tensor()`| accepts  | prepare(): the hooked tensor of one sample's forward (its width, its axes) |
|                 |          | (and an action's `what`: a tensor that forward gave, or a ConfigError)     |
| `state()`       | None     | each step: a snapshot of what the action kept so far, saved at each flush  |
| `load_state()`  | no-op    | resume: the snapshot of the last flush whose batches the file keeps        |
| `finish()`      | []       | the end of a complete run: captures written once (one row per feature)     |

A stateful action (top_examples) registers itself with `env.stateful` and keeps its state
in tensors: the loop puts `env.snapshot()` into each StepRecord, the store writes the latest one
under /state at each flush (with the rows it covers), resume hands it back to `load_state`, and
`finish()`'s captures are written when the run completes (hookrun.runner.action_state).

A user's own action may also be a `_target_` node: any callable that takes the Event; it is
wrapped in a Callback (hooks/actions/callback.py), which reads the same declarations from the callable's attributes
(`fn.records = True`), so a user's action is seen by every check as a built-in one is.

ModelHold: one owner of everything a run attaches to a model, undone in one place, last attached first.

    with ModelHold(model) as hold:          # a caller's live model: its state is noted first
        env = ActionEnv(hold=hold)          # splices, unfused attention, a lens' hook: hold.on_close(undo)
        with HookSession(points, env): ...  # the session's hook handles are held here too
    # every hook handle removed, every `.sae` child taken out, fused attention back on, then the
    # model's training and inplace flags, devices, requires_grad and .grad as they were

What a run attaches or changes, and who registers its undo here:
- the session's hook handles (hooks/session.py), a lens' unembed hook (hooks/actions/lens.py);
- a splice's `.sae` child module (hooks/splice.py), timm's fused attention turned off for op
  sites (hooks/plan.py);
- what an action opened for the run: a patch source's file (hooks/patch.py);
- a live model's own state (`ModelHold(model)`): run(cfg, model=m) and patch_grid(m, ...) hand
  the model back as it came in, on an exception too.

`close()` runs every undo even when one of them raises, then raises the first error; a second
`close()` has nothing left to do.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from hookrun.config.build import typed_params
from hookrun.errors import ConfigError, NotFoundError, Registry
from hookrun.hooks import Event, StepState
from hookrun.store.records import Capture, StepCaptures

if TYPE_CHECKING:
    from hookrun.config.schema import Mode
    from hookrun.hooks import HookPoint, HookType


Undo = Callable[[], None]


class ModelHold:
    def __init__(self, model: nn.Module | None = None) -> None:
        self._undo: list[Undo] = []
        if isinstance(model, nn.Module):
            self.on_close(_state_of(model))

    def on_close(self, undo: Undo) -> Undo:
        """Run `undo` when the hold closes (after everything registered later)."""
        self._undo.append(undo)
        return undo

    def forget(self, undo: Undo) -> None:
        """`undo` has been done already (a session that removed its own hooks)."""
        for i in range(len(self._undo) - 1, -1, -1):
            if self._undo[i] == undo:
                del self._undo[i]
                return

    @property
    def held(self) -> int:
        """How many undos are waiting."""
        return len(self._undo)

    def close(self) -> None:
        first: BaseException | None = None
        while self._undo:
            try:
                self._undo.pop()()
            except BaseException as exc:  # the model must come back whole: every undo runs
                first = first or exc
        if first is not None:
            raise first

    def __enter__(self) -> ModelHold:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _state_of(model: nn.Module) -> Undo:
    """What a run may change on a live model, and how to put it back: every module's training and
    `inplace` flag, each parameter's and buffer's device, each parameter's requires_grad and .grad."""
    modes = [(m, m.training, getattr(m, "inplace", None)) for m in model.modules()]
    params = [(p, p.device, p.requires_grad, p.grad) for p in model.parameters()]
    buffers = [(b, b.device) for b in model.buffers()]
    for p in model.parameters():  # a .grad the model came with is set aside, untouched: the run's backward
        p.grad = None             # would add into it (mode=grad's first batch), and give it back changed

    def restore() -> None:
        for m, training, inplace in modes:
            m.training = training
            if inplace is not None:
                m.inplace = inplace
        for p, device, requires_grad, grad in params:
            if p.device != device:
                p.data = p.data.to(device)
            p.requires_grad_(requires_grad)
            p.grad = grad
        for b, device in buffers:
            if b.device != device:
                b.data = b.data.to(device)

    return restore


@dataclass
class ActionEnv:
    """What actions share within a run."""

    captures: StepCaptures = field(default_factory=StepCaptures)
    state: StepState = field(default_factory=StepState)
    store_dtype: torch.dtype | None = None  # None: keep the tensor's dtype
    bfloat16: torch.dtype = torch.float32  # a bfloat16 record held as: float32 in a file (numpy has none); capture(): itself
    planned_samples: np.ndarray | None = None  # the dataset indices this run will see
    hold: ModelHold = field(default_factory=ModelHold)  # what the run attached to the model, undone at its end
    splices: list = field(default_factory=list)  # hooks/splice.py's Splice modules of this run (their .stats)
    # what a modify action returns in a kind's ablated forward, ablation(x, module, role); None: no ablation
    ablation: Callable[[torch.Tensor, str, str], torch.Tensor] | None = None
    model: Any = None  # the hooked model (unwrapped): actions that call its modules (logit_lens) find them here
    stateful: list = field(default_factory=list)  # actions with a state to save at each flush (top_examples)
    shared: dict = field(default_factory=dict)  # objects the actions of a run share, by name (logit_lens' final logits)

    def snapshot(self) -> dict[str, dict[str, Any]] | None:
        """Each stateful action's state after this step, by its state_key (None: no such action)."""
        return {a.state_key: a.state() for a in self.stateful} or None

    def close(self) -> None:
        """Undo everything the run attached (ModelHold), last attached first."""
        self.hold.close()


class Action:
    fits: frozenset[str] | None = None  # hook types it may be used with; None: all
    records: bool = False  # writes captures to the run's file (or the in-memory capture)
    modifies: bool = False  # replaces what PyTorch computes (an input, output or gradient)
    whole_forward: bool = False  # needs the forward to run to its end (early_stop is refused)
    keeps_mask: bool = False  # the run stores the batches' attention_mask in /samples (the lens pictures read it)
    positions: str = "all"  # mode=generate: the model calls it acts on (all | prompt | generated)

    def __init__(self, point: HookPoint, hook_type: HookType, env: ActionEnv, where: str = "") -> None:
        self.point = point
        self.hook_type = hook_type
        self.env = env
        self.where = where or f"hooks.{point.hook}"

    def __call__(self, ev: Event) -> None:
        raise NotImplementedError

    def check_mode(self, mode: Mode) -> None:
        """Raise ConfigError where this action cannot run in `mode` (a hookrun.config.schema.Mode,
        a str enum: Mode.generate == "generate")."""

    def reset(self) -> None:
        """Forget what was counted so far (the dry-run estimate ran one sample through the hooks)."""

    def restore(self, role: str, call: int, rows: int, module: str | None = None) -> None:
        """A resumed run: the file already holds `rows` rows of this action's (role, call)."""

    @property
    def skipped(self) -> str | None:
        """Why this action had nothing to do at its point (a module a glob reached that returns no
        tensor); None where it did. The end report lists these points."""
        return None

    def check_item(self, item: Any) -> None:
        """Raise ConfigError where the dataset's first item lacks what the action reads."""

    def check_tensor(self, role: str, tensor: Any) -> None:
        """Raise ConfigError where the tensor the hook sees (one sample's forward) does not fit."""

    @property
    def state_key(self) -> str:
        """The name of this action's state in the file (unique within a run)."""
        return f"{self.where}@{self.point.module}"

    def state(self) -> dict[str, Any] | None:
        """A copy of what the action kept so far: arrays or tensors (copied: the action goes on)."""
        return None

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        """A resumed run: the state saved with the last batch the file keeps."""

    def finish(self) -> list[Capture]:
        """The end of a complete run: captures to write once (Capture.features: one row per feature)."""
        return []


ACTIONS: Registry[type[Action]] = Registry("action")
register_action = ACTIONS.register


def declares(action: Any, name: str) -> bool:
    """Whether `action` has its own `name` (check_tensor, ...), not Action's, or its user function has one."""
    own = getattr(type(action), name, None)
    return own is not None and own is not getattr(Action, name) or callable(getattr(getattr(action, "fn", None), name, None))


def construct(cls: type, action_spec: Any, point: HookPoint, hook_type: HookType, env: ActionEnv) -> Any:
    """The action at one hook point, built with its checked params."""
    return cls(point, hook_type, env, where=action_spec.where, **action_params(cls, action_spec))


def action_class(action_spec: Any, hook_type: str) -> type:
    """The action's class, refused in one line where the registry has none or it does not fit the hook type."""
    try:
        cls = ACTIONS.get(action_spec.name)
    except NotFoundError as exc:
        raise ConfigError(f"{action_spec.where}: {exc}") from None
    if cls.fits is not None and hook_type not in cls.fits:
        raise ConfigError(f"{action_spec.where}: {action_spec.name} does not fit a {hook_type} hook; "
                          f"it works with type: {', '.join(sorted(cls.fits))}")
    return cls


def action_params(cls: type, action_spec: Any) -> dict[str, Any]:
    """The action's params checked against its class (keys, the numbers' types): no model needed."""
    params = inspect.signature(cls.__init__).parameters
    allowed = [p for p in params if p not in ("self", "point", "hook_type", "env", "where")]
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    unknown = [k for k in action_spec.params if k not in allowed]
    if unknown and not takes_any:
        raise ConfigError(
            f"{action_spec.where}: {action_spec.name} has no parameter {', '.join(map(repr, unknown))}; "
            f"its parameters: {', '.join(a for a in allowed if params[a].kind is not params[a].VAR_KEYWORD) or 'none'}"
        )
    return typed_params(cls.__init__, action_spec.params, action_spec.where)


# the built-in actions: name -> the module that registers it
for _name, _module in {"record": "record", "replace_input": "modify", "modify_output": "modify",
                       "modify_grad": "modify", "top_examples": "top_examples", "logit_lens": "lens"}.items():
    ACTIONS.register_lazy(_name, f"hookrun.hooks.actions.{_module}")
