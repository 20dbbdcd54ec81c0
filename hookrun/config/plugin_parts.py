"""A kind plugin's parts found by their public names, importing only the kind that declares them:
its notebook function (`hookrun.<name>`, hookrun/__init__.py) and its ops (`op: NAME` of a modify
action, hooks/ops.py's registry asks here for a name it does not know).

    notebook_function("probe")   # hookrun.runner.kinds.probe.notebook:probe (only the probe kind imported)
    plugin_op("probe_steer")     # the op factory the probe kind declares in its `ops`
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hookrun.config.kind_names import shipped_names
from hookrun.config.plugins import KindPlugin, loadable, loaded_plugins, plugin
from hookrun.config.schema import _FOUND, _PLUGINS, _SOURCES, _scan
from hookrun.errors import ConfigError

_NOTEBOOK = re.compile(r"""notebook\s*=\s*["'][\w.]+:(\w+)["']""")
_OPS_BLOCK = re.compile(r"""\bops\s*=\s*\{([^}]*)\}""")
_OP_NAME = re.compile(r"""["'](\w+)["']\s*:""")


@functools.cache
def _shipped() -> tuple[dict[str, str], dict[str, str]]:
    """A shipped kind's notebook function's public name -> the kind, and its op names -> the kind: read from
    the text of its folder's __init__.py (the folders config/schema.py's scan found), not imported."""
    _scan()
    notebooks: dict[str, str] = {}
    ops: dict[str, str] = {}
    folder = Path(__file__).resolve().parents[1] / "runner" / "kinds"
    for sub in sorted(folder.iterdir()) if folder.is_dir() else []:
        text = (sub / "__init__.py").read_text() if (sub / "__init__.py").is_file() else ""
        if "KIND = KindPlugin(" in text:
            for public in _NOTEBOOK.findall(text):
                notebooks.setdefault(public, sub.name)
            for block in _OPS_BLOCK.findall(text):
                for op in _OP_NAME.findall(block):
                    ops.setdefault(op, sub.name)
    return notebooks, ops


def notebook_function(public: str) -> Callable[..., Any] | None:
    """The kind's notebook function `hookrun.<public>` names (its `notebook`'s attribute name), or
    None. A shipped kind is found by that name in its folder's __init__.py text, so only that kind
    is imported; a kind registered or loaded is asked; an entry point not yet loaded is loaded."""
    named = {kind.name: kind for kind in _asked(_shipped()[0].get(public)) if _public(kind) == public}
    _one(named, f"the notebook function hookrun.{public}", "its kind's `notebook`")
    for kind in named.values():
        return kind.notebook_function()
    return None


def _public(kind: KindPlugin) -> str | None:
    target = kind.notebook if isinstance(kind.notebook, str) else getattr(kind.notebook, "__name__", None)
    return target.rpartition(":")[2].rpartition(".")[2] if target is not None else None


def _one(kinds: dict[str, KindPlugin], what: str, where: str) -> None:
    """Two kinds giving one public name (two packages, or a package and a shipped kind): one line
    naming both, as two packages declaring one kind are; which one is meant must not hang on load order."""
    if len(kinds) > 1:
        first, second = (_source(k) for k in list(kinds.values())[:2])
        raise ConfigError(f"{what} is declared by two kinds, {first} and {second}; which one is meant cannot "
                          f"be told: rename one of them in {where} (or uninstall one package)")


def plugin_op(name: str) -> Callable[..., Any] | None:
    """The op factory a kind declares as `name` in its `ops`, or None: a shipped kind is found by its
    __init__.py's text (only that kind is imported), then the kinds loaded, then the entry points.
    Two kinds declaring the name (two packages, or a package and a shipped kind) are refused in one
    line naming both: which one a run gets must not hang on the order they were loaded in."""
    declaring = {kind.name: kind for kind in _asked(_shipped()[1].get(name)) if name in (kind.ops or {})}
    _one(declaring, f"op {name!r}", "its kind's `ops`")
    for kind in declaring.values():
        return kind.op_factory(name)
    return None


def _source(kind: KindPlugin) -> str:
    """Where a kind came from, for messages: hookrun's own, an entry point, or register_plugin."""
    if kind.shipped:
        return f"hookrun's own kind {kind.name!r}"
    return _SOURCES.get(kind.name, f"the kind {kind.name!r} (register_plugin)")


def plugin_op_names() -> list[str]:
    """Every op name a kind declares (for did-you-mean): shipped kinds' from their text, loaded kinds'
    and the entry points' (those are loaded: a user's package's __init__)."""
    return sorted(set(_shipped()[1]).union(*(kind.ops or {} for kind in _asked(None))))


def _asked(shipped: str | None) -> list[KindPlugin]:
    """The kinds to ask for a name: the shipped kind whose text names it, the kinds loaded, and the
    entry points not yet loaded that load (no other shipped kind is imported; a broken one is passed)."""
    kinds = [plugin(shipped)] if shipped else []
    kinds += loaded_plugins() + [loadable(n) for n in list(_FOUND) if n not in _PLUGINS and n not in shipped_names()]
    return [k for k in kinds if k is not None]
