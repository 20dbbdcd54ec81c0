"""Kinds of run as plugins: one object per kind declares its config block, its run, its reader, its
notebook function and its ops, by import path, so nothing of a kind is imported until a run, a file,
a notebook call or an action's `op:` needs it.

    # hookrun/runner/kinds/probe/__init__.py (or any module of a user's package)
    KIND = KindPlugin("probe", block="my_pkg.block:ProbeBlock", run="my_pkg.kind:ProbeKind",
                      reader="my_pkg.reader:READER", notebook="my_pkg.notebook:probe",
                      ops={"probe_steer": "my_pkg.direction:probe_steer"})
    plugin("probe").block_class()        # the dataclass the `probe:` block is parsed into, once
    plugin_op("probe_steer")             # the op factory (config/plugin_parts.py: imports that kind's module only)

`ops` maps an op name to its factory, as `@register_op` takes one (the action's keys, a keyword-only `build: OpBuild`):
hooks/ops.py's registry asks `plugin_op` for a name it does not know (one named as a built-in op is one ConfigError line
where used); a shipped kind's op names are read from its __init__.py's text, not imported. A "module:attribute" string
of any slot that names no module or attribute is one ConfigError line naming the plugin and the slot.

Discovery, without a hand list: every folder of hookrun/runner/kinds/ (found on disk, imported only
when that kind is asked for), the entry points of the group `hookrun.kinds` (a user's package: the
way pytest finds its plugins), and a module named in `imports:` (its KIND, or its register_plugin(KIND)).
A name no kind can take (a config key, Hydra's, a config group, a kind of hookrun's own: config/kind_names.py) is
refused: an entry point's is listed by --help with why, register_plugin's raises. A block's dataclass may give
`check(self)`, a one-line ConfigError for values that need no model; `parse_block` runs it once, in
hookrun.config.load. The kinds' names are found by config/schema.py's plugin_names, without importing them.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import keyword
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hookrun.config.schema import (
    _FOUND,
    _PLUGINS,
    _SOURCES,
    CONFIG_KEYS,
    REFUSED,
    SHIPPED,
    _resolve,
    _scan,
    field_key,
    mapping_where_nested,
)
from hookrun.error_words import object_in_config, typed_line
from hookrun.errors import ConfigError, HookrunError, close_matches


@dataclass(frozen=True)
class KindPlugin:
    """One kind of run: `name` is its config block's key and the file's root `kind` attribute; the
    others are objects or "module:attribute" strings, resolved when first used."""

    name: str
    block: Any  # a dataclass: the block's keys, types and defaults (its `check()` the value checks)
    run: Any  # a RunKind subclass (hookrun/runner/kinds/__init__.py)
    reader: Any = None  # a KindReader (hookrun/analysis/kind_readers.py)
    notebook: Any = None  # a function, bound as hookrun.<its __name__>
    added_by_key: bool = False  # a key of the block on the command line (`evaluate.ablation=zero`) adds the block
    ops: Mapping[str, Any] | None = None  # op name -> its factory: `op: NAME` of a modify action
    live: Mapping[str, str] | None = None  # a block key an object was put in -> the call that takes the object
    summary: str = ""  # one line for `python -m hookrun --help`'s list of kinds: what a run of it gives

    def block_class(self) -> type:
        cls = _resolve(self.block, f"kind plugin {self.name!r}, block")
        if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
            raise ConfigError(f"kind plugin {self.name!r}, block: {self.block!r} is {cls!r}, not a dataclass (its keys, "
                              f"types and defaults: decorate the class with @dataclasses.dataclass)")
        return cls

    def run_class(self) -> type:  # (as given: runner/kinds/__init__.py's plugin_kind checks it and names it)
        return _resolve(self.run, f"kind plugin {self.name!r}, run")

    @property
    def shipped(self) -> bool:
        """One of hookrun's own kinds (its run class in its folder of hookrun/runner/kinds/)."""
        run = self.run if isinstance(self.run, str) else getattr(self.run, "__module__", "") + ":"
        return run.startswith(f"{SHIPPED}.{self.name}.")

    def reader_object(self) -> Any:
        return _resolve(self.reader, f"kind plugin {self.name!r}, reader") if self.reader is not None else None

    def notebook_function(self) -> Callable[..., Any] | None:
        return _resolve(self.notebook, f"kind plugin {self.name!r}, notebook") if self.notebook is not None else None

    def op_factory(self, name: str) -> Callable[..., Any] | None:
        target = (self.ops or {}).get(name)
        return _resolve(target, f"kind plugin {self.name!r}, ops[{name!r}]") if target is not None else None


