"""What the user asked: the config schema (config/schema.py), a config loaded onto it here, the hook specs
and which options may go together; build.py turns the config's `_target_` nodes into objects (the one
module that calls hydra.utils.instantiate; it is not imported here). `conf_folder()`: where hookrun's
conf/ is (hookrun/conf in a wheel, conf/ beside hookrun/ in a checkout). `with_live(cfg, model=obj)`:
the config naming a live object given to run() in its node's place.

    cfg = load({"model": {"_target_": "torchvision.models.resnet18"}, "hooks": {...}})
    cfg.data.batch_size  # 16

load types a kind's block (`probe:`) once, through config/plugins.py (imported only where a config
gives a block or `imports:`), and says what OmegaConf refuses in one line (config/load_errors.py).

Hook specs: the `hooks:` mapping of a config, checked and turned into plain objects.

    specs = parse_hooks({"fmap": {"at": "layer1.*", "type": "forward", "actions": ["record"]}})
    specs[0].at  # ('layer1.*',)

Only the shape is checked here (keys, types, names); whether a module exists is the plan's job,
whether a hook type or action exists is the registries' job.

Which options may go together, and the range of each number, checked before anything is built:

    check_config(load(cfg))   # ConfigError, one line, at the first option that does not fit

TOGETHER is the list of combinations of the common options refused whatever else the config says; a
run kind's refusals about its own block are the kind's (in its folder, hookrun/runner/kinds/<kind>/,
run by the kind's `check`), and those that need the built model and hooks (a model without
generate(), an ablation with nothing to ablate) its constructor's.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hookrun.config.schema import (
    CONFIG_KEYS,
    HookrunConfig,
    Mode,
    mapping_where_nested,
    plugin_names,
    to_yaml,
)
from hookrun.errors import ConfigError, one_of, parse_bytes

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


def load(cfg: Any) -> HookrunConfig:
    """Merge ``cfg`` (DictConfig, dict or HookrunConfig) onto the schema and resolve it."""
    if isinstance(cfg, HookrunConfig):
        return cfg
    schema = _schema_node()
    try:
        if isinstance(cfg, DictConfig):
            cfg = OmegaConf.to_container(cfg, resolve=True)
            cfg.pop("hydra", None)
        if isinstance(cfg, dict) and cfg.get("imports"):  # a module of `imports:` may register a kind
            from hookrun.config.plugins import import_modules

            import_modules(list(cfg["imports"]))
        cfg, given = _plugin_blocks(cfg)
        _mappings_where_nested(HookrunConfig, cfg, "")
        merged = OmegaConf.merge(schema, cfg)
        obj = OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:
        from hookrun.config.load_errors import omegaconf_message

        raise ConfigError(omegaconf_message(exc, HookrunConfig, Mode)) from None
    assert isinstance(obj, HookrunConfig)
    out = obj.output  # the size keys, as every size key is read (hookrun.errors.parse_bytes: 2GB, 512MiB, bytes)
    out.max_bytes = None if out.max_bytes is None else parse_bytes(out.max_bytes, "output.max_bytes")
    out.part_bytes = parse_bytes(out.part_bytes, "output.part_bytes")
    if given:  # a kind's block: typed and checked once, here (config/plugins.py)
        from hookrun.config.plugins import typed_blocks

        given = typed_blocks(given)  # name -> (the block as typed, its dataclass)
    object.__setattr__(obj, "_blocks", {name: block for name, (_, block) in given.items()})
    object.__setattr__(obj, "_block_nodes", {name: plain for name, (plain, _) in given.items()})
    return obj


def _mappings_where_nested(cls: type, node: Any, where: str) -> None:
    """`output=5`: one line naming output's keys (mapping_where_nested), at any depth."""
    if not isinstance(node, Mapping):
        return
    for key, value in node.items():  # (a key the schema lacks has no nested block: OmegaConf's merge names it)
        nested = mapping_where_nested(where, cls, str(key), value)
        if nested is not None:
            _mappings_where_nested(nested, value, f"{where}{key}.")


