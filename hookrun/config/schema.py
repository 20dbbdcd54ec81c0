"""The config schema: what a run may be told, with types and defaults (hookrun.config.load puts a
config onto it).

    HookrunConfig().data.batch_size   # 16
    to_yaml(cfg)                      # the text each run's file stores

The YAML files in conf/ give the values; these dataclasses say which keys exist, so a misspelt key
is an error, not a silent default. Groups whose options take arbitrary arguments (model, dataset,
loss) and the hook map are untyped here and checked in code (build.py, config/__init__.py).

A top-level key that names a kind of run is that kind's block (`probe:`), typed once by hookrun.config.load:
`plugin_names()` are the kinds found without importing them (the folders of hookrun/runner/kinds/ whose
__init__.py holds `KIND = KindPlugin(`, and the entry points of the group hookrun.kinds); the kind
plugins themselves, their blocks' typing and register_plugin are config/plugins.py's, imported where a
block is given. Which options may go together: config/__init__.py's check_config.
"""

from __future__ import annotations

import dataclasses
import functools
import keyword
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path, PurePath
from typing import Any

import torch
import yaml
from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf
from omegaconf._utils import get_omega_conf_dumper

from hookrun.errors import ConfigError
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


def replaced(cfg: HookrunConfig, **changes: Any) -> HookrunConfig:
    """dataclasses.replace(cfg, **changes), keeping the kind plugins' parsed blocks (a rank's config)."""
    out = dataclasses.replace(cfg, **changes)
    for name in ("_blocks", "_block_nodes"):
        if name in cfg.__dict__:
            object.__setattr__(out, name, cfg.__dict__[name])
    return out


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


def mapping_where_nested(where: str, cls: type, field_name: str, value: Any) -> type | None:
    """A key whose value is a block of its own (probe.split, output) given one value (probe.split=0.3):
    one line naming its keys, where OmegaConf would say "Merge error: float is not a subclass of Split".
    Returns the nested dataclass (None where the field is not one), for a caller that walks deeper."""
    nested, hint = nested_block(cls, field_name), _hints(cls).get(field_name)
    if takes_bool(cls, field_name) and isinstance(value, int) and not isinstance(value, bool) and value not in (0, 1):
        raise ConfigError(f"{where}{field_key(field_name)}={value!r} is not a boolean; give true or false")  # (OmegaConf reads 2 as true)
    optional = type(None) in typing.get_args(hint)
    if nested is None or (value is None and optional) or isinstance(value, Mapping) or dataclasses.is_dataclass(value):
        return nested
    keys, key = [field_key(f.name) for f in dataclasses.fields(nested)], f"{where}{field_key(field_name)}"
    whole = f", or give {{{', '.join(f'{k}: ...' for k in keys)}}}" if len(keys) <= 3 else ""
    raise ConfigError(f"{key}={'null' if value is None else repr(value)}: a mapping of its keys ({', '.join(keys)}); "
                      f"set one with {key}.{keys[0]}=...{whole}")


def nested_block(cls: type, field_name: str) -> type | None:
    """The dataclass a field of `cls` holds (typed X or X | None), else None (no such field, or a plain type)."""
    hint = _hints(cls).get(field_name)
    return next((t for t in typing.get_args(hint) or (hint,) if dataclasses.is_dataclass(t)), None)


def takes_bool(cls: type, field_name: str) -> bool:  # (typed bool or bool | None)
    return bool in (typing.get_args(hint := _hints(cls).get(field_name)) or (hint,))


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)  # (a millisecond a class: a config is loaded per run and per test)


def field_key(field_name: str) -> str:
    """A field's key as a config writes it: `with`, not `with_`."""
    return field_name[:-1] if field_name.endswith("_") and keyword.iskeyword(field_name[:-1]) else field_name


GROUP = "hookrun.kinds"  # the entry-point group a user's package declares its kinds in
SHIPPED = "hookrun.runner.kinds"  # the package whose folders are hookrun's own kinds
_PLUGINS: dict[str, Any] = {}  # a kind's name -> its KindPlugin, loaded or registered (config/plugins.py)
_FOUND: dict[str, Callable[[], Any]] = {}  # name -> how to load it (not yet imported)
_SOURCES: dict[str, str] = {}  # a user's kind -> where it came from (its entry point), for messages
REFUSED: dict[str, str] = {}  # an entry point whose name cannot be a block -> why (--help lists it; runs go on)
_SCANNED = False


def _scan() -> None:
    """Find the kinds' names (folders of hookrun/runner/kinds/, entry points) without importing them."""
    global _SCANNED
    if _SCANNED:
        return
    _SCANNED = True
    folder = Path(__file__).resolve().parents[1] / "runner" / "kinds"
    for sub in sorted(folder.iterdir()) if folder.is_dir() else []:
        if (sub / "__init__.py").is_file() and "KIND = KindPlugin(" in (sub / "__init__.py").read_text():
            _FOUND.setdefault(sub.name, lambda m=f"{SHIPPED}.{sub.name}": _resolve(f"{m}:KIND", wrap=False))
    from importlib.metadata import entry_points

    for ep in entry_points(group=GROUP):  # (config/kind_names.py takes each, or says why not)
        from hookrun.config.kind_names import found_entry_point

        found_entry_point(ep, GROUP, CONFIG_KEYS, REFUSED, _SOURCES, _FOUND)


def _resolve(target: Any, slot: str = "", wrap: bool = True) -> Any:
    """config/targets.py's resolve, imported when a kind's slot is first used (off the main job's route)."""
    from hookrun.config.targets import resolve

    return resolve(target, slot, wrap)


def plugin_names() -> list[str]:  # (every kind that can be asked for: loaded or only found)
    _scan()
    return sorted(set(_PLUGINS) | set(_FOUND))


CONFIG_KEYS: set[str] = {f.name for f in dataclasses.fields(HookrunConfig)}  # no kind may be named as one


def hydra_schema() -> type:
    """The schema Hydra composes onto: HookrunConfig with an untyped, null slot for every kind
    plugin's block (typed once, by load), so an experiment may give `probe: {...}`."""
    own = {f.name for f in dataclasses.fields(HookrunConfig)}
    extra = [(name, Any, field(default=None)) for name in plugin_names() if name not in own]
    return dataclasses.make_dataclass("HookrunConfig", extra, bases=(HookrunConfig,)) if extra else HookrunConfig
