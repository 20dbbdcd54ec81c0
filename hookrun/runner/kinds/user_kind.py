"""A user's kind plugin's run class (hookrun/config/plugins.py: a KindPlugin outside hookrun/runner/kinds/),
imported where such a kind is asked for (runner/kinds/__init__.py's plugin_kind), never on a shipped kind's run.

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
from typing import Any

from hookrun.config.schema import HookrunConfig, Mode
from hookrun.errors import ConfigError, foreign_code
from hookrun.hooks import StopForward
from hookrun.runner.kinds.run_kind import RunKind

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
