"""The plan: each hook spec resolved to the concrete modules (or parameters) it hooks.

    points = resolve_targets(model, ("layer1.*",), hook="fmap", kind="module")
    [name for name, _ in points]  # ['layer1.0', 'layer1.1']

Names are those of `named_modules()` / `named_parameters()`; `''` is the whole model. In a glob,
`*` and `?` stay inside one dotted component and `**` crosses components: `layer*.0.conv?`,
`layer1.*` (the blocks of layer1), `**.relu` (every module named relu, at any depth).
"""

from __future__ import annotations

import inspect
import logging
import re
from collections.abc import Iterable
from typing import Any

from torch import nn

from hookrun.config import typed_params
from hookrun.config.build import build_user_action
from hookrun.config.schema import Mode
from hookrun.errors import ConfigError, NotFoundError, close_matches
from hookrun.hooks.actions import ACTIONS, ActionEnv, Callback
from hookrun.hooks.hook_types import HOOK_TYPES, HookPoint, HookType, last_roles, split_site

GLOB_CHARS = set("*?[")
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
                raise ConfigError(
                    f"{where}: the pattern {pattern!r} matches no {_noun(kind)} of "
                    f"{type(model).__name__}; {_hint(pattern, names, kind)}"
                )
            chosen.update(hits)
        elif pattern in table:
            chosen.add(pattern)
        else:
            refuse_alias(model, pattern, where, kind)
            raise NotFoundError(
                f"{where}: {type(model).__name__} has no {_noun(kind)} {pattern!r}; "
                f"{_hint(pattern, names, kind)}"
            )
    return _once_each([(n, table[n]) for n in names if n in chosen], patterns, where)


def _once_each(found: list[tuple[str, Any]], patterns: Iterable[str], where: str) -> list[tuple[str, Any]]:
    """A tied parameter reached by two of its names (a glob's `**.weight`, or both named: GPT-2's
    transformer.wte.weight and lm_head.weight) is one tensor: hooked twice, its gradient would be edited
    twice (scale 0.5 giving 0.25) and recorded twice. It is kept once, by the name `at:` gives exactly,
    else its first; one warning names the others."""
    exact, kept, dropped = set(patterns), {}, []
    for name, target in found:
        first = kept.setdefault(id(target), (name, target))
        if first[0] != name:
            if name in exact and first[0] not in exact:
                kept[id(target)] = (name, target)
                name = first[0]
            dropped.append((name, kept[id(target)][0]))
    if dropped:
        log.warning("%s: %s: one tensor under two names (tied), hooked once", where,
                    ", ".join(f"{a} is {b}" for a, b in dropped))
    return [x for x in found if kept[id(x[1])][0] == x[0]]


# (what a one-call reader says of a second name: sae.at, attribution.at)
ONCE_PER_FORWARD = ("it runs once for each of its names, and {w} takes a module that runs once per forward: name "
                    "one outside it, or give each use a block of its own")


def refuse_alias(model: nn.Module, pattern: str, where: str, kind: str = "module", then: str | None = None) -> None:
    """A module registered under a second name (`nn.ModuleList([block] * 4)`: layers.1 is layers.0) is
    listed by named_modules() under its first name only: say which, and that its calls are captured apart."""
    if kind != "module":
        return
    target = dict(model.named_modules(remove_duplicate=False)).get(pattern)
    first = next((n for n, m in model.named_modules() if m is target), None) if target is not None else None
    if first is not None:
        raise ConfigError(f"{where}: {pattern!r} is the module {first!r} under a second name (one object, registered "
                          f"twice: a shared or reused block); " + (then or f"hook {first!r}: each of its calls in a "
                          f"forward is captured apart (output, output@1, ...; python -m hookrun.modules shows its calls)"))


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


def _noun(kind: str) -> str:
    return "parameter" if kind == "param" else "module"