@functools.cache
def _schema_node() -> DictConfig:
    """The schema as an OmegaConf node, built once (3 ms): merge copies it, never changes it."""
    return OmegaConf.structured(HookrunConfig)


def _plugin_blocks(cfg: Any) -> tuple[Any, dict[str, Any]]:
    """The config without its kind plugins' blocks, and those blocks (null blocks left out)."""
    if not isinstance(cfg, dict):
        return cfg, {}
    own, names = CONFIG_KEYS, set(plugin_names())
    rest = {k: v for k, v in cfg.items() if k in own or k not in names}
    given = {k: v for k, v in cfg.items() if k not in own and k in names and v is not None}
    return rest, given


def added_by_key(name: str) -> bool:
    """Whether a key of kind `name`'s block on the command line adds the block (`evaluate.ablation=zero`):
    its KindPlugin says so (config/plugins.py, imported only here)."""
    from hookrun.config.plugins import plugin

    return bool(getattr(plugin(name), "added_by_key", False))


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


class Refused(NamedTuple):
    option: str  # the option this row is about
    when: Callable[[HookrunConfig], bool]  # true: the config has the refused combination
    message: str  # the one line: what is wrong, and what would be right


# option           | refused when                                          | the line
TOGETHER: list[Refused] = [
    Refused("mode=grad", lambda c: c.mode is Mode.grad and c.loss is None,
            "mode=grad needs a loss: add loss=cross_entropy, loss=lm (a language model's next-token loss), "
            "loss=sum, loss=target_logit or loss=custom"),
    Refused("early_stop", lambda c: c.early_stop and c.mode is Mode.generate,
            "early_stop=true does not fit mode=generate: every model call's output makes the next token"),
    Refused("early_stop", lambda c: c.early_stop and c.mode is Mode.grad,
            "early_stop=true needs mode=eval: a backward pass needs the whole forward"),
    Refused("mode=generate", lambda c: c.mode is Mode.generate and c.loss is not None,
            "mode=generate runs no backward pass, so loss is unused: remove the loss, or use mode=grad"),
    Refused("resume", lambda c: c.resume and c.output.overwrite,
            "resume=true keeps the old file's batches and output.overwrite=true replaces the file: give one of them "
            "(resume=true to continue the run, output.overwrite=true to start it again)"),
]


# key                | first allowed, last allowed (None: no bound) | what the number is
RANGES: list[tuple[str, int | None, int | None, str]] = [
    ("data.limit", 1, None, "data.limit must be at least 1 (or null for all batches), got {value}"),
    ("output.flush_every", 1, None, "output.flush_every must be at least 1 (or null: every 2 seconds), got {value}"),
    ("data.batch_size", 1, None, "data.batch_size must be at least 1, got {value}"),
    ("data.num_workers", 0, None, "data.num_workers must be 0 or more, got {value}"),
    ("data.batch_size", None, sys.maxsize,
     "data.batch_size must be at least 1 and at most " + str(sys.maxsize) + ", got {value}"),
    ("seed", -(2**63), 2**64 - 1, "seed: {value} is out of range; use a whole number from 0 to " + str(2**64 - 1)
     + " (2**64 - 1)"),
]


def check_config(cfg: HookrunConfig) -> None:
    """Every row of TOGETHER, then every range, in order: the first that fails is one ConfigError."""
    fields = {"mode": cfg.mode.value}
    for row in TOGETHER:
        if row.when(cfg):
            raise ConfigError(row.message.format(**fields))
    for key, low, high, message in RANGES:
        value = lookup(cfg, key)
        if value is not None and ((low is not None and value < low) or (high is not None and value > high)):
            raise ConfigError(message.format(value=value))


def lookup(cfg: HookrunConfig, key: str) -> object:
    node: object = cfg
    for part in key.split("."):
        node = getattr(node, part)
    return node
