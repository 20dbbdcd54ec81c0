"""How a module and a capture are named in messages, warnings and plans: one label builder.

    module_label("")                          # '(model)': the whole model (module path '')
    capture_label("layer1", "output", call=1)  # 'layer1 output@1'
    call_role("output", 1)                     # 'output@1': a capture's role and call, as the file names it
    dataset_label({"_target_": "x.Shapes"})    # 'x.Shapes': the data a run reads (plan, inspect, report)
    sorted(names, key=natural_key)            # h.2 before h.10: modules by depth, as every listing orders them

The file itself names the whole model's group MODEL_NODE (hookrun.store.format); this is what a
person reads.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

MODEL_LABEL = "(model)"  # the whole model, where a module path is '' (hooks at the model's own forward)


def module_label(module: str) -> str:
    """A module's path, or MODEL_LABEL for the whole model."""
    return module or MODEL_LABEL


def natural_key(text: str) -> list:
    """Sort key that orders the numbers inside names by value: features.4 before features.10 (HDF5
    lists a file's groups in text order: h.10, h.11 before h.2)."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(text))]


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
