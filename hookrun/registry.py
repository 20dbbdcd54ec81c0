"""Names that load what they name when first asked for: a registry's table, and a package's names.

    ACTIONS = Registry("action")
    @ACTIONS.register("record")
    class Record: ...
    ACTIONS.get("recrod")  # NotFoundError: unknown action 'recrod'; did you mean: record? known: ...
    ACTIONS.register_lazy("logit_lens", "hookrun.hooks.actions.lens")  # imported when first asked for
    OPS = Registry("op", find=plugin_op, found_names=plugin_op_names)  # a name it does not know: asked of the plugins

    lazy_names("hookrun.models", {"hf": "hf", "timm_model": "vision"})   # in hookrun/models/__init__.py
    hookrun.models.timm_model     # imports hookrun/models/vision.py now, and binds the function

A package's lazy names (PEP 562), for the builders `_target_` names: `_target_: hookrun.models.tiny_lm`
names a function that shares its module's name: importing the module `hookrun.models.tiny_lm` (`from
hookrun.models.tiny_lm import X`) makes the import system set the package's attribute `tiny_lm` to the
module; the package keeps the function there instead, as the eager `from hookrun.models.tiny_lm import
tiny_lm` in its `__init__.py` used to. So a run of a torchvision model loads none of hookrun's model
builders, and a run of synthetic data no text.

A name registered again by the same definition (its module and qualified name: a notebook cell run a
second time) takes the new object; another object under a taken name is one ConfigError line.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Iterator
from types import ModuleType
from typing import Any, Generic, TypeVar

from hookrun.errors import ConfigError, NotFoundError, close_matches, one_of

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
    """A package module whose `_lazy` names ({name: submodule}) are imported on first use."""

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
