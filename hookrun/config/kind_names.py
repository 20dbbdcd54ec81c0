"""The names a user's kind cannot take: a kind's name is its config block's top-level key, so it
may be no key the config already has, no key Hydra keeps for itself, no config group, and no
kind of hookrun's own.

    refused_name("my-kind")     # "a kind's name is its config block's key, a Python identifier (e.g. 'my_kind')"
    refused_name("experiment")  # "'experiment' is a config group (experiment=NAME picks conf/experiment/NAME.yaml); ..."
    refused_name("record")      # "'record' is one of hookrun's own kinds; give the kind another name"
    refused_name("scaled")      # None: a name a kind can take

A block named `hydra` was composed into Hydra's own node (every run ended in "hydra.mode: the config
has no key"), one named `defaults` into the defaults list (a ValueError), one named as a group beside
the group's choice; a kind named as one of the modes' kinds (record, grad, generate: modules of
hookrun/runner/kinds/, not folders) wrote a file whose `kind` claimed to be hookrun's own.
Imported only where a user's kind is found (an entry point, register_plugin): off the main job's route.
`found_entry_point` takes an entry point of the group hookrun.kinds as config/schema.py's scan finds it,
handed that module's tables, so that it imports nothing of it.
"""

from __future__ import annotations

import functools
import keyword
import logging
import re
from collections.abc import Callable, Collection, Mapping, MutableMapping
from pathlib import Path
from typing import Any

from hookrun.config import conf_folder
from hookrun.errors import ConfigError

HYDRA_KEYS = ("hydra", "defaults", "_self_")  # Hydra's own: its node, the defaults list, the primary config's place in it
_KINDS = Path(__file__).resolve().parents[1] / "runner" / "kinds"  # hookrun's own kinds
_REGISTERED = re.compile(r"""^@register_kind\(\s*["'](\w+)["']""", re.M)  # a mode's kind (its module's decorator line)


def refused_name(name: str, config_keys: Collection[str] = ()) -> str | None:
    """Why `name` cannot be a user's kind (its block is a top-level config key), else None;
    `config_keys`: the schema's keys (config/schema.py's CONFIG_KEYS)."""
    if not name.isidentifier() or keyword.iskeyword(name):
        return f"a kind's name is its config block's key, a Python identifier (e.g. {identifier(name)!r})"
    if name in config_keys:
        return f"{name!r} is a key every config has; give the kind another name"
    if name in HYDRA_KEYS:
        return f"{name!r} is a key Hydra keeps for itself ({', '.join(HYDRA_KEYS)}); give the kind another name"
    if name in config_groups():
        return f"{name!r} is a config group ({name}=NAME picks conf/{name}/NAME.yaml); give the kind another name"
    return f"{name!r} is one of hookrun's own kinds; give the kind another name" if name in shipped_names() else None


def identifier(name: str) -> str:
    """A name like `name` that a kind can take: 'my-kind' -> 'my_kind', 'class' -> 'class_kind', '3d' -> 'kind_3d'."""
    text = re.sub(r"[^0-9a-zA-Z_]", "_", name) or "kind"
    text = f"kind_{text}" if text[0].isdigit() else text
    return f"{text}_kind" if keyword.iskeyword(text) else text


_WARNED: set[str] = set()


def warn_shadowed(names: Collection[str], refused: Mapping[str, str]) -> None:
    """A config gives the block of hookrun's own kind `name` where a user's package declares a kind of that name
    too, refused (config/plugins.py's REFUSED): the run is hookrun's kind, which the user is told (once a process):
    `+probe={at: fc}` ran hookrun's probe, the package's `probe` said nothing anywhere but --help."""
    for name in names:
        if name not in _WARNED:
            _WARNED.add(name)
            logging.getLogger("hookrun").warning("%s: this block runs hookrun's own %s kind, not the package's: the %s",
                                                 name, name, refused[name])


def unfound_kind(name: str) -> str:
    """What a config's `name:` block that no kind here takes is told: where a user's kind is found."""
    return (f"no kind of run named {name!r} here: a user's kind is found through its package's entry point in the "
            f"group hookrun.kinds (is the package on this Python's path?) or a module named in imports:; "
            f"docs/architecture.md")


@functools.cache
def shipped_names() -> frozenset[str]:
    """hookrun's own kinds: the folders of hookrun/runner/kinds/ (the kind plugins) and the modes'
    kinds its modules register (`@register_kind("record")`), read from the text, not imported."""
    if not _KINDS.is_dir():
        return frozenset()
    folders = {sub.name for sub in _KINDS.iterdir() if sub.is_dir() and not sub.name.startswith("_")}
    modes = {name for py in _KINDS.glob("*.py") for name in _REGISTERED.findall(py.read_text(errors="replace"))}
    return frozenset(folders | modes)


@functools.cache
def config_groups() -> frozenset[str]:
    """The config groups of hookrun's conf/ (a folder of YAML options: model, data, loss, experiment):
    hookrun/conf in a wheel, conf/ beside hookrun/ in a checkout (hookrun.config.conf_folder)."""
    conf = conf_folder()
    return frozenset(sub.name for sub in conf.iterdir() if sub.is_dir() and any(sub.glob("*.yaml"))) if conf else frozenset()


def found_entry_point(ep: Any, group: str, config_keys: Collection[str], refused: MutableMapping[str, str],
                      sources: MutableMapping[str, str], found: MutableMapping[str, Callable[[], Any]]) -> None:
    """An entry point of `group`: its kind found (not imported: `found`, where it came from: `sources`), or
    refused (`refused`: why), or, a name two packages declare, one line where the kind is asked for."""
    why = refused_name(ep.name, config_keys)
    if why:
        refused[ep.name] = f"entry point {ep.name!r} of {group} ({ep.value}) is not used: {why}"
    elif ep.name in sources and not sources[ep.name].endswith(f"({ep.value})"):  # two packages, one kind name
        found[ep.name] = functools.partial(_clash, f"the kind {ep.name!r} is declared twice: {sources[ep.name]} and "
                                                   f"({ep.value}); uninstall one of the packages, or rename its kind")
    else:
        sources[ep.name] = f"entry point {ep.name!r} of {group} ({ep.value})"
        found[ep.name] = lambda ep=ep: _load(f"{ep.module}:{ep.attr}", f"entry point {ep.name!r} of {group}")


def _clash(text: str) -> Any:
    raise ConfigError(text)


def _load(target: str, slot: str) -> Any:
    from hookrun.config.targets import resolve

    return resolve(target, slot, False)
