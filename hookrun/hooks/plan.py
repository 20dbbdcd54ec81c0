"""The plan: each hook spec resolved to the concrete modules (or parameters) it hooks.

    points = resolve_targets(model, ("layer1.*",), hook="fmap", kind="module")
    [name for name, _ in points]  # ['layer1.0', 'layer1.1']

Names are those of `named_modules()` / `named_parameters()`; `''` is the whole model. In a glob,
`*` and `?` stay inside one dotted component and `**` crosses components: `layer*.0.conv?`,
`layer1.*` (the blocks of layer1), `**.relu` (every module named relu, at any depth).

    split_site("transformer.h.0/add.1", set(dict(model.named_modules())))  # ("transformer.h.0", "add", 1)

`split_site` tells an op site's name (`MODULE/FN[.k]`) from a module's when a plan is made; the
sites themselves (hooks/sites.py) load only where a plan names one. `last_roles(module, model)`
(HookPoint.last, set here) says which of a module's 4-D tensors are channels last, (batch, height,
width, channels): timm's Swin, torchvision's Permute to NHWC (channels_last()).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import Any

from torch import nn

from hookrun.config.build import build_user_action
from hookrun.config.schema import Mode
from hookrun.errors import ConfigError, NotFoundError
from hookrun.hooks import HOOK_TYPES, HookPoint, HookType
from hookrun.hooks.actions import ActionEnv, action_class, construct

GLOB_CHARS = set("*?[")
SITE = re.compile(r"^(?P<module>.*)/(?P<fn>[A-Za-z_][A-Za-z0-9_]*)(?:\.(?P<call>\d+))?$")  # an op site's name (hooks/sites.py)
log = logging.getLogger("hookrun")


def is_glob(pattern: str) -> bool:
    return any(c in GLOB_CHARS for c in pattern)


def glob_regex(pattern: str) -> re.Pattern[str]:
    """Translate a dotted-path glob: `*` within a component, `**` across components (`**.relu` is
    every module named relu, the top level's too: `**.` stands for no component as well)."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**.", i):
            out.append(r"(?:.*\.)?")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append(r"[^.]*")
        elif c == "?":
            out.append(r"[^.]")
        elif c == "[":
            end = pattern.find("]", i + 1)
            if end < 0:
                out.append(re.escape(c))
            else:
                body = pattern[i + 1 : end].replace("\\", "\\\\")
                if body.startswith("!"):
                    body = "^" + body[1:]
                out.append(f"[{body}]")
                i = end
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out) + r"\Z")