def register_plugin(kind: KindPlugin) -> KindPlugin:
    """Add a kind (a module named in `imports:` calls this; shipped kinds and entry points are found)."""
    if not isinstance(kind, KindPlugin):
        raise TypeError(f"register_plugin takes a KindPlugin, not {type(kind).__name__}")
    why = _refused(kind.name)
    found = _PLUGINS.get(kind.name) or (None if why else loadable(kind.name))  # an entry point's kind: loaded to compare
    if not why and ((found or kind) != kind or isinstance(_FOUND.get(kind.name), functools.partial)):  # (a package may declare and register one; None: it fails, or is this module's, mid-import)
        why = f"a kind of that name is there already ({_SOURCES.get(kind.name, 'registered before')}); give it another name"
    if why:
        raise ConfigError(f"register_plugin({kind.name!r}): {why}")
    _PLUGINS[kind.name] = kind
    return kind


def _refused(name: str) -> str | None:
    """Why a user's kind cannot be named `name` (config/kind_names.py: off the main job's route), else None."""
    from hookrun.config.kind_names import refused_name

    return refused_name(name, CONFIG_KEYS)


def plugin(name: str) -> KindPlugin | None:
    """The kind `name` (loaded now if it was only found), or None."""
    if name not in _PLUGINS:
        _scan()
        load = _FOUND.get(name)
        if load is None:
            return None
        where = _SOURCES.get(name, f"{SHIPPED}.{name}")
        try:
            kind = load()
        except ConfigError:
            raise
        except Exception as exc:  # a user's package that fails on an import of its own (--verbose: the traceback)
            raise ConfigError(f"the kind plugin {name!r} ({where}) fails to load: {type(exc).__name__}: "
                              f"{(str(exc).splitlines() or [''])[0]}") from exc
        if not isinstance(kind, KindPlugin) or kind.name != name:
            got = f"a KindPlugin named {kind.name!r}" if isinstance(kind, KindPlugin) else f"{type(kind).__name__}"
            raise ConfigError(f"the kind plugin {name!r} ({where}) is {got}; it must be the KindPlugin named {name!r}")
        _PLUGINS[name] = kind
    return _PLUGINS[name]


def loadable(name: str) -> KindPlugin | None:
    """plugin(name), or None where it fails to load: a lookup that asks every kind (an op, a reader method) never
    stops a run or a reader on it; asking for it by name says why."""
    try:
        return plugin(name)
    except ConfigError:
        return None


def loaded_plugins() -> list[KindPlugin]:
    return list(_PLUGINS.values())


def typed_blocks(given: Mapping[str, Any]) -> dict[str, tuple[dict[str, Any], Any]]:
    """The kinds' blocks a config gives, each typed and checked once (hookrun.config.load): name -> typed_block's
    pair. A user's entry point named as hookrun's own kind (REFUSED) is not this block's kind: the user is told."""
    if REFUSED.keys() & given.keys():
        from hookrun.config.kind_names import warn_shadowed

        warn_shadowed(sorted(REFUSED.keys() & given.keys()), REFUSED)
    return {name: typed_block(name, node) for name, node in given.items()}


def parse_block(name: str, node: Any) -> Any:
    """The `name:` block of a config -> its kind's dataclass, typed and checked (one ConfigError line)."""
    return typed_block(name, node)[1]


