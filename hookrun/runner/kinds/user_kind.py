"""A kind plugin's run class (hookrun/config/plugins.py), imported where a config gives a plugin's block
(runner/kinds/__init__.py's kind_for), never on a run of a mode's kind: plugin_kind checks it and names it; a
user's (a KindPlugin outside hookrun/runner/kinds/) runs through a subclass (user_kind).

    cls = plugin_kind(plugin("evaluate"))   # its `run` class, checked; a shipped kind's own class, named
    cls = user_kind(ScaledKind, "scaled")   # a subclass named as the plugin, its own code's errors one line

A user's kind makes its own forwards (plain_forward: no_grad) and hookrun runs no backward and no generate
for it, so mode=grad or mode=generate with its block is refused before the model is built, as every
shipped block kind's check_mode refuses it, unless the kind's class says what it does with the mode
(its own `check_mode` classmethod): `+scaled={...} mode=grad` with a backward hook ran, and only at the
end a warning said the hook never fired.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hookrun.config.schema import HookrunConfig, Mode
from hookrun.errors import ConfigError, foreign_code
from hookrun.hooks import StopForward
from hookrun.runner.kinds import RunKind

if TYPE_CHECKING:
    from hookrun.config.plugins import KindPlugin

GUARDED = ("prepare_run", "step", "run_steps", "end_attrs")  # where a user's kind runs its own code in a run


@functools.cache
def user_kind(cls: type[RunKind], name: str) -> type[RunKind]:
    """A user's kind plugin's run: a subclass of `cls` carrying the plugin's name and block (a class two
    plugins share, or RunKind itself, is never changed), whose own code's exception in a run is one
    RunError line naming the kind and the method (the traceback with --verbose or HYDRA_FULL_ERROR=1),
    as the model's own forward's is; a hookrun error it raises stays as it is."""
    where = f"the {name} kind ({cls.__module__}.{cls.__qualname__})"

    def wrap(method_name: str) -> Callable[..., Any]:
        method = getattr(cls, method_name)

        @functools.wraps(method)
        def call(self: RunKind, *args: Any, **kwargs: Any) -> Any:
            with foreign_code(f"{where} failed in {method_name}:", passed=(StopForward,), limit=300):
                return method(self, *args, **kwargs)
        return call

    def eval_only(kind: type[RunKind], cfg: HookrunConfig) -> None:
        if cfg.mode is not Mode.eval:
            raise ConfigError(f"{name} with mode={cfg.mode.value}: {where} makes its own forwards, and hookrun runs no "
                              f"{'backward' if cfg.mode is Mode.grad else 'generate'} for it (its class has no "
                              f"check_mode that takes mode={cfg.mode.value}); drop mode or set mode=eval")

    body = {m: wrap(m) for m in GUARDED} | {"name": name, "block": name, "__module__": cls.__module__,
                                             "__qualname__": cls.__qualname__}
    if getattr(cls.check_mode, "__func__", None) is RunKind.check_mode.__func__:  # (the kind says nothing of mode)
        body["check_mode"] = classmethod(eval_only)
    return type(cls.__name__, (cls,), body)


def plugin_kind(kind: KindPlugin) -> type[RunKind]:
    """The RunKind a kind plugin runs: its `run` class, checked; a shipped kind's own class named as
    the plugin, a user's through a subclass that carries the plugin's name (user_kind.py)."""
    cls = kind.run_class()
    if not (isinstance(cls, type) and issubclass(cls, RunKind)):
        raise ConfigError(f"kind plugin {kind.name!r}, run: {kind.run!r} is {cls!r}, not a subclass of "
                          f"hookrun.runner.kinds.RunKind")
    if not kind.shipped:
        return user_kind(cls, kind.name)
    cls.name, cls.block = kind.name, kind.name
    return cls
