"""A name -> object table with an error that lists the known names.

    ACTIONS = Registry("action")
    @ACTIONS.register("record")
    class Record: ...
    ACTIONS.get("recrod")  # NotFoundError: unknown action 'recrod'; did you mean: record? known: ...
    ACTIONS.register_lazy("logit_lens", "hookrun.hooks.actions.lens")  # imported when first asked for
    OPS = Registry("op", find=plugin_op, found_names=plugin_op_names)  # a name it does not know: asked of the plugins

A name registered again by the same definition (its module and qualified name: a notebook cell run a
second time) takes the new object; another object under a taken name is one ConfigError line.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Iterator
from typing import Generic, TypeVar

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
