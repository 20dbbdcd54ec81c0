"""The config schema: what a run may be told, with types and defaults.

    cfg = load({"model": {"_target_": "torchvision.models.resnet18"}, "hooks": {...}})
    cfg.data.batch_size  # 16

The YAML files in conf/ give the values; these dataclasses say which keys exist, so a misspelt key
is an error, not a silent default. Groups whose options take arbitrary arguments (model, dataset,
loss) and the hook map are untyped here and checked in code (build.py, specs.py).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import PurePath
from typing import Any

import torch
import yaml
from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf
from omegaconf._utils import get_omega_conf_dumper
from omegaconf.errors import OmegaConfBaseException

from hookrun.config.plugins import (
    CONFIG_KEYS,
    REFUSED,
    mapping_where_nested,
    nested_block,
    plugin_names,
    typed_block,
)
from hookrun.errors import ConfigError, close_matches, object_in_config, parse_bytes, typed_line
from hookrun.store.format import PART_BYTES


class Mode(str, Enum):
    """cfg.mode; compare with `is` (`cfg.mode is Mode.grad`): the run kind of each is hookrun.runner.kinds."""

    eval = "eval"
    grad = "grad"
    generate = "generate"

    def __str__(self) -> str:  # f"{mode}" is "eval" on every Python (3.12 would say "Mode.eval")
        return self.value


class Compression(str, Enum):
    none = "none"
    gzip = "gzip"
    lzf = "lzf"


class StoreDtype(str, Enum):
    """output.dtype: what every record action's capture is stored as (its own `dtype` may also say bfloat16); a
    kind's own captures (ctx.env.captures.add: attribution's maps, a user's kind's rows) keep theirs."""

    keep = "keep"
    float16 = "float16"
    float32 = "float32"


# the one table of storage dtypes: output.dtype, record's dtype and capture(dtype=) all read it
DTYPES = {"keep": None, "float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


@dataclass
class DataConfig:
    dataset: Any = MISSING  # a _target_ node: a map-style dataset
    batch_size: int = 16
    num_workers: int = 0
    limit: int | None = None  # most batches to run; null = all
    root: str | None = None  # folder of images, read by data=image_folder
    inputs: Any = None  # the model's inputs: a list of keys/positions, or a mapping argument -> key; null: default
    target: Any = "auto"  # the target's key or position; null: none; auto: item[1] of a tuple, "target"/"label" of a dict
    collate: Any = None  # a _target_ collate function (e.g. hookrun.data.collate_lists); null: default_collate
    store: list[str] = field(default_factory=list)  # batch keys stored per sample under /samples/ (input_ids, ...)


@dataclass
class OutputConfig:
    path: str = "captures.h5"  # relative paths land in the run folder
    compression: Compression = Compression.none
    dtype: StoreDtype = StoreDtype.keep
    overwrite: bool = False
    max_bytes: Any = None  # refuse a run whose estimated file size is larger: bytes, or a size ('2GB', '512MiB'); load makes it bytes
    flush_every: int | None = None  # flush every N batches; null: every 2 seconds
    checksum: bool = True  # an xxh3 digest of each batch's rows per capture (the run's /checksums table), checked on resume and by inspect --verify
    staging: str | None = None  # an object-store path (s3://...): where parts are written before upload; null: the run folder
    part_bytes: Any = PART_BYTES  # an object-store path: rows per part file, bytes or a size ('2GiB', the default); load makes it bytes


@dataclass
class HookrunConfig:
    model: Any = MISSING  # a _target_ node, plus optional `checkpoint`
    data: DataConfig = field(default_factory=DataConfig)
    device: str = "auto"  # auto | cpu | cuda | cuda:N | mps
    seed: int = 0
    mode: Mode = Mode.eval
    loss: Any = None  # a _target_ node (output, target) -> scalar; needed by mode=grad
    hooks: Any = None  # {name: {at, type, actions}}; checked by hookrun.config.specs
    params: dict[str, Any] = field(default_factory=dict)  # named values for ${params.NAME}: what a sweep varies
    output: OutputConfig = field(default_factory=OutputConfig)
    imports: list[str] = field(default_factory=list)  # modules imported first (own actions)
    progress: bool = True  # tqdm bar over batches
    resume: bool = False  # continue an interrupted or killed run in the same run folder
    dry_run: bool = False  # print the plan and the estimated file size; write nothing
    early_stop: bool = False  # eval mode, record-only hooks: stop each forward after the last hook
    generate: dict[str, Any] = field(default_factory=lambda: {"max_new_tokens": 20})  # mode=generate: model.generate(**batch, **generate)

    def __getattr__(self, name: str) -> Any:
        """A kind plugin's block (`cfg.probe`): its parsed dataclass, or None where not given."""
        blocks = self.__dict__.get("_blocks")
        if blocks is not None and name in blocks:
            return blocks[name]
        if not name.startswith("_") and name in plugin_names():
            return None
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def blocks(self) -> dict[str, Any]:
        """The kind plugins' blocks this config gives, parsed: {name: dataclass}."""
        return dict(self.__dict__.get("_blocks") or {})


