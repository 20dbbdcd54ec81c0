"""Typed parameters of actions and ops: the one place their booleans are checked.

    from hookrun.hooks.splice import splice          # the op's factory: error_term: bool = False
    typed_params(splice, {"error_term": "false", "path": "saes/h1"}, "hooks.sae.actions.0")
    # {'error_term': False, 'path': 'saes/h1'}

An action's or op's parameters are sibling keys of the action in the config (`{name: modify_output,
op: splice, error_term: false}`); YAML, a script or an override may give a boolean as a string.
Every parameter the callable declares as `bool` (annotated `bool` or `bool | None`, or defaulting
to True/False) is read as the schema's own booleans are: True/False, 0/1, or the strings true/false,
yes/no, on/off (any case); anything else is one ConfigError naming the key. Other keys pass as given.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from hookrun.errors import ConfigError

TRUE, FALSE = ("true", "yes", "on"), ("false", "no", "off")
BOOL_ANNOTATIONS = {"bool", "bool|None", "None|bool", "Optional[bool]"}


def bool_keys(fn: Callable) -> set[str]:
    """The parameters of `fn` that take a boolean."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return set()
    out = set()
    for name, p in params.items():
        ann = p.annotation
        text = ann.replace(" ", "") if isinstance(ann, str) else "bool" if ann is bool else None
        if text in BOOL_ANNOTATIONS or (ann is p.empty and isinstance(p.default, bool)):
            out.add(name)
    return out


def as_bool(value: Any, key: str, where: str) -> bool | None:
    """A boolean parameter's value, or one ConfigError naming the key."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in TRUE + FALSE:
        return value.strip().lower() in TRUE
    if isinstance(value, int) and value in (0, 1):  # as OmegaConf reads 0 and 1 for a bool
        return bool(value)
    raise ConfigError(f"{where}: {key}={value!r} is not a boolean; give true or false")


def typed_params(fn: Callable, params: Mapping[str, Any], where: str) -> dict[str, Any]:
    """`params` with every key `fn` takes as a boolean read as one (see the module doc)."""
    keys = bool_keys(fn) & set(params)
    return {k: as_bool(v, k, where) if k in keys else v for k, v in params.items()}
