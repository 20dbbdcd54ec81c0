"""A name -> object table with an error that lists the known names.

    ACTIONS = Registry("action")
    @ACTIONS.register("record")
    class Record: ...
    ACTIONS.get("recrod")  # NotFoundError: unknown action 'recrod'; did you mean: record? known: ...
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from hookrun.errors import NotFoundError, close_matches, one_of

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: make ``obj`` available under ``name`` (a user package may add names too)."""

        def add(obj: T) -> T:
            if name in self._items and self._items[name] is not obj:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._items[name] = obj
            return obj

        return add

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except (KeyError, TypeError):
            hint = close_matches(str(name), self._items)
            did = f"; did you mean: {', '.join(hint)}?" if hint else ""
            raise NotFoundError(
                f"unknown {self.kind} {name!r}{did} known {self.kind}s: {one_of(self._items)}"
            ) from None

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))
