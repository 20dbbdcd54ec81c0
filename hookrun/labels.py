"""How a module and a capture are named in messages, warnings and plans: one label builder.

    module_label("")                          # '(model)': the whole model (module path '')
    capture_label("layer1", "output", call=1)  # 'layer1 output@1'

The file itself names the whole model's group MODEL_NODE (hookrun.store.format); this is what a
person reads.
"""

from __future__ import annotations

MODEL_LABEL = "(model)"  # the whole model, where a module path is '' (hooks at the model's own forward)


def module_label(module: str) -> str:
    """A module's path, or MODEL_LABEL for the whole model."""
    return module or MODEL_LABEL


def capture_label(module: str, role: str, call: int = 0, hook: str | None = None, sep: str = " ") -> str:
    """`module role` (`@call` where it is not the module's first call), prefixed by `hook` where given:
    sep=" " for messages ('layer1 output@1'), sep="/" for keys ('fmap/layer1/output')."""
    parts = ([hook] if hook is not None else []) + [module_label(module), role + (f"@{call}" if call else "")]
    return sep.join(parts)
