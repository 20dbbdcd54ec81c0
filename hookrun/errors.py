"""The one exception type hookrun raises for a user's mistake, the registries whose unknown name is one,
and how things are named in its messages.

    raise ConfigError("hooks.fmap.type: 'fwd' is not a hook type; choose one of: forward, ...")
    ACTIONS = Registry("action")   # @ACTIONS.register("record") on a class; ACTIONS.get("recrod") is
                                   # NotFoundError: unknown action 'recrod'; did you mean: record? known ...
    ACTIONS.register_lazy("logit_lens", "hookrun.hooks.actions.lens")   # imported when first asked for
    lazy_names("hookrun.models", {"hf": "hf", "timm_model": "vision"})  # a package's names, imported when used

The CLI prints its message on one line and exits non-zero without a traceback; anything else is a
bug in hookrun (or in user code) and keeps its traceback. The words of refusals that only an error
path runs (a wrong type in a config, a write the disk refused) are in error_words.py, loaded where one is worded.

How a module and a capture are named in messages, warnings and plans: one label builder.

    module_label("")                          # '(model)': the whole model (module path '')
    capture_label("layer1", "output", call=1)  # 'layer1 output@1'
    call_role("output", 1)                     # 'output@1': a capture's role and call, as the file names it
    dataset_label({"_target_": "x.Shapes"})    # 'x.Shapes': the data a run reads (plan, inspect, report)

The file itself names the whole model's group MODEL_NODE (hookrun.store); this is what a person reads.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import ModuleType
from typing import Any, Generic, TypeVar


class HookrunError(Exception):
    """A problem the user can fix: bad config, bad data, bad file. The message says how."""

    exit_code = 2

    def __reduce__(self):  # rebuilt from its message and attributes, whatever its __init__ takes (a
        # launcher's worker sends it pickled: Hydra's submitit launchers re-raise it in the sweep's process)
        return _rebuilt, (type(self), self.args), self.__dict__


def _rebuilt(cls: type, args: tuple) -> HookrunError:
    return cls.__new__(cls, *args)  # BaseException.__new__ sets args; __init__ is not called again


class ConfigError(HookrunError, ValueError):
    """A config value is wrong; raised before any batch runs."""


class NotFoundError(HookrunError, LookupError):
    """A named thing (module, parameter, hook type, action, capture) does not exist."""


class StoreError(HookrunError):
    """A run's store refused or could not be reached (after retries, where there were any): the run
    stops `interrupted` and what was not stored stays local (output/objects/ raises it)."""


class ChangedWhileRead(HookrunError):
    """A live run's file changed under a reader (its writer flushed while HDF5 read it): the file is
    intact, opening it again reads it (open_run does, a few times, before it raises this)."""


class RunError(HookrunError, RuntimeError):
    """Something the config allowed went wrong while the run was in progress."""

    exit_code = 1


def foreign_failure(what: str, exc: BaseException, limit: int = 400) -> RunError:
    """An exception of code hookrun calls but does not own (the model's forward, a user's kind) as one
    RunError line: `what`, the exception's type and message on one line, and where the traceback is."""
    text = " ".join(str(exc).split())
    return RunError(f"{what} {type(exc).__name__}: {text[:limit] + ('...' if len(text) > limit else '')} "
                    f"(the traceback: HYDRA_FULL_ERROR=1 or --verbose)")


PASSED = (KeyboardInterrupt, GeneratorExit)  # what code hookrun does not own may raise and foreign_code lets through


