"""Op sites that cannot fire, refused before any batch: fused attention, and a probe of one forward.

    check_fused_attention(points)              # at plan time: a softmax site in an sdpa/flash attention module
    kept = check_sites_run(points, model, lambda: model(**first_sample))   # a run, before its first batch

Fused attention (`attn_implementation: sdpa` or flash) never computes the attention probabilities,
so a `.../softmax` site inside such an attention module can never fire: the plan refuses it at
once, naming `model.attn_implementation=eager` (transformers' attention modules carry the model's
config, whose `_attn_implementation` says which kernel runs). Any other op site is checked by
running one forward of the first sample with the same interception the hooks use (the lister's,
hooks/sites.Listener): an op site named exactly (`transformer.h.0/add.1`, `/flatten`) that does
not run there is an error naming the calls its module does make; a glob (`**/softmax`,
`transformer.h.*.attn/matmul`) is an error only where none of the sites it reaches runs, and the
sites it reaches that do not run are dropped from the plan (logged), so a wide glob costs only
where its function is really called.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torch import Tensor, nn

from hookrun.errors import ConfigError, module_label
from hookrun.hooks import HookPoint, family, flatten

if TYPE_CHECKING:
    from hookrun.hooks.site_axes import Call

log = logging.getLogger("hookrun")
EAGER = "model.attn_implementation=eager"
FUSED_FNS = ("scaled_dot_product_attention", "flash_attn_func", "flash_attn_varlen_func", "flex_attention")


def attn_implementation(module: Any) -> str | None:
    """The attention kernel a transformers module (or model) runs: eager, sdpa, flash_attention_2 ..."""
    impl = getattr(getattr(module, "config", None), "_attn_implementation", None)
    return impl if isinstance(impl, str) else None


def fused_message(point: HookPoint, impl: str) -> str:
    return (f"hooks.{point.hook}.at: {point.module} never runs: {module_label(point.module.split('/')[0])} uses "
            f"attn_implementation={impl}, a fused kernel that never computes the attention probabilities; build the "
            f"model with eager attention: {EAGER} (a model of your own: "
            f"_from_config(cfg, attn_implementation='eager'))")


def missing_role(where: str, module: Any, role: str, tensors: dict) -> str:
    """Why a hook's firing has no `role` that a record's `what` names (tensors: the roles it has)."""
    if family(role) == "output":
        return no_output(where, module, role, [r for r in tensors if family(r) == "output"])
    has = ", ".join(tensors) or "no tensors"
    if family(role) == "grad_input" and not any(family(r) == "grad_input" for r in tensors):  # (all None: not among them)
        return (f"the {role} of {where} is None in the backward (no input of it needs a gradient: an embedding's input is "
                f"integer ids, or its input comes from frozen layers or torch.no_grad); it has: {has}; record "
                f"grad_output, or the gradient of the module before with type: tensor")
    if family(role).startswith("grad_"):
        return f"the backward of {where} has no {role} (or it is None: that input needs no gradient); it has: {has}"
    return f"{where} receives no {role}; it receives: {has}"


def no_output(where: str, module: Any, role: str, returned: list[str]) -> str:
    """Why `role` is not among a module's outputs (it returns None there, as attention weights under
    a fused kernel, or has no such output), naming what the module does return."""
    impl = attn_implementation(module)
    line = (f"{where} receives no {role}: it returns None there, or has no such output (a None is never "
            f"recorded); it returns: {', '.join(returned) or 'no tensor'}")
    if impl not in (None, "eager"):
        line += (f"; its attention runs attn_implementation={impl}, which returns None for the attention weights: "
                 f"build the model with eager attention: {EAGER} (a model of your own: "
                 f"_from_config(cfg, attn_implementation='eager'))")
    return line


def unfuse(modules: list[nn.Module], why: str) -> Callable[[], None]:
    """Switch timm-style attention modules (a `fused_attn` attribute, True: F.scaled_dot_product_attention,
    where no softmax or matmul of the attention runs) to their unfused path, which computes q @ k^T,
    softmax and @ v in the module's own code so op sites can fire; logs the switch. Returns what
    restores them (run at the end of the run: a live model comes back as it went in)."""
    switched = [m for m in dict.fromkeys(modules) if getattr(m, "fused_attn", None) is True]
    for m in switched:
        m.fused_attn = False
    if switched:
        log.info("%s: %d attention module(s) (%s) switched from fused attention to their unfused path "
                 "(fused_attn=False), so their softmax and matmuls run; same results, slower",
                 why, len(switched), type(switched[0]).__name__)

    def restore() -> None:
        for m in switched:
            m.fused_attn = True

    return restore


def check_attention(points: list[HookPoint], hold: Any) -> None:
    """The plan's checks where a point names an op site or an attention module's weights: timm's
    fused attention switched to its unfused path for op sites (switched back when `hold` closes), a
    softmax site or a weights output under a fused kernel refused (below)."""
    hold.on_close(unfuse([p.target for p in points if p.site is not None], "op sites"))
    check_fused_attention(points)
    check_attention_weights(points)


def check_attention_weights(points: list[HookPoint]) -> None:
    """`record what: output.1` on a transformers attention module whose kernel is fused (sdpa, flash):
    its weights output is always None there, so it is refused when the plan is made (before any
    batch), with the same line a firing would give: where named exactly, and for a glob where every
    module it reaches is such a module (a glob would otherwise skip them all: an empty capture)."""
    groups: dict[str, list[tuple[HookPoint, Any]]] = {}
    for p in points:
        for action in p.actions:
            if p.site is None and "output.1" in (getattr(action, "what", None) or ()):
                groups.setdefault(p.hook, []).append((p, action))
    for group in groups.values():
        fused = [(p, a) for p, a in group if "Attention" in type(p.target).__name__
                 and attn_implementation(p.target) not in (None, "eager")]
        exact = [(p, a) for p, a in fused if not p.globbed]
        if exact or (fused and len(fused) == len(group)):
            p, action = (exact or fused)[0]
            raise ConfigError(f"{action.where}: record what='output.1': "
                              + no_output(module_label(p.module), p.target, "output.1", ["output.0"]))


def check_fused_attention(points: list[HookPoint]) -> None:
    """A softmax op site on a transformers module whose attention runs a fused kernel: refused where
    named exactly, and for a glob where every module it reaches is such a module."""
    groups: dict[tuple, list[HookPoint]] = {}
    for p in points:
        if p.site is not None and p.site[0] == "softmax":
            groups.setdefault((p.hook, p.site) if p.globbed else (p.hook, p.module), []).append(p)
    for group in groups.values():
        impls = [attn_implementation(p.target) for p in group]
        if all(impl not in (None, "eager") for impl in impls):
            raise ConfigError(fused_message(group[0], impls[0]))


def check_sites_run(points: list[HookPoint], model: nn.Module, forward: Callable[[], Any]) -> list[HookPoint]:
    """Run `forward()` once (one sample, no_grad, the caller's) listening to the op sites' modules;
    refuse what cannot fire, and return the points without the globbed sites that did not run."""
    sites = [p for p in points if p.site is not None]
    if not sites:
        return points
    # (op sites only: loaded where a plan names one)
    from hookrun.hooks.site_axes import Call, site_axes
    from hookrun.hooks.sites import Listener

    calls: dict[nn.Module, dict[str, int]] = {}  # module -> FN -> calls in one forward of it (the most)
    structure: dict[nn.Module, list[Call]] = {}  # module -> the calls of its first forward (site_axes)
    done: set[nn.Module] = set()

    def on_call(module: nn.Module, fn: str, k: int, func: Any, args: tuple, result: Any) -> None:
        seen = calls.setdefault(module, {})
        seen[fn] = max(seen.get(fn, 0), k + 1)
        kept = structure.setdefault(module, [])
        if module in done or (k == 0 and any(c.fn == fn and c.k == 0 for c in kept)):
            done.add(module)  # a second forward of the module: its first one is the structure
            return
        out = {"output": result} if isinstance(result, Tensor) else flatten(result, "output")
        kept.append(Call(fn, k, flatten(args, "input"), out))

    listener = Listener(on_call, model)
    handles = [h for m in dict.fromkeys(p.target for p in sites) for h in listener.watch(m)]
    try:
        forward()
    finally:
        for h in reversed(handles):
            h.remove()

    def runs(p: HookPoint) -> bool:
        fn, call = p.site
        n = calls.get(p.target, {}).get(fn, 0)
        return n > 0 and (call is None or call < n)

    found = {m: site_axes(c) for m, c in structure.items()}
    for p in sites:  # the axis names the structure of the calls gives (site_axes), for dims.meaning: the whole
        p.axes = found.get(p.target, {})  # module's, so that dims.meaning knows its pattern came from the structure
    structure.clear()
    dead = [p for p in sites if not runs(p)]
    for p in dead:
        if not p.globbed:
            raise ConfigError(_why(p, calls.get(p.target, {}), model))
    groups: dict[tuple, list[HookPoint]] = {}  # the sites one glob of one hook reached
    for p in sites:
        if p.globbed:
            groups.setdefault((p.hook, p.site), []).append(p)
    for group in groups.values():
        if all(p in dead for p in group):
            raise ConfigError(_why(group[0], calls.get(group[0].target, {}), model, group))
    if dead:
        log.info("op sites that a glob reached but that never run in one forward of the first sample, dropped: %s",
                 ", ".join(f"{p.hook}@{p.module}" for p in dead))
    return [p for p in points if p not in dead]


def _why(p: HookPoint, seen: dict[str, int], model: nn.Module, group: list[HookPoint] | None = None) -> str:
    """One line: why the site cannot fire, and what its module does call."""
    fn, call = p.site
    impl = attn_implementation(p.target) or attn_implementation(model)
    if impl not in (None, "eager") and (fn == "softmax" or any(f in seen for f in FUSED_FNS)):
        return fused_message(p, impl)
    module = module_label(p.module.split("/")[0])
    if seen.get(fn) and call is not None:  # it calls fn, fewer times than the call named
        head = f"{p.module} never runs" if group is None else (
            f"{fn}.{call} runs at none of the {len(group)} modules a glob reaches "
            f"({', '.join(module_label(q.module.split('/')[0]) for q in group[:4])}{', ...' if len(group) > 4 else ''})")
        return (f"hooks.{p.hook}.at: {head}: {module} calls {fn} {seen[fn]} time(s) per forward "
                f"({fn}.0 to {fn}.{seen[fn] - 1}); `{p.module.rsplit('.', 1)[0]}` takes every call")
    own = ", ".join(sorted(seen)[:15]) + (", ..." if len(seen) > 15 else "") if seen else "no torch function"
    if group is None:
        head = f"{p.module} never runs in one forward of the first sample: {module}'s own code does not call {fn}"
    else:
        names = [module_label(q.module.split("/")[0]) for q in group]
        head = (f"{fn} is called by none of the {len(group)} modules a glob reaches ({', '.join(names[:4])}"
                f"{', ...' if len(names) > 4 else ''}) in one forward of the first sample")
    return (f"hooks.{p.hook}.at: {head} (calls inside a child module belong to the child); {module} calls {own}; "
            f"python -m hookrun.modules ... --ops lists every op site")
