"""A package whose names are imported when first used (PEP 562), for the builders `_target_` names.

    lazy_names("hookrun.models", {"hf": "hf", "timm_model": "vision"})   # in hookrun/models/__init__.py
    hookrun.models.timm_model     # imports hookrun/models/vision.py now, and binds the function

`_target_: hookrun.models.tiny_lm` names a function that shares its module's name: importing the
module `hookrun.models.tiny_lm` (`from hookrun.models.tiny_lm import X`) makes the import system
set the package's attribute `tiny_lm` to the module; the package keeps the function there instead,
as the eager `from hookrun.models.tiny_lm import tiny_lm` in its `__init__.py` used to. So a run
of a torchvision model loads none of hookrun's model builders, and a run of synthetic data no text.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import Any


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
