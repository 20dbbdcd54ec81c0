"""The cells' action (PatchCells): what an activation-patching run puts on every site, a hooks action
attached through the plan like any other.

    state = PatchState()
    point.actions.append(PatchCells(point, hook_type, env, state=state))
    state.mode = CellMode.KEEP; model(clean)        # state.kept[module]: each site's output
    state.begin_patch({"blocks.0.hook_z": [(0, (3, 1))]}, sources, batch=8)   # copy 0: position 3, head 1
    model(corrupt.repeat(copies, 1))         # each copy of the batch gets its own cells patched

One shared PatchState says what every site does in the forward in flight:

| mode  | at each site's output (its first call of the forward)                                      |
|-------|---------------------------------------------------------------------------------------------|
| off   | nothing                                                                                     |
| keep  | keeps a detached copy in `kept[module]`                                                     |
| patch | the batch is `copies` copies of `batch` items; for each (copy, index) of `plan[module]`, the |
|       | copy's rows at `index` (over the tensor's axes after the sample axis) get `sources[module]`  |
| grad  | adds zeros that require grad (`deltas[module]`): d metric / d delta is d metric / d output   |

An output that is a tuple is patched at its first tensor (`output.0`). A spliced SAE's latents
(`MODULE.sae.latents`) are an identity module: a replaced latent makes the splice decode it (with
error_term the rest of the output stays the model's own), so the gradient to a latent is the one
through the decoder, as with SAELens' error term.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

import torch

from hookrun.hooks import Event
from hookrun.hooks.actions import Action, ActionEnv

if TYPE_CHECKING:
    from hookrun.hooks import HookPoint, HookType


class CellMode(Enum):
    """What every site does in the forward in flight (the table above)."""

    OFF = "off"
    KEEP = "keep"
    PATCH = "patch"
    GRAD = "grad"


@dataclass
class PatchState:
    mode: CellMode = CellMode.OFF
    kept: dict[str, torch.Tensor] = field(default_factory=dict)
    plan: dict[str, list[tuple[int, tuple]]] = field(default_factory=dict)
    sources: dict[str, torch.Tensor] = field(default_factory=dict)
    deltas: dict[str, torch.Tensor] = field(default_factory=dict)
    batch: int = 0

    def begin_patch(self, plan: dict[str, list[tuple[int, tuple]]], sources: dict[str, torch.Tensor], batch: int) -> None:
        self.mode, self.plan, self.sources, self.batch = CellMode.PATCH, plan, sources, batch


class PatchCells(Action):
    fits = frozenset({"forward"})
    modifies = True

    def __init__(self, point: HookPoint, hook_type: HookType, env: ActionEnv, where: str = "",
                 state: PatchState | None = None) -> None:
        super().__init__(point, hook_type, env, where)
        self.state = state if state is not None else PatchState()

    def __call__(self, ev: Event) -> None:
        s = self.state
        if s.mode is CellMode.OFF or ev.call != 0:
            return
        role = "output" if "output" in ev.tensors else "output.0"
        x = ev.tensors.get(role)
        if not isinstance(x, torch.Tensor):
            return
        if s.mode is CellMode.KEEP:
            s.kept[ev.module] = x.detach().clone()
        elif s.mode is CellMode.GRAD:
            delta = torch.zeros_like(x, requires_grad=True)
            s.deltas[ev.module] = delta
            ev.replace(role, x + delta)
        elif s.mode is CellMode.PATCH and ev.module in s.plan:
            y = x.clone()
            view = y.view(-1, s.batch, *y.shape[1:])
            src = s.sources[ev.module]
            every = slice(None)
            for copy, index in s.plan[ev.module]:
                view[(copy, every, *index)] = src[(every, *index)]
            ev.replace(role, y)