def _hint(pattern: str, names: list[str], kind: str) -> str:
    close = close_matches(pattern.replace("*", "").replace("?", ""), [n for n in names if n])
    if close:
        return "closest names: " + ", ".join(close)
    if kind == "param":
        shown = names[:8] + (["..."] if len(names) > 10 else []) + names[-2:] if len(names) > 10 else names
        return f"its {len(names)} parameters include: " + ", ".join(shown)
    top = [n for n in names if n and "." not in n][:12]
    return f"top-level {_noun(kind)}s: " + ", ".join(top)


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
        for name, target, site in _trainable(spec, _targets(model, spec, hook_type)):
            point = HookPoint(spec.name, spec.type, name, target, globbed=name not in spec.at, site=site,
                              last=last_roles(target, env.model) if site is None else ())  # (channels-last 4-D roles)
            for action_spec in spec.actions:
                if action_spec.is_target:
                    fn = build_user_action(action_spec, point, hook_type, env)
                    point.actions.append(Callback(fn, point, hook_type, env, where=action_spec.where))
                    continue
                cls = action_class(action_spec, spec.type)
                point.actions.append(_construct(cls, action_spec, point, hook_type, env))
            check_record_twins(point)
            if site is not None:  # an op site (hooks/sites.py: loaded only where the plan names one)
                from hookrun.hooks.sites import check_site_actions

                check_site_actions(point, site[0])
            points.append(point)
    if any(p.site is not None or any("output.1" in (getattr(a, "what", None) or ()) for a in p.actions) for p in points):
        from hookrun.hooks.site_check import check_attention
        check_attention(points, env.hold)  # (site_check.py loads only for op sites and attention weights)
    return points


def check_record_twins(point: HookPoint) -> None:
    """Two records of one tensor in one hook are numbered in the order they fire in a call (output,
    output@1: before and after an edit); one that keeps other steps or stops sooner (every, limit)
    would hand its name to the other's rows once it skips a batch, so they must share every and limit."""
    records = [a for a in point.actions if type(a).__name__ == "Record"]
    for i, a in enumerate(records):
        for b in records[i + 1:]:
            same = not a.what or not b.what or any(x == y or x.startswith(y + ".") or y.startswith(x + ".")
                                                   for x in a.what for y in b.what)
            if same and (a.every, a.limit) != (b.every, b.limit):
                role = next((x for x in a.what if x in b.what), (a.what or b.what or ("its tensors",))[0])
                limits = [f"every: {r.every}, limit: {'null' if r.limit is None else r.limit}" for r in (a, b)]
                raise ConfigError(f"{b.where}: a second record of {role} in hook {point.hook!r} with another every/limit "
                                  f"({limits[0]}; here {limits[1]}); the two "
                                  f"are numbered by the order they fire ({role}, {role}@1), so once one skips a batch "
                                  f"the other's rows would take its name; give one of them a hook of its own (the same "
                                  f"at: under another name)")


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


def _trainable(spec: Any, targets: list) -> list:
    """A param hook's parameters that get a gradient: a frozen one (requires_grad=False; PyTorch refuses a
    hook on it) named exactly, or the only kind a glob reaches, is an error; a glob's others are left out."""
    frozen = [name for name, t, _ in targets if isinstance(t, nn.Parameter) and not t.requires_grad]
    if not frozen:
        return targets
    kept = [x for x in targets if x[0] not in frozen]
    named = [name for name in frozen if name in spec.at]
    if named or not kept:
        what = f"parameter {named[0]!r} is" if named else f"every parameter it reaches ({', '.join(frozen[:4])}) is"
        raise ConfigError(f"hooks.{spec.name}.at: {what} frozen (requires_grad=False), so no gradient reaches it and "
                          f"a param hook cannot be set; unfreeze it (.requires_grad_(True)) or hook one that trains; "
                          f"the gradient of a module's output: type: tensor")
    log.warning("hooks.%s: %d frozen parameter(s) (requires_grad=False) that a glob of `at:` reached left out, as no "
                "gradient reaches them: %s", spec.name, len(frozen), ", ".join(frozen[:8]) + (", ..." if len(frozen) > 8 else ""))
    return kept


def _construct(cls: type, action_spec: Any, point: HookPoint, hook_type: HookType, env: ActionEnv) -> Any:
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
