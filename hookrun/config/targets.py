"""The object a "module:attribute" string names: a kind plugin's slots (config/plugins.py) and its ops;
and why a `_target_` node could not be built, in one line (config/build.py's build, on its error path only).

    resolve("my_pkg.ops:shift", "kind plugin 'mine', ops['shift']")     # the function my_pkg.ops.shift
    instantiation_message(exc, "torchvision.models.resnet181")        # "cannot import ... did you mean ...resnet18?"
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from hookrun.errors import ConfigError, close_matches

if TYPE_CHECKING:
    from hydra.errors import InstantiationException


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


def instantiation_message(exc: InstantiationException, target: str) -> str:
    """The one line of a `_target_` node Hydra could not build: the import that failed and the names closest
    to it, or the builder's exception (type and first line)."""
    from hydra.errors import InstantiationException

    cause = exc.__cause__
    while cause is not None and isinstance(cause, InstantiationException):
        cause = cause.__cause__
    # the whole message on one line: Hydra wraps some sentences over several lines (a blocklisted target)
    text = " ".join(str(exc).split()).replace(", set env var HYDRA_FULL_ERROR=1 to see chained stack trace.", "")
    if "Error locating target" in text:
        return f"cannot import {target!r} ({_closest_names(target)})"
    if cause is not None:
        return f"building {target!r} failed: {type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''}"
    return text


def _closest_names(target: str) -> str:
    """What the importable part of a dotted `target` holds that is close to the rest of it: the
    hint of 'cannot import' (torchvision.models.resnet181 -> torchvision.models.resnet18, ...)."""
    parts = str(target).split(".")
    obj, found = None, 0
    for i in range(len(parts), 0, -1):  # the longest importable module prefix
        name = ".".join(parts[:i])
        try:
            obj, found = importlib.import_module(name), i
            break
        except ModuleNotFoundError as exc:
            if exc.name is not None and exc.name != name and not name.startswith(exc.name + "."):
                return f"importing {name} needs {exc.name!r}, which is not installed"
            continue
        except Exception as exc:  # the module is there but fails on import
            return f"importing {name} failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    if obj is None:
        return f"no module {parts[0]!r}: is the package installed and the name spelt right?"
    for part in parts[found:]:
        nxt = getattr(obj, part, None)
        if nxt is None:
            names = [n for n in dir(obj) if not n.startswith("_")]
            close = close_matches(part, names, n=3)
            owner = ".".join(parts[:parts.index(part, found)])
            if close:
                return f"{owner} has no {part!r}; did you mean {' or '.join(f'{owner}.{c}' for c in close)}?"
            return f"{owner} has no {part!r}; is the name spelt right?"
        obj = nxt
    return "is the package installed and the name spelt right?"
