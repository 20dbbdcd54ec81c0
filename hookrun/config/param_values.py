"""A parameter of an action or op that the callable takes as a boolean or a number, read as one
(config/build.py's typed_params, which imports this module only where a callable takes such a key):

    as_bool("no", "error_term", "hooks.sae.actions.0")              # False
    as_number("0.5", ("float",), "factor", "hooks.h.actions.0")     # 0.5
    as_bool("maybe", "error_term", "w")    # ConfigError: w: error_term='maybe' is not a boolean; give true or false

A boolean is True/False, 0/1, or the strings true/false, yes/no, on/off (any case), as the schema's own
booleans are read; a number an integer where only `int` is named, a numeric string read as one.
Anything else is one ConfigError naming the key, before any batch.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any

from hookrun.errors import ConfigError

TRUE, FALSE = ("true", "yes", "on"), ("false", "no", "off")


def as_bool(value: Any, key: str, where: str) -> bool | None:
    """A boolean parameter's value, or one ConfigError naming the key."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in TRUE + FALSE:
        return value.strip().lower() in TRUE
    if isinstance(value, int) and value in (0, 1):  # as OmegaConf reads 0 and 1 for a bool
        return bool(value)
    raise ConfigError(f"{where}: {key}={value!r} is not a boolean; give true or false")


def as_number(value: Any, parts: tuple[str, ...], key: str, where: str) -> Any:
    """A number parameter's value (an integer where `int` alone is wanted; a numeric string read as
    one), or one ConfigError naming the key and what it takes. What a config cannot hold (a tensor,
    an array, given in Python) passes as it is: the op takes it as it did."""
    lists = {"list", "list[int]", "list[float]"} & set(parts)
    if value is None and "None" in parts:
        return None
    if isinstance(value, list | tuple):
        whole = "list[int]" in parts and not {"list", "list[float]"} & set(parts)
        items = [_number(v, whole) for v in value]
        return items if lists and all(v is not None for v in items) else _refuse(value, parts, key, where)
    if not isinstance(value, str | bool | numbers.Real | Mapping) and value is not None:
        return value
    for whole in ([False] if "float" in parts else []) + ([True] if "int" in parts else []):
        number = _number(value, whole)
        if number is not None:
            return number
    return _refuse(value, parts, key, where)


def _number(value: Any, whole: bool) -> float | int | None:
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    if whole:
        return int(value) if float(value).is_integer() else None
    return value


def _refuse(value: Any, parts: tuple[str, ...], key: str, where: str) -> Any:
    takes = {"float": "a number", "int": "an integer", "None": "null", "list": "a list of numbers",
             "list[int]": "a list of integers", "list[float]": "a list of numbers"}
    raise ConfigError(f"{where}: {key}={value!r} is not {' or '.join(takes[p] for p in parts)}; give e.g. "
                      f"{key}: {1 if 'int' in parts else 0.5}")
