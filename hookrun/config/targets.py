"""The object a "module:attribute" string names: a kind plugin's slots (config/plugins.py) and its ops.

    resolve("my_pkg.ops:shift", "kind plugin 'mine', ops['shift']")     # the function my_pkg.ops.shift
"""

from __future__ import annotations

import importlib
from typing import Any

from hookrun.errors import ConfigError, close_matches


def resolve(target: Any, slot: str = "", wrap: bool = False) -> Any:
    """The object a "module:attribute" string names (anything else as it is). A string that names
    no module Python finds, or no attribute of it, is one ConfigError line naming `slot` (which
    plugin and which of its slots); a module that fails on an import of its own keeps its error,
    or with `wrap` (a kind plugin's block, run, reader, notebook or op) is one ConfigError line too."""
    if not isinstance(target, str):
        return target
    module, _, attr = target.partition(":")
    where = f"{slot}: {target!r}" if slot else repr(target)
    if not module or not attr:
        raise ConfigError(f"{where} is not a \"module:attribute\" string (e.g. \"my_pkg.ops:shift\")")
    try:
        obj = importlib.import_module(module)
    except Exception as exc:
        missing = getattr(exc, "name", None) if isinstance(exc, ModuleNotFoundError) else None
        if missing is not None and (module == missing or module.startswith(missing + ".")):
            raise ConfigError(f"{where}: there is no module {missing!r} on Python's path (sys.path); name a module "
                              f"of an installed package or of the folder the command runs in") from None
        if not wrap:  # (plugin() words a KIND module's own failure, naming its entry point)
            raise
        raise ConfigError(f"{where}: {module} fails to load: {type(exc).__name__}: "
                          f"{(str(exc).splitlines() or [''])[0]}") from exc
    parts = attr.split(".")
    for k, part in enumerate(parts):
        if not hasattr(obj, part):
            hint = close_matches(part, [n for n in dir(obj) if not n.startswith("_")], n=1)
            did = f"; did you mean {module}:{'.'.join([*parts[:k], hint[0]])}?" if hint else ""
            raise ConfigError(f"{where}: {'.'.join([module, *parts[:k]])} has no attribute {part!r}{did}")
        obj = getattr(obj, part)
    return obj
