"""Run kinds: what a batch does (one module per kind) and the table that picks one for a config.

    from hookrun.runner.kinds import kind_for
    kind_cls = kind_for(cfg)            # EvaluateKind where cfg.evaluate is on, else by cfg.mode
    kind_cls.check(cfg)                 # refusals, before anything is built

| kind       | module           | chosen by                  | forwards per batch                    |
|------------|------------------|----------------------------|---------------------------------------|
| record     | run_kind.py      | mode=eval                  | 1 (no_grad; early_stop may cut it)    |
| grad       | grad_kind.py     | mode=grad                  | 1 forward + loss + backward           |
| generate   | generate_kind.py | mode=generate              | 1 model.generate (a call per token)   |
| evaluate   | evaluate/        | the `evaluate:` block      | clean, intervened (+ ablated)         |
| patching   | patching/        | the `patching:` block      | chunks of cells (steps are not batches) |
| attribution | attribution/    | the `attribution:` block   | captum's (zennit's) per batch (a plugin) |

Adding a kind: one module, or one folder where the kind has a block, a table and readers of its
own (evaluate/), with a RunKind subclass registered with `@register_kind("name")`, and its import
at the end of this file (docs/architecture.md walks through evaluate as the example).
A kind with a `block` is chosen when that block of the config is on; two such blocks at once are
refused in one line; otherwise the kind whose `mode` is cfg.mode runs.
"""

from __future__ import annotations

from collections.abc import Callable

from hookrun.config.checks import check_config as common_checks
from hookrun.config.plugins import plugin
from hookrun.config.schema import HookrunConfig, Mode
from hookrun.errors import ConfigError
from hookrun.hooks.registry import Registry
from hookrun.runner.kinds.run_kind import KindContext, RunKind, StepAdds, plain_forward

KINDS: Registry[type[RunKind]] = Registry("run kind")


def register_kind(name: str) -> Callable[[type[RunKind]], type[RunKind]]:
    """Class decorator: register a RunKind subclass under `name` (its `name` is set to it)."""

    def add(cls: type[RunKind]) -> type[RunKind]:
        if cls.block is None and cls.mode is None:
            raise ValueError(f"run kind {name!r}: give it a mode (the cfg.mode it runs) or a block (the config "
                             f"block that turns it on)")
        taken = [n for n in KINDS if n != name and cls.block is None and KINDS.get(n).block is None
                 and KINDS.get(n).mode is cls.mode]
        if taken:
            raise ValueError(f"run kind {name!r}: mode={cls.mode.value} is run by the kind {taken[0]!r}; "
                             f"a new kind is turned on by a config block of its own (block = ...)")
        cls.name = name
        return KINDS.register(name)(cls)

    return add


def kind_for(cfg: HookrunConfig) -> type[RunKind]:
    """The kind a config runs: the block kind it turns on (evaluate, patching), else its mode's."""
    kinds = [KINDS.get(n) for n in KINDS]
    on = [k for k in kinds if k.block and k.wanted(cfg)]
    on += [plugin(name).run_class() for name in cfg.blocks]  # the kind plugins whose block is given
    if len(on) > 1:
        names = " and ".join(k.block for k in on)
        raise ConfigError(f"{names} are each a kind of run of their own and cannot go together; keep one of them")
    if on:
        return on[0]
    for k in kinds:
        if k.block is None and k.mode is cfg.mode:
            return k
    raise ConfigError(f"mode={cfg.mode.value}: no run kind runs it; registered kinds: {', '.join(KINDS)}")


def check_config(cfg: HookrunConfig) -> None:
    """Every refusal before anything is built: the common options' table (config/checks.py), then
    the kind's own block (kind.check: evaluate's rows, an object-store output, ...)."""
    kind = kind_for(cfg)
    kind.check_mode(cfg)
    common_checks(cfg)
    kind.check(cfg)


__all__ = ["KINDS", "KindContext", "RunKind", "StepAdds", "check_config", "kind_for", "patch_grid", "plain_forward",
           "register_kind"]

# the kinds hookrun ships (each registers itself); a new kind adds its import here


@register_kind("record")
class RecordKind(RunKind):
    """mode=eval: one forward per batch under no_grad (early_stop may cut it); everything is RunKind's."""

    mode = Mode.eval


from hookrun.runner.kinds import evaluate, generate_kind, grad_kind, patching  # noqa: E402, F401

# the kinds' notebook functions, which the package face binds (hookrun.patch_grid; a kind plugin's,
# such as hookrun.attribute, through hookrun.config.plugins)
from hookrun.runner.kinds.patching.notebook import patch_grid  # noqa: E402