def typed_block(name: str, node: Any) -> tuple[dict[str, Any], Any]:
    """(the block as typed, before its check: what the run's stored config says, with `with` for
    `with_`; the dataclass, checked and normalised)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    kind = plugin(name)
    assert kind is not None, name
    cls = kind.block_class()
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        node = {f.name: getattr(node, f.name) for f in dataclasses.fields(node)}
    if node is None:
        node = {}
    if not isinstance(node, Mapping):
        raise ConfigError(f"{name}: the block is {node!r}; give a mapping of its keys ({_keys(cls)})")
    mapped = _known(f"{name}.", cls, node)
    try:
        merged = OmegaConf.merge(OmegaConf.structured(cls), mapped)
        plain = {field_key(k): v for k, v in typing.cast(dict, OmegaConf.to_container(merged, enum_to_str=True)).items()}
        block = OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:
        first = str(exc).strip().splitlines()[0]
        key = ".".join(field_key(part) for part in str(getattr(exc, "full_key", "") or "").split(".") if part)
        where = f"{name}.{key}" if key else name
        raise ConfigError(object_in_config(where, first, (kind.live or {}).get(key)) or typed_line(where, first)) from None
    check = getattr(block, "check", None)
    if callable(check):
        try:
            check()
        except ConfigError:
            raise
        except Exception as exc:  # (a ValueError, an assert: the plugin's own words, one line naming the block)
            raise ConfigError(f"{name}: the kind plugin's check() refused the block: {type(exc).__name__}: {' '.join(str(exc).split())}") from exc
    return plain, block


def _known(where: str, cls: type, node: Mapping) -> dict[str, Any]:
    """`node` keyed by `cls`'s fields (`with` -> `with_`): a key it does not have, in the block or a block nested in it
    (probe.split.tset), is one line with the closest key and the keys it has, as the schema's."""
    fields, mapped, what = {f.name for f in dataclasses.fields(cls)}, {}, where[:-1]
    for key, value in node.items():
        field_name = f"{key}_" if keyword.iskeyword(str(key)) else str(key)
        if field_name not in fields:
            hint = close_matches(f"{where}{key}", [f"{where}{field_key(f)}" for f in fields], n=1)
            raise ConfigError(f"{where}{key}: not a key of {f'the {what} block' if '.' not in what else what}"
                              f"{f'; did you mean {hint[0]}?' if hint else ''} (it has: {_keys(cls)})")
        nested = mapping_where_nested(where, cls, field_name, value)
        mapped[field_name] = _known(f"{where}{key}.", nested, value) if nested and isinstance(value, Mapping) else value
    return mapped


def block_fields(name: str) -> list[str]:
    """The keys of a kind's block, as a config writes them (`with`, not `with_`)."""
    kind = plugin(name)
    return [field_key(f.name) for f in dataclasses.fields(kind.block_class())] if kind else []


def _keys(cls: type) -> str:
    return ", ".join(sorted(field_key(f.name) for f in dataclasses.fields(cls)))


_KINDS_OF: dict[str, tuple[str, Any]] = {}  # a kind's name -> (the module of imports: whose KIND registered it, it)


def import_modules(names: list[str]) -> None:
    """Import the modules listed under `imports:` (so their registered actions exist); a module's own
    `KIND = KindPlugin(...)` (a kind's package, as docs/architecture.md writes one) is registered, as its
    entry point would find it, where the module has not called register_plugin itself."""
    for name in names:
        try:
            kind = getattr(importlib.import_module(name), "KIND", None)
            if isinstance(kind, KindPlugin):
                try:
                    register_plugin(kind)
                except ConfigError as exc:
                    module, held = _KINDS_OF.get(kind.name, ("", None))
                    before = module if any(k is held for k in loaded_plugins()) else ""
                    raise ConfigError(f"imports: {name}.KIND: {exc}".replace("(registered before)", f"({before}.KIND, "
                                      f"named in imports: before it)" if before else "(registered before)")) from None
                _KINDS_OF[kind.name] = (name, kind)
        except ImportError as exc:
            raise ConfigError(f"imports: cannot import {name!r}: {exc}") from None
        except HookrunError:  # (register_plugin's refusal, already one line)
            raise
        except Exception as exc:  # the module raised as it ran (--verbose: the traceback)
            raise ConfigError(f"imports: {name!r} failed as it was imported: {type(exc).__name__}: "
                              f"{(str(exc).splitlines() or [''])[0]}") from exc
