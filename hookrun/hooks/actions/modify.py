"""The modify actions: replace what a hook sees, and PyTorch carries on with the replacement.

    actions: [{name: modify_output, op: scale, factor: 0.0}, record]   # ablate, then record
    actions: [{name: replace_input, op: noise, std: 0.1, seed: 0}]
    actions: [{name: modify_grad, op: zero}]

| action        | hook types                | replaces                                     |
|---------------|---------------------------|----------------------------------------------|
| replace_input | forward_pre, backward_pre | the module's positional input / grad_output  |
| modify_output | forward                   | the module's output                          |
| modify_grad   | backward, tensor, param   | grad_input / the gradient                    |

`arg: N` picks one tensor of a tuple (the N-th positional input, say), `arg: NAME` a keyword input
(`arg: hidden_states`, given as a keyword or positionally); without it every tensor of that kind
is replaced (for inputs: every positional one; keyword inputs are replaced only by name). Naming an input the module does not receive is an error, never a silent no-op. The op is a built-in name (hookrun.hooks.ops) or a `_target_` callable.
Under a kind with an ablation (env.ablation), the batch's ablated forward replaces each selected tensor by
`env.ablation(x, module, role)` (zeros, or a mean) instead of the op's result: every op, a splice
included, is ablated the same way.
With mode=generate the action runs at every model call inside `generate`; `positions: prompt`
keeps it to the prompt pass, `positions: generated` to the passes over new tokens (default `all`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch

from hookrun.config.schema import Mode
from hookrun.errors import PASSED, ConfigError, HookrunError, RunError, foreign_failure
from hookrun.hooks import Event, family, patch, splice  # noqa: F401  (register ops patch, splice)
from hookrun.hooks.actions import ACTIONS, Action
from hookrun.hooks.ops import OPS, OpBuild, OpContext, build_op
from hookrun.hooks.roles import positional_index
from hookrun.hooks.tokens import PHASES

if TYPE_CHECKING:
    from hookrun.hooks import HookPoint, HookType
    from hookrun.hooks.actions import ActionEnv

log = logging.getLogger("hookrun")

class Modify(Action):
    modifies = True

    def __init__(self, point: HookPoint, hook_type: HookType, env: ActionEnv, where: str = "", op: Any = None, arg: int | str | None = None,
                 positions: str = "all", **params: Any) -> None:
        super().__init__(point, hook_type, env, where)
        if positions not in PHASES:
            raise ConfigError(f"{self.where}: positions={positions!r}; choose from: {', '.join(PHASES)}")
        self.positions = positions
        if op is None:
            raise ConfigError(f"{self.where}: needs op: one of {', '.join(OPS)}, or op: {{_target_: my_pkg.fn, _partial_: true}}")
        self.op = build_op(op, params, self.where, build=OpBuild(point, hook_type.writable, env))
        self.op_name = op if isinstance(op, str) else str(op.get("_target_", op))
        self.checks_tensor = callable(getattr(self.op, "check_tensor", None))  # (probe_steer's width: before any batch)
        if arg is not None and (isinstance(arg, bool) or not isinstance(arg, int | str) or arg == ""):
            raise ConfigError(f"{self.where}: arg {arg!r}; give a position (arg: 0) or an argument name (arg: hidden_states)")
        self.arg = arg
        # an argument name that may come positionally: its position in forward()'s signature
        self.position = positional_index(point.target, arg) if isinstance(arg, str) else None

    def check_mode(self, mode: Mode) -> None:
        if self.positions != "all" and mode is not Mode.generate:
            raise ConfigError(f"{self.where}: positions: {self.positions} needs mode=generate (a plain forward pass has "
                              f"no generated tokens); drop positions or set mode=generate")
        if mode is Mode.generate and self.op_name == "patch" and self.positions != "prompt":
            raise ConfigError(f"{self.where}: op patch with positions: {self.positions} in mode=generate: the source's rows "
                              f"are the prompt's tokens, and the passes over new tokens have none; give positions: prompt")

    def check_tensor(self, role: str, tensor: Any) -> None:
        """The op's own check of the tensor it would change (one sample's forward, before any batch)."""
        if self.checks_tensor and self.selects(role, self.hook_type.writable) and hasattr(tensor, "dim"):
            self.op.check_tensor(tensor, self.point.target)

    def in_phase(self, ev: Event) -> bool:
        tokens = ev.state.call_tokens
        if tokens is None or tokens.provisional:  # no CallTracker: a plain forward
            raise RunError(f"{self.where}: positions: {self.positions} needs mode=generate (a plain forward pass has no generated tokens)")
        return tokens.generated == (self.positions == "generated")

    def selects(self, role: str, writable: str) -> bool:
        if family(role) != writable:
            return False
        if self.arg is None:
            return True
        named = f"{writable}.{self.arg}"
        return role == named or role.startswith(named + ".") or (self.arg == 0 and role == writable)

    def __call__(self, ev: Event) -> None:
        if self.positions != "all" and not self.in_phase(ev):
            return
        roles = [r for r in ev.tensors if self.selects(r, ev.writable)]
        if not roles and self.position is not None:  # hidden_states given positionally
            at = f"{ev.writable}.{self.position}"
            roles = [r for r in ev.tensors if r == at or r.startswith(at + ".") or (self.position == 0 and r == ev.writable)]
        if self.arg is None and ev.writable == "input":  # without arg: the positional inputs, as before keywords
            roles = [r for r in roles if r == "input" or r.split(".")[1].isdigit()]
            if not roles:
                raise RunError(f"{self.where}: {ev.where} receives its inputs as keywords ({', '.join(ev.tensors)}); "
                               f"name the one to replace with arg: NAME (e.g. arg: hidden_states)")
        if not roles and self.arg is not None:
            raise RunError(f"{self.where}: arg {self.arg}: {ev.where} receives no {ev.writable}.{self.arg}; "
                           f"it receives: {', '.join(ev.tensors) or 'no tensors'}")
        if roles and isinstance(ev.raw, list) and any(isinstance(item, dict) for item in ev.raw):
            raise RunError(f"{self.where}: {ev.where} returns a list with a dict per sample (a detection model's "
                           f"output): an op cannot change it in place of the model, so nothing would change; modify "
                           f"a tensor inside the model instead (python -m hookrun.modules lists them)")
        if ev.state.phase.ablate:  # the ablated forward: the ablation, not the op
            for role in roles:
                ev.replace(role, self.env.ablation(ev.tensors[role], ev.module, role))
            return
        for role in roles:
            ctx = OpContext(ev.hook, ev.target, ev.module, role, ev.step, ev.call, ev.state.sample_index,
                            ev.state.call_tokens)
            try:
                new = self.op(ev.tensors[role], ctx)
            except (HookrunError, *PASSED):
                raise
            except BaseException as exc:  # a bad parameter value, or a bug in a user's op (its sys.exit too): one line
                raise foreign_failure(f"{self.where}: op {self.op_name} failed at {ev.where} ({role}, batch {ev.step}):",
                                      exc) from exc
            old = ev.tensors[role]
            if not isinstance(new, torch.Tensor) or (new.shape, new.dtype, new.device) != (old.shape, old.dtype, old.device):
                got = (f"shape {tuple(new.shape)} {new.dtype} on {new.device}" if isinstance(new, torch.Tensor)
                       else type(new).__name__)
                raise RunError(f"{self.where}: op {self.op_name} returned {got} at {ev.where} ({role}, batch {ev.step}); "
                               f"an op returns a tensor like the one it is given: shape {tuple(old.shape)} {old.dtype} "
                               f"on {old.device}")
            ev.replace(role, new)


@ACTIONS.register("replace_input")
class ReplaceInput(Modify):
    fits = frozenset({"forward_pre", "backward_pre"})


@ACTIONS.register("modify_output")
class ModifyOutput(Modify):
    fits = frozenset({"forward"})


@ACTIONS.register("modify_grad")
class ModifyGrad(Modify):
    fits = frozenset({"backward", "tensor", "param"})
    warned = False  # (the one warning of a backward hook whose grad_input is None)

    def __call__(self, ev: Event) -> None:
        if ev.type == "backward" and self.arg is None and not self.warned and "grad_input" not in map(family, ev.tensors):
            self.warned = True  # PyTorch gives None where no input needs a gradient: an embedding's integer ids
            log.warning("%s: modify_grad has no gradient to modify at %s: its grad_input is None (no input of it needs "
                        "a gradient: an embedding's input is integer ids), so nothing changes; modify its grad_output "
                        "(type: backward_pre, replace_input) or its output's gradient (type: tensor, modify_grad)",
                        self.where, ev.where)
        super().__call__(ev)