@contextlib.contextmanager
def foreign_code(what: str | Callable[[Exception], HookrunError], passed: tuple[type[BaseException], ...] = (),
                 limit: int = 400) -> Iterator[None]:
    """Code hookrun calls but does not own (a model's forward, a user's metric, loss, target function or
    kind) runs inside this: a HookrunError it raises (and the `passed` types: early_stop's StopForward)
    goes through as it is, and so do KeyboardInterrupt (Ctrl-C, SIGTERM: the run stops `interrupted`)
    and GeneratorExit; any other exception, a BaseException too (SystemExit(0) of a user's sys.exit
    would end the process with status 0 and a failed file), becomes one RunError line,
    `foreign_failure(what, exc)`, or `what(exc)` where the line needs the exception or is costly to
    write, the original as its __cause__.

        with foreign_code(f"patching.metric {name}(logits, items) raised"):
            value = fn(logits, items)
    """
    try:
        yield
    except (HookrunError, *PASSED, *passed):
        raise
    except BaseException as exc:
        raise (foreign_failure(what, exc, limit) if isinstance(what, str) else what(exc)) from exc


# the units of a size key (output.max_bytes, output.part_bytes, a kind's `memory`): parse_bytes reads them
UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "kib": 1 << 10, "m": 1e6, "mb": 1e6, "mib": 1 << 20, "g": 1e9,
         "gb": 1e9, "gib": 1 << 30, "t": 1e12, "tb": 1e12, "tib": 1 << 40}


def parse_bytes(value: Any, where: str) -> int:
    """1000000, '512MB', '2GiB' -> bytes: every size key's one parser; a ConfigError line naming `where` otherwise."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*", str(value))
    if isinstance(value, bool) or m is None or m.group(2).lower() not in UNITS or float(m.group(1)) <= 0:
        raise ConfigError(f"{where}={value!r}; give bytes as a number or with a unit (512MB, 2GiB)")
    return max(1, int(float(m.group(1)) * UNITS[m.group(2).lower()]))


def close_matches(word: str, choices: Iterable[str], n: int = 5) -> list[str]:
    """The choices closest to ``word``, best first (for 'did you mean' hints): first those it is a whole
    `_`- or `.`-separated part of (`cka`: linear_cka, rbf_cka), in their order; then difflib's."""
    choices = list(choices)
    parts = [c for c in choices if c != word and word in re.split(r"[_.]", c)]
    found = list(dict.fromkeys([*parts, *difflib.get_close_matches(word, choices, n=n, cutoff=0.5)]))[:n]
    if not found:
        prefix = [c for c in choices if c.startswith(word) or word.startswith(c) and c]
        found = prefix[:n]
    return found


def article(word: str) -> str:
    """'an attribution', 'a patching': the word with its indefinite article."""
    return f"{'an' if word[:1].lower() in 'aeiou' else 'a'} {word}"


def one_of(choices: Iterable[str]) -> str:
    """'a, b, c' for an error message listing the valid choices."""
    return ", ".join(sorted(choices))


MODEL_LABEL = "(model)"  # the whole model, where a module path is '' (hooks at the model's own forward)


def module_label(module: str) -> str:
    """A module's path, or MODEL_LABEL for the whole model."""
    return module or MODEL_LABEL


def call_role(role: str, call: int = 0) -> str:
    """A capture's role with its call: 'output' for a module's first call, 'output@1' for the next:
    the one builder of that name (the file's dataset names, the labels, the in-memory keys)."""
    return role + (f"@{call}" if call else "")


def capture_label(module: str, role: str, call: int = 0, hook: str | None = None, sep: str = " ") -> str:
    """`module role` (`@call` where it is not the module's first call), prefixed by `hook` where given:
    sep=" " for messages ('layer1 output@1'), sep="/" for keys ('fmap/layer1/output')."""
    parts = ([hook] if hook is not None else []) + [module_label(module), call_role(role, call)]
    return sep.join(parts)


def dataset_label(node: object) -> str:
    """The dataset a run reads, as the plan, `inspect` and the report name it: the `data.dataset` block's
    `_target_`, the name of a live object handed to `hookrun.run`, or the value itself; '?' where unknown."""
    if isinstance(node, Mapping):
        return str(node.get("_target_", node.get("live", "?")))
    return str(node) if node else "?"


