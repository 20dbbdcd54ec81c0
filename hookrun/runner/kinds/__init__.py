"""Run kinds: what a batch does (one module per kind) and the table that picks one for a config.

    from hookrun.runner.kinds import kind_for
    kind_cls = kind_for(cfg)            # EvaluateKind where cfg.evaluate is on, else by cfg.mode
    kind_cls.check(cfg)                 # refusals, before anything is built

| kind        | module           | chosen by                  | forwards per batch                      |
|-------------|------------------|----------------------------|-----------------------------------------|
| record      | run_kind.py      | mode=eval                  | 1 (no_grad; early_stop may cut it)      |
| grad        | grad_kind.py     | mode=grad                  | 1 forward + loss + backward             |
| generate    | generate_kind.py | mode=generate              | 1 model.generate (a call per token)     |
| a plugin    | <name>/          | its block (`evaluate:`, `patching:`, `attribution:`, `probe:`, ...) | its own |

A kind with a block of its own is a plugin (hookrun/config/plugins.py): a folder whose __init__.py
holds `KIND = KindPlugin(...)` (its block's dataclass, its RunKind, its reader, its notebook
function, its named ops), found on disk or through an entry point, imported only when a config gives its block
(docs/architecture.md walks through one). A kind plugin is on where its block is given and its
RunKind's `wanted(cfg)` says so; two at once are refused in one line; otherwise the kind whose
`mode` is cfg.mode runs (the modes' kinds: `@register_kind("name")` and a line in SHIPPED below).
A kind's notebook function may run its block to a temporary file and read it back (temporary_run.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hookrun.config.plugins import KindPlugin, plugin
from hookrun.config.schema import HookrunConfig, Mode
from hookrun.config.schema import check_config as common_checks
from hookrun.errors import ConfigError
from hookrun.registry import Registry
from hookrun.runner.kinds.run_kind import KindContext, RunKind, StepAdds, plain_forward

KINDS: Registry[type[RunKind]] = Registry("run kind")


def register_kind(name: str) -> Callable[[type[RunKind]], type[RunKind]]:
    """Class decorator: register a RunKind subclass under `name` (its `name` is set to it)."""

    def add(cls: type[RunKind]) -> type[RunKind]:
        if cls.block is None and cls.mode is None:
            raise ValueError(f"run kind {name!r}: give it a mode (the cfg.mode it runs) or a block (the config "
                             f"block that turns it on)")
        taken = [n for n in KINDS.loaded() if n != name and cls.block is None and KINDS.get(n).block is None
                 and KINDS.get(n).mode is cls.mode]
        taken += [n for n, (_, on) in SHIPPED.items() if n != name and n not in KINDS.loaded()
                  and cls.block is None and on is cls.mode]
        if taken:
            raise ValueError(f"run kind {name!r}: mode={cls.mode.value} is run by the kind {taken[0]!r}; "
                             f"a new kind is turned on by a config block of its own (block = ...)")
        cls.name = name
        return KINDS.register(name)(cls)

    return add


def kind_for(cfg: HookrunConfig) -> type[RunKind]:
    """The kind a config runs: the kind plugin its block turns on, else its mode's. A kind's module
    is imported here only where the config gives its block or its mode."""
    for name, (_, on) in SHIPPED.items():
        if on is cfg.mode:
            KINDS.get(name)
    kinds = [KINDS.get(n) for n in KINDS.loaded()]
    on = [k for k in kinds if k.block and k.wanted(cfg)]
    on += [k for k in (plugin_kind(plugin(name)) for name in cfg.blocks) if k.wanted(cfg)]  # blocks given
    if len(on) > 1:
        names = " and ".join(k.block for k in on)
        raise ConfigError(f"{names} are each a kind of run of their own and cannot go together; keep one of them")
    if on:
        return on[0]
    for k in kinds:
        if k.block is None and k.mode is cfg.mode:
            return k
    raise ConfigError(f"mode={cfg.mode.value}: no run kind runs it; registered kinds: {', '.join(KINDS)}")


def plugin_kind(kind: KindPlugin) -> type[RunKind]:
    """The RunKind a kind plugin runs: its `run` class, checked; a shipped kind's own class named as
    the plugin, a user's through a subclass that carries the plugin's name (user_kind.py)."""
    cls = kind.run_class()
    if not (isinstance(cls, type) and issubclass(cls, RunKind)):
        raise ConfigError(f"kind plugin {kind.name!r}, run: {kind.run!r} is {cls!r}, not a subclass of "
                          f"hookrun.runner.kinds.run_kind.RunKind")
    if not kind.shipped:
        from hookrun.runner.kinds.user_kind import user_kind

        return user_kind(cls, kind.name)
    cls.name, cls.block = kind.name, kind.name
    return cls


def __getattr__(name: str) -> Any:
    """`patch_grid` (the patching kind's notebook function), imported when first used."""
    if name == "patch_grid":
        from hookrun.runner.kinds.patching.notebook import patch_grid

        return patch_grid
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def check_config(cfg: HookrunConfig) -> None:
    """Every refusal before anything is built: the common options' table (config/schema.py's TOGETHER), then
    the kind's own block (kind.check: evaluate's rows, an object-store output, ...)."""
    kind = kind_for(cfg)
    kind.check_mode(cfg)
    common_checks(cfg)
    kind.check(cfg)
    if cfg.early_stop and kind.block is not None:  # (its forwards read modules or outputs the cut would skip)
        raise ConfigError(f"early_stop=true cuts each forward after the last hook, but the {kind.block} block runs "
                          f"forwards of its own that read modules or outputs past it; drop early_stop")


__all__ = ["KINDS", "KindContext", "RunKind", "StepAdds", "check_config", "kind_for", "patch_grid", "plain_forward",
           "register_kind"]

# the modes' kinds beside the plugins (hookrun/config/plugins.py): name -> (the module that
# registers it, the mode that turns it on), imported when kind_for needs it
SHIPPED: dict[str, tuple[str, Mode]] = {
    "grad": ("hookrun.runner.kinds.grad_kind", Mode.grad),
    "generate": ("hookrun.runner.kinds.generate_kind", Mode.generate),
}
for _name, (_module, _) in SHIPPED.items():
    KINDS.register_lazy(_name, _module)



@register_kind("record")
class RecordKind(RunKind):
    """mode=eval: one forward per batch under no_grad (early_stop may cut it); everything is RunKind's."""

    mode = Mode.eval
