"""The config schema: what a run may be told, with types and defaults.

    cfg = load({"model": {"_target_": "torchvision.models.resnet18"}, "hooks": {...}})
    cfg.data.batch_size  # 16

The YAML files in conf/ give the values; these dataclasses say which keys exist, so a misspelt key
is an error, not a silent default. Groups whose options take arbitrary arguments (model, dataset,
loss) and the hook map are untyped here and checked in code (build.py, config/__init__.py).

Which options may go together, and the range of each number, checked before anything is built:

    check_config(load(cfg))   # ConfigError, one line, at the first option that does not fit

TOGETHER is the list of combinations of the common options refused whatever else the config says; a
run kind's refusals about its own block are the kind's (in its folder, hookrun/runner/kinds/<kind>/,
run by the kind's `check`), and those that need the built model and hooks (a model without
generate(), an ablation with nothing to ablate) its constructor's.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import PurePath
from typing import Any, NamedTuple

import torch
import yaml
from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf
from omegaconf._utils import get_omega_conf_dumper
from omegaconf.errors import OmegaConfBaseException

from hookrun.config.plugins import (
    CONFIG_KEYS,
    REFUSED,
    mapping_where_nested,
    plugin_names,
    typed_block,
)
from hookrun.errors import ConfigError, parse_bytes
from hookrun.store import PART_BYTES


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
    hooks: Any = None  # {name: {at, type, actions}}; checked by hookrun.config.parse_hooks
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
        from hookrun.config.load_errors import omegaconf_message

        raise ConfigError(omegaconf_message(exc, HookrunConfig, Mode)) from None
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
