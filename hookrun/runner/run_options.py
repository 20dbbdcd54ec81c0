"""The run's options a plain record leaves off, loaded only where a config gives them: data.collate built
(build_collate) and the hooks early_stop=true takes (check_early_stop).

    collate = build_collate(cfg.data.collate)                # a function that takes the list of items
    check_early_stop(points)                                  # one ConfigError line where a hook cannot be cut
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hookrun.config.build import build
from hookrun.errors import ConfigError
from hookrun.hooks.actions import ACTIONS


def build_collate(node: Any) -> Callable:
    """data.collate built: a function that takes the list of items. Without `_partial_: true` Hydra
    calls it with no items (collate_lists() missing 'items'), or builds an object that is no function."""
    hint = "a collate function is called with the list of items: add `_partial_: true` to data.collate"
    try:
        fn = build(node, "data.collate")
    except ConfigError as exc:
        if "required positional argument" in str(exc) and "_partial_" not in node:
            raise ConfigError(f"{exc}; {hint}") from None
        raise
    if not callable(fn):
        raise ConfigError(f"data.collate: built a {type(fn).__name__}, not a function; {hint}")
    return fn


def check_early_stop(points: list) -> None:
    name = lambda a: ACTIONS.name_of(type(a)) or "a _target_ action"  # noqa: E731 (the `name:` the hook gave)
    whole = next((a for p in points for a in p.actions if getattr(a, "whole_forward", False)), None)
    if whole is not None:
        raise ConfigError(f"early_stop=true cuts the forward after the last hook, but {whole.where} needs the whole "
                          f"forward ({name(whole)} reads the model's output); drop early_stop")
    for p in points:
        if p.type not in ("forward", "forward_pre") or not all(a.records and not a.modifies for a in p.actions):
            raise ConfigError(
                f"early_stop=true needs hooks that only record (forward or forward_pre with record actions); "
                f"hooks.{p.hook} is type {p.type} with {', '.join(name(a) for a in p.actions)}"
            )
