"""What the user asked: the config schema (config/schema.py, loading a config onto it), and here the hook
specs; build.py turns the config's `_target_` nodes into objects (the one module that calls
hydra.utils.instantiate; it is not imported here). `conf_folder()`: where hookrun's conf/ is
(hookrun/conf in a wheel, conf/ beside hookrun/ in a checkout). `with_live(cfg, model=obj)`: the
config naming a live object given to run() in its node's place.

Hook specs: the `hooks:` mapping of a config, checked and turned into plain objects.

    specs = parse_hooks({"fmap": {"at": "layer1.*", "type": "forward", "actions": ["record"]}})
    specs[0].at  # ('layer1.*',)

Only the shape is checked here (keys, types, names); whether a module exists is the plan's job,
whether a hook type or action exists is the registries' job.

Typed parameters of actions and ops: the one place their booleans are checked.

    from hookrun.hooks.splice import splice          # the op's factory: error_term: bool = False
    typed_params(splice, {"error_term": "false", "path": "saes/h1"}, "hooks.sae.actions.0")
    # {'error_term': False, 'path': 'saes/h1'}

An action's or op's parameters are sibling keys of the action in the config (`{name: modify_output,
op: splice, error_term: false}`); YAML, a script or an override may give a boolean as a string.
Every parameter the callable declares as `bool` (annotated `bool` or `bool | None`, or defaulting
to True/False) is read as the schema's own booleans are: True/False, 0/1, or the strings true/false,
yes/no, on/off (any case); anything else is one ConfigError naming the key. Every parameter annotated
with numbers alone (`float`, `int | None`, `float | list`, `int | list[int]`) takes a number (an
integer where only `int` is named; a numeric string is read as one) or one ConfigError naming the key,
before any batch. Other keys pass as given.
"""

from __future__ import annotations

import inspect
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from hookrun.config.schema import HookrunConfig, load, to_yaml
from hookrun.errors import ConfigError, one_of

__all__ = ["ActionSpec", "HookSpec", "HookrunConfig", "conf_folder", "load", "parse_hooks", "to_yaml"]

_HOOKRUN = Path(__file__).resolve().parents[1]
CONF_PLACES = (_HOOKRUN / "conf", _HOOKRUN.parent / "conf")  # (a wheel's, a checkout's)
SWEPT = "HOOKRUN_SWEPT"  # the environment variable naming the keys a -m sweep varies, in its jobs (cli/sweep_checks.py)


def conf_folder() -> Path | None:
    """hookrun's conf/ (the first of CONF_PLACES holding config.yaml); None where neither does."""
    return next((c for c in CONF_PLACES if (c / "config.yaml").is_file()), None)


def with_live(cfg: Any, model: Any = None, dataset: Any = None) -> Any:
    """`cfg` with a `{live: module.Class}` node where a live model or dataset object replaces the
    config's own (run(cfg, model=obj)): the file's config then names what was run."""
    if model is None and dataset is None:
        return cfg
    if isinstance(cfg, HookrunConfig):
        cfg = OmegaConf.to_container(OmegaConf.create(to_yaml(cfg)))  # (its kind plugin's block included)
    elif isinstance(cfg, DictConfig):
        cfg = OmegaConf.to_container(cfg, resolve=True)
    cfg = dict(cfg)
    if model is not None:
        cfg["model"] = live_node(model)
    if dataset is not None:
        cfg["data"] = {**dict(cfg.get("data") or {}), "dataset": live_node(dataset)}
    return cfg


def live_node(obj: Any) -> dict[str, str]:
    """The node a config keeps for an object given live (a model, a data set): {live: package.Class}."""
    return {"live": f"{type(obj).__module__}.{type(obj).__qualname__}"}


HOOK_KEYS = ("at", "type", "actions")


@dataclass(frozen=True)
class ActionSpec:
    """One item of a hook's `actions` list: a registered name with params, or a `_target_` node."""

    name: str | None
    params: dict[str, Any] = field(default_factory=dict)
    where: str = ""  # config path, for error messages

    @property
    def is_target(self) -> bool:
        return self.name is None


@dataclass(frozen=True)
class HookSpec:
    name: str
    at: tuple[str, ...]
    type: str
    actions: tuple[ActionSpec, ...]