T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str, find: Callable[[str], T | None] | None = None,
                 found_names: Callable[[], Iterable[str]] | None = None) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}
        self._lazy: dict[str, str] = {}  # name -> the module that registers it when imported
        self._find = find  # name -> the object from elsewhere (the kind plugins' ops), or None
        self._found_names = found_names  # the names `find` knows (for the error's list)

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: make ``obj`` available under ``name`` (a user package may add names too)."""

        def add(obj: T) -> T:
            known = self._items.get(name)
            shipped = self._lazy.get(name) or getattr(known, "__module__", "")
            if known is not obj and shipped.startswith("hookrun.") and getattr(obj, "__module__", None) != shipped:
                # (hookrun's own, imported or not yet: a user's would replace it, or be replaced, by import order)
                raise ConfigError(f"{self.kind} {name!r} is one of hookrun's own {self.kind}s; give yours another name")
            if known is not None and known is not obj and not _defined_again(known, obj):
                raise ConfigError(f"{self.kind} {name!r} is already registered ({shipped or 'elsewhere'}); give it another name")
            self._items[name] = obj
            return obj

        return add

    def register_lazy(self, name: str, module: str) -> None:
        """`name` is registered by importing `module`, done when `name` is first asked for."""
        if name not in self._items:
            self._lazy[name] = module

    def get(self, name: str) -> T:
        if isinstance(name, str) and name not in self._items and name in self._lazy:
            importlib.import_module(self._lazy[name])
        if isinstance(name, str) and name not in self._items and self._find is not None:
            found = self._find(name)
            if found is not None:
                return found
        try:
            return self._items[name]
        except (KeyError, TypeError):
            known = self.names()
            hint = close_matches(str(name), known)
            did = f"; did you mean: {', '.join(hint)}?" if hint else ""
            raise NotFoundError(
                f"unknown {self.kind} {name!r}{did} known {self.kind}s: {one_of(known)}"
            ) from None

    def names(self) -> list[str]:
        """Every name, registered, to be imported when asked for, or found elsewhere."""
        return sorted({*self._items, *self._lazy, *(self._found_names() if self._found_names else ())})

    def name_of(self, obj: T) -> str | None:
        """The name `obj` is registered under (an action's class: its `name:` in a hook), or None."""
        return next((name for name, item in self._items.items() if item is obj), None)

    def own(self, name: str) -> bool:
        """Whether `name` is registered here (imported or to be), not only found elsewhere."""
        return name in self._items or name in self._lazy

    def loaded(self) -> list[str]:
        """The names whose objects are imported already."""
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items or name in self._lazy or (self._found_names is not None and name in self.names())

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


def _defined_again(known: object, obj: object) -> bool:
    """`obj` is `known`'s own definition run again (a notebook cell run twice, importlib.reload): the
    same module and qualified name. It replaces the old one; another definition of the name is refused."""
    where = [(getattr(o, "__module__", None), getattr(o, "__qualname__", None)) for o in (known, obj)]
    return None not in where[0] and where[0] == where[1]


class LazyPackage(ModuleType):
    """A package module whose `_lazy` names ({name: submodule}) are imported on first use (PEP 562), for
    the builders `_target_` names: `hookrun.models.tiny_lm` is a function that shares its module's name,
    kept as the package's attribute when the import system would bind the module there. A run of a
    torchvision model so loads none of hookrun's model builders, and a run of synthetic data no text."""

    _lazy: dict[str, str]

    def __getattr__(self, name: str) -> Any:
        where = type(self)._lazy.get(name)
        if where is None:
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{self.__name__}.{where}"), name)
        setattr(self, name, value)
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, ModuleType) and type(self)._lazy.get(name) == name:  # the import system binding
            value = getattr(value, name)  # the submodule `name`: the package's `name` stays its function
        super().__setattr__(name, value)

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(type(self)._lazy))


def lazy_names(package: str, names: dict[str, str]) -> None:
    """Make `package` (its own `__init__.py` calls this with `__name__`) import `names` when first used."""
    module = sys.modules[package]
    module.__class__ = type(f"LazyPackage[{package}]", (LazyPackage,), {"_lazy": dict(names)})