def resolve_targets(
    model: nn.Module, patterns: Iterable[str], hook: str, kind: str = "module", where: str | None = None
) -> list[tuple[str, Any]]:
    """The (name, module-or-parameter) pairs the patterns select, in model order, each once.
    `where` starts the error messages (default `hooks.HOOK.at`; the lister's is `--match`)."""
    where, patterns = where or f"hooks.{hook}.at", list(patterns)
    model = unwrap(model)
    # every name of a tied parameter (GPT-2's lm_head.weight is transformer.wte.weight)
    table = dict(model.named_parameters(remove_duplicate=False) if kind == "param" else model.named_modules())
    names = list(table)
    chosen: set[str] = set()
    for pattern in patterns:
        if is_glob(pattern):
            regex = glob_regex(pattern)
            hits = [n for n in names if n and regex.match(n)]  # (a glob never names the whole model, '')
            if not hits:
                from hookrun.hooks.plan_checks import unmatched

                raise unmatched(model, pattern, names, where, kind, glob=True)
            chosen.update(hits)
        elif pattern in table:
            chosen.add(pattern)
        else:
            from hookrun.hooks.plan_checks import unmatched

            raise unmatched(model, pattern, names, where, kind)
    found = [(n, table[n]) for n in names if n in chosen]
    if kind != "param":  # (named_modules() lists each module once; a tied parameter has two names)
        return found
    from hookrun.hooks.grad_hooks import once_each

    return once_each(found, patterns, where)


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside DDP / DataParallel (`.module`) and torch.compile (`._orig_mod`) wrappers, so
    `at: layer1` names the same module as on the bare model (not `module.layer1`)."""
    while True:
        if isinstance(model, nn.parallel.DistributedDataParallel | nn.DataParallel):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), nn.Module):  # torch.compile's OptimizedModule
            model = model._orig_mod
        else:
            return model


def make_plan(model: nn.Module, specs: list, env: ActionEnv, mode: Mode | str) -> list[HookPoint]:
    """Every (hook spec, module) pair as a HookPoint with its actions built and checked."""
    mode = Mode(mode)
    points: list[HookPoint] = []
    env.model = unwrap(model)  # actions that call the model's own modules (logit_lens) find them here
    # splices add their module (and its latents) to the model first: MODULE.sae.latents may be hooked
    if any(not a.is_target and a.params.get("op") == "splice" for spec in specs for a in spec.actions):
        from hookrun.hooks import (
            splice,  # (the SAE readers behind it load only for a run that splices)
        )

        splice.install(model, specs, env, lambda spec: _targets(model, spec, HOOK_TYPES.get(spec.type)))
    for spec in specs:
        try:
            hook_type = HOOK_TYPES.get(spec.type)
        except NotFoundError as exc:
            raise ConfigError(f"hooks.{spec.name}.type: {exc}") from None
        if hook_type.needs_grad and mode is not Mode.grad:
            raise ConfigError(
                f"hooks.{spec.name}.type={spec.type} sees gradients, which exist only with "
                f"mode=grad (and a loss, e.g. loss=cross_entropy)"
            )
        targets = _targets(model, spec, hook_type)
        if hook_type.on == "param":  # (a frozen parameter: hooks/grad_hooks.py)
            from hookrun.hooks.grad_hooks import trainable

            targets = trainable(spec, targets)
        for name, target, site in targets:
            point = HookPoint(spec.name, spec.type, name, target, globbed=name not in spec.at, site=site,
                              last=last_roles(target, env.model) if site is None else ())  # (channels-last 4-D roles)
            for action_spec in spec.actions:
                if action_spec.is_target:
                    from hookrun.hooks.actions.callback import Callback

                    fn = build_user_action(action_spec, point, hook_type, env)
                    point.actions.append(Callback(fn, point, hook_type, env, where=action_spec.where))
                    continue
                cls = action_class(action_spec, spec.type)
                point.actions.append(construct(cls, action_spec, point, hook_type, env))
            if sum(type(a).__name__ == "Record" for a in point.actions) > 1:  # (hooks/plan_checks.py)
                from hookrun.hooks.plan_checks import check_record_twins

                check_record_twins(point)
            if site is not None:  # an op site (hooks/sites.py: loaded only where the plan names one)
                from hookrun.hooks.sites import check_site_actions

                check_site_actions(point, site[0])
            points.append(point)
    if any(p.site is not None or any("output.1" in (getattr(a, "what", None) or ()) for a in p.actions) for p in points):
        from hookrun.hooks.site_check import check_attention
        check_attention(points, env.hold)  # (site_check.py loads only for op sites and attention weights)
    return points


SITE_TYPES = ("forward", "forward_pre", "tensor")


def _targets(model: nn.Module, spec: Any, hook_type: HookType) -> list[tuple[str, Any, tuple | None]]:
    """(name, target, site) of every point of a hook spec: modules (or parameters) as resolve_targets
    finds them, and op sites `MODULE/FN[.k]` on the modules their module part names."""
    names = set(dict(unwrap(model).named_modules())) if hook_type.on == "module" else set()
    plain, out = [], []
    for pattern in spec.at:
        parts = split_site(pattern, names) if hook_type.on == "module" else None
        if parts is None:
            plain.append(pattern)
            continue
        if spec.type not in SITE_TYPES:
            raise ConfigError(f"hooks.{spec.name}: {pattern!r} is an op site; it takes type: {', '.join(SITE_TYPES)}, "
                              f"not {spec.type}")
        module, fn, call = parts
        for name, target in resolve_targets(model, [module], spec.name):
            out.append((f"{name}/{fn}" + (f".{call}" if call is not None else ""), target, (fn, call)))
    out += [(name, target, None) for name, target in resolve_targets(model, plain, spec.name, hook_type.on)] if plain else []
    return out


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
