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
`check(self)`, a one-line ConfigError for values that need no model; `parse_block` runs it once, in schema.load.
"""

from __future__ import annotations

import dataclasses
import functools
import keyword
import re
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hookrun.errors import ConfigError, close_matches, object_in_config, typed_line

GROUP = "hookrun.kinds"  # the entry-point group a user's package declares its kinds in
SHIPPED = "hookrun.runner.kinds"  # the package whose folders are hookrun's own kinds


@dataclass(frozen=True)
class KindPlugin:
    """One kind of run: `name` is its config block's key and the file's root `kind` attribute; the
    others are objects or "module:attribute" strings, resolved when first used."""

    name: str
    block: Any  # a dataclass: the block's keys, types and defaults (its `check()` the value checks)
    run: Any  # a RunKind subclass (hookrun/runner/kinds/run_kind.py)
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


_PLUGINS: dict[str, KindPlugin] = {}
_FOUND: dict[str, Callable[[], KindPlugin]] = {}  # name -> how to load it (not yet imported)
_NOTEBOOKS: dict[str, str] = {}  # a shipped kind's notebook function's public name -> the kind (read, not imported)
_NOTEBOOK = re.compile(r"""notebook\s*=\s*["'][\w.]+:(\w+)["']""")
_OPS: dict[str, str] = {}  # a shipped kind's op name -> the kind (read, not imported)
_OPS_BLOCK = re.compile(r"""\bops\s*=\s*\{([^}]*)\}""")
_OP_NAME = re.compile(r"""["'](\w+)["']\s*:""")
_SCANNED = False
REFUSED: dict[str, str] = {}  # an entry point whose name cannot be a block -> why (--help lists it; runs go on)
_SOURCES: dict[str, str] = {}  # a user's kind -> where it came from (its entry point), for messages


def _resolve(target: Any, slot: str = "", wrap: bool = True) -> Any:
    """config/targets.py's resolve, imported when a plugin's slot is first used (off the main job's route)."""
    from hookrun.config.targets import resolve

    return resolve(target, slot, wrap)


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


def _scan() -> None:
    """Find the kinds' names (folders of hookrun/runner/kinds/, entry points) without importing them."""
    global _SCANNED
    if _SCANNED:
        return
    _SCANNED = True
    folder = Path(__file__).resolve().parents[1] / "runner" / "kinds"
    for sub in sorted(folder.iterdir()) if folder.is_dir() else []:
        text = (sub / "__init__.py").read_text() if (sub / "__init__.py").is_file() else ""
        if "KIND = KindPlugin(" in text:
            _FOUND.setdefault(sub.name, lambda m=f"{SHIPPED}.{sub.name}": _resolve(f"{m}:KIND", wrap=False))
            for public in _NOTEBOOK.findall(text):
                _NOTEBOOKS.setdefault(public, sub.name)
            for block in _OPS_BLOCK.findall(text):
                for op in _OP_NAME.findall(block):
                    _OPS.setdefault(op, sub.name)
    from importlib.metadata import entry_points

    for ep in entry_points(group=GROUP):
        why = _refused(ep.name)
        if why:
            REFUSED[ep.name] = f"entry point {ep.name!r} of {GROUP} ({ep.value}) is not used: {why}"
        elif ep.name in _SOURCES and not _SOURCES[ep.name].endswith(f"({ep.value})"):  # two packages, one kind name
            _FOUND[ep.name] = functools.partial(_clash, f"the kind {ep.name!r} is declared twice: {_SOURCES[ep.name]} and "
                                                        f"({ep.value}); uninstall one of the packages, or rename its kind")
        else:
            _SOURCES[ep.name] = f"entry point {ep.name!r} of {GROUP} ({ep.value})"
            _FOUND[ep.name] = lambda ep=ep: _resolve(f"{ep.module}:{ep.attr}", f"entry point {ep.name!r} of {GROUP}", False)


def _clash(text: str) -> KindPlugin:
    raise ConfigError(text)


CONFIG_KEYS: set[str] = set()  # the keys every config has (config/schema.py adds them): no kind may take one


def _refused(name: str) -> str | None:
    """Why a user's kind cannot be named `name` (config/kind_names.py: off the main job's route), else None."""
    from hookrun.config.kind_names import refused_name

    return refused_name(name, CONFIG_KEYS)


def plugin_names() -> list[str]:  # (every kind that can be asked for: loaded or only found)
    _scan()
    return sorted(set(_PLUGINS) | set(_FOUND))


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
        plain = {_key(k): v for k, v in typing.cast(dict, OmegaConf.to_container(merged, enum_to_str=True)).items()}
        block = OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:
        first = str(exc).strip().splitlines()[0]
        key = ".".join(_key(part) for part in str(getattr(exc, "full_key", "") or "").split(".") if part)
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
            hint = close_matches(f"{where}{key}", [f"{where}{_key(f)}" for f in fields], n=1)
            raise ConfigError(f"{where}{key}: not a key of {f'the {what} block' if '.' not in what else what}"
                              f"{f'; did you mean {hint[0]}?' if hint else ''} (it has: {_keys(cls)})")
        nested = mapping_where_nested(where, cls, field_name, value)
        mapped[field_name] = _known(f"{where}{key}.", nested, value) if nested and isinstance(value, Mapping) else value
    return mapped


def mapping_where_nested(where: str, cls: type, field_name: str, value: Any) -> type | None:
    """A key whose value is a block of its own (probe.split, output) given one value (probe.split=0.3):
    one line naming its keys, where OmegaConf would say "Merge error: float is not a subclass of Split".
    Returns the nested dataclass (None where the field is not one), for a caller that walks deeper."""
    nested, hint = nested_block(cls, field_name), _hints(cls).get(field_name)
    if takes_bool(cls, field_name) and isinstance(value, int) and not isinstance(value, bool) and value not in (0, 1):
        raise ConfigError(f"{where}{_key(field_name)}={value!r} is not a boolean; give true or false")  # (OmegaConf reads 2 as true)
    optional = type(None) in typing.get_args(hint)
    if nested is None or (value is None and optional) or isinstance(value, Mapping) or dataclasses.is_dataclass(value):
        return nested
    keys, key = [_key(f.name) for f in dataclasses.fields(nested)], f"{where}{_key(field_name)}"
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


def block_fields(name: str) -> list[str]:
    """The keys of a kind's block, as a config writes them (`with`, not `with_`)."""
    kind = plugin(name)
    return [_key(f.name) for f in dataclasses.fields(kind.block_class())] if kind else []


def _key(field_name: str) -> str:
    return field_name[:-1] if field_name.endswith("_") and keyword.iskeyword(field_name[:-1]) else field_name


def _keys(cls: type) -> str:
    return ", ".join(sorted(_key(f.name) for f in dataclasses.fields(cls)))
