"""How a module and a capture are named in messages, warnings and plans: one label builder.

    module_label("")                          # '(model)': the whole model (module path '')
    capture_label("layer1", "output", call=1)  # 'layer1 output@1'
    call_role("output", 1)                     # 'output@1': a capture's role and call, as the file names it
    dataset_label({"_target_": "x.Shapes"})    # 'x.Shapes': the data a run reads (plan, inspect, report)
    token_label(" the\n")                     # '␣the↵': a token's text with its whitespace made visible
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


WHITESPACE = {" ": "␣", "\n": "↵", "\t": "⇥"}  # how a token's whitespace is shown (plot, report, grids)


def token_label(text: str, special: str = "<empty>") -> str:
    """A token's text as a label that can be seen: each space, newline and tab as a sign (WHITESPACE),
    any other character that does not print as its escape (\\x0d, \\u200b); `special` (`<bos>`,
    ...) where the text is empty (a special token decodes to nothing). Plain text, never markup: a
    report escapes it where it is drawn."""
    if not text:
        return special
    return "".join(WHITESPACE.get(c) or (c if c.isprintable() else _escaped(c)) for c in text)


def visible(text: str) -> str:
    """`text` with each character that does not print (a carriage return, an ESC, a tab) as its escape
    (\\x0d), newlines kept: matplotlib stopped drawing a title at a carriage return, so a class
    name 'a\\rb' hid the rest of its caption. Running it twice changes nothing."""
    return "".join(c if c == "\n" or c.isprintable() else _escaped(c) for c in str(text))


def _escaped(c: str) -> str:
    n = ord(c)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def dataset_label(node: object) -> str:
    """The dataset a run reads, as the plan, `inspect` and the report name it: the `data.dataset` block's
    `_target_`, the name of a live object handed to `hookrun.run`, or the value itself; '?' where unknown."""
    if isinstance(node, Mapping):
        return str(node.get("_target_", node.get("live", "?")))
    return str(node) if node else "?"