CONFIG_KEYS.update(f.name for f in dataclasses.fields(HookrunConfig))  # (no kind plugin may be named as one)


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
            from hookrun.config.build import import_modules

            import_modules(list(cfg["imports"]))
        cfg, given = _plugin_blocks(cfg)
        _mappings_where_nested(HookrunConfig, cfg, "")
        merged = OmegaConf.merge(schema, cfg)
        obj = OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:
        raise ConfigError(_omegaconf_message(exc)) from None
    assert isinstance(obj, HookrunConfig)
    out = obj.output  # the size keys, as every size key is read (hookrun.errors.parse_bytes: 2GB, 512MiB, bytes)
    out.max_bytes = None if out.max_bytes is None else parse_bytes(out.max_bytes, "output.max_bytes")
    out.part_bytes = parse_bytes(out.part_bytes, "output.part_bytes")
    if REFUSED.keys() & given.keys():  # a user's entry point named as hookrun's own kind: not this block's kind
        from hookrun.config.kind_names import warn_shadowed

        warn_shadowed(sorted(REFUSED.keys() & given.keys()), REFUSED)
    typed = {name: typed_block(name, node) for name, node in given.items()}
    object.__setattr__(obj, "_blocks", {name: block for name, (_, block) in typed.items()})
    object.__setattr__(obj, "_block_nodes", {name: plain for name, (plain, _) in typed.items()})
    return obj


def _mappings_where_nested(cls: type, node: Any, where: str) -> None:
    """`output=5`: one line naming output's keys (hookrun.config.plugins.mapping_where_nested), at any depth."""
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


def replaced(cfg: HookrunConfig, **changes: Any) -> HookrunConfig:
    """dataclasses.replace(cfg, **changes), keeping the kind plugins' parsed blocks (a rank's config)."""
    out = dataclasses.replace(cfg, **changes)
    for name in ("_blocks", "_block_nodes"):
        if name in cfg.__dict__:
            object.__setattr__(out, name, cfg.__dict__[name])
    return out


def _plugin_blocks(cfg: Any) -> tuple[Any, dict[str, Any]]:
    """The config without its kind plugins' blocks, and those blocks (null blocks left out)."""
    if not isinstance(cfg, dict):
        return cfg, {}
    own = {f.name for f in dataclasses.fields(HookrunConfig)}
    names = set(plugin_names())
    rest = {k: v for k, v in cfg.items() if k in own or k not in names}
    given = {k: v for k, v in cfg.items() if k not in own and k in names and v is not None}
    return rest, given


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


def to_yaml(cfg: HookrunConfig) -> str:
    """The resolved config as YAML, as stored in each run's file (a kind plugin's block included): the
    text OmegaConf.to_yaml(OmegaConf.structured(cfg)) writes (its dumper, enums by name), from the
    dataclass's fields directly (a fifth of the time)."""
    node = _plain(cfg)
    given = cfg.__dict__.get("_block_nodes")
    if given:
        node = {**node, **_plain(given)}  # (a block's pathlib.Path field: its text, as YAML reads it back)
    return yaml.dump(node, default_flow_style=False, allow_unicode=True, sort_keys=False, Dumper=get_omega_conf_dumper())


def _plain(value: Any) -> Any:
    """Dataclasses, enums and config nodes as plain dicts, lists and scalars."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Enum):
        return value.name
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, DictConfig | ListConfig):
        return _plain(OmegaConf.to_container(value, resolve=True))
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def hydra_schema() -> type:
    """The schema Hydra composes onto: HookrunConfig with an untyped, null slot for every kind
    plugin's block (typed once, by load), so an experiment may give `probe: {...}`."""
    own = {f.name for f in dataclasses.fields(HookrunConfig)}
    extra = [(name, Any, field(default=None)) for name in plugin_names() if name not in own]
    return dataclasses.make_dataclass("HookrunConfig", extra, bases=(HookrunConfig,)) if extra else HookrunConfig


def _omegaconf_message(exc: OmegaConfBaseException) -> str:
    first = str(exc).strip().splitlines()[0]
    key = getattr(exc, "full_key", None)
    live = {"model": "hookrun.run(cfg, model=module)", "data.dataset": "hookrun.run(cfg, dataset=items)"}.get(key or "")
    placed = object_in_config(key, first, live) if key else None
    if placed:
        return placed
    message = typed_line(key, first) if key and key not in first else first
    if key and first.startswith("Key ") and " not in " in first:  # (kind_names: on this error's path only)
        from hookrun.config.kind_names import shipped_names, unfound_kind

        if key in shipped_names():  # (a block kind's name is a key: only a mode's kind reaches here)
            return (f"{key}: one of hookrun's own run kinds, chosen by mode= ({', '.join(m.value for m in Mode)}; "
                    f"record is mode=eval's), not a block of keys: set mode, and its settings as top-level keys"
                    + (f" (the {REFUSED[key]})" if key in REFUSED else ""))
        keys = schema_keys()
        parent = key.rpartition(".")[0]
        siblings = [k for k in keys if k.rpartition(".")[0] == parent]  # the block's own keys first
        close = close_matches(key, siblings, n=1) or close_matches(key, [k for k in keys if k.count(".") == key.count(".")], n=1)
        if close:
            message += f"; did you mean {close[0]}?"
        if parent and siblings:
            message += f" ({parent} has: {', '.join(sorted(k.rpartition('.')[2] for k in siblings))})"
        elif not parent and (not close or close[0] in plugin_names()):  # (a block of a kind not found here)
            message += f" ({unfound_kind(key)})"
    return message


def schema_keys() -> list[str]:
    """The dotted keys the schema types (data.batch_size, output.path, ...), and the kind plugins'
    blocks' names (their keys are typed by hookrun.config.plugins)."""
    out = []

    def walk(cls: type, prefix: str) -> None:
        for f in dataclasses.fields(cls):
            out.append(f"{prefix}{f.name}")
            inner = nested_block(cls, f.name)
            if inner is not None:
                walk(inner, f"{prefix}{f.name}.")

    walk(HookrunConfig, "")
    return out + [name for name in plugin_names() if name not in out]  # the kind plugins' blocks