def parse_hooks(hooks: Any) -> list[HookSpec]:
    if hooks is None:
        return []
    if not isinstance(hooks, Mapping):
        raise ConfigError(
            f"hooks: expected a mapping of hook name to {{at, type, actions}}, got {_kind(hooks)}"
        )
    return [parse_hook(str(name), body) for name, body in hooks.items()]


def parse_hook(name: str, body: Any) -> HookSpec:
    where = f"hooks.{name}"
    if not name or "/" in name or name.startswith("."):
        raise ConfigError(f"{where}: a hook name must be non-empty, without '/' or a leading '.'")
    if not isinstance(body, Mapping):
        raise ConfigError(f"{where}: expected a mapping with keys {one_of(HOOK_KEYS)}, got {_kind(body)}")
    unknown = set(body) - set(HOOK_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown key {one_of(map(str, unknown))}; allowed keys: {one_of(HOOK_KEYS)}")
    for key in ("at", "type"):
        if body.get(key) is None:
            raise ConfigError(f"{where}.{key} is missing; a hook needs at and type (actions is optional: [record] by default)")
    at = body["at"]
    at = (at,) if isinstance(at, str) else at
    if not isinstance(at, list | tuple) or not at or not all(isinstance(a, str) for a in at):
        raise ConfigError(f"{where}.at: expected a module path, a glob or a list of them, got {body['at']!r}")
    if not isinstance(body["type"], str):
        raise ConfigError(f"{where}.type: expected a hook type name, got {body['type']!r}")
    actions = body.get("actions", ["record"])
    if isinstance(actions, str | Mapping):
        actions = [actions]
    if actions is None or not isinstance(actions, list | tuple):
        raise ConfigError(f"{where}.actions: expected a list of actions (e.g. [record]), got {actions!r}")
    parsed = tuple(parse_action(item, f"{where}.actions.{i}") for i, item in enumerate(actions))
    return HookSpec(name=name, at=tuple(at), type=body["type"], actions=parsed)


def parse_action(item: Any, where: str) -> ActionSpec:
    if isinstance(item, str):
        return ActionSpec(name=item, where=where)
    if isinstance(item, Mapping):
        item = dict(item)
        if "_target_" in item:
            if "name" in item:
                raise ConfigError(f"{where}: give either `name` (a built-in action) or `_target_`, not both")
            return ActionSpec(name=None, params=item, where=where)
        name = item.pop("name", None)
        if not isinstance(name, str):
            raise ConfigError(
                f"{where}: an action mapping needs `name: ACTION` (e.g. {{name: record, what: output}}) "
                f"or `_target_: my_pkg.MyAction`; got keys {one_of(map(str, item)) or 'none'}"
            )
        return ActionSpec(name=name, params=item, where=where)
    raise ConfigError(f"{where}: expected an action name or mapping, got {_kind(item)}")


def _kind(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"[:120]


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
    """`params` with every key `fn` takes as a boolean read as one, and every key it takes as a
    number (or a list of numbers) checked to be one (see the module doc)."""
    keys = bool_keys(fn) & set(params)
    numbers = number_keys(fn)
    return {k: as_bool(v, k, where) if k in keys else as_number(v, numbers[k], k, where) if k in numbers else v
            for k, v in params.items()}


NUMBER_PARTS = {"float", "int", "None", "list", "list[int]", "list[float]"}


def number_keys(fn: Callable) -> dict[str, tuple[str, ...]]:
    """The parameters of `fn` annotated with numbers only (`float`, `int | None`, `int | list[int]`,
    ...): name -> the annotation's parts. An annotation with any other part is not checked."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return {}
    out = {}
    for name, p in params.items():
        if isinstance(p.annotation, str):
            parts = tuple(p.annotation.replace(" ", "").replace("Optional[", "None|").rstrip("]").split("|")) \
                if p.annotation.startswith("Optional[") else tuple(p.annotation.replace(" ", "").split("|"))
        else:
            parts = {float: ("float",), int: ("int",)}.get(p.annotation, ())
        if parts and set(parts) <= NUMBER_PARTS and set(parts) & {"float", "int"}:
            out[name] = parts
    return out


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
