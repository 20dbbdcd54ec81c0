"""What load says when OmegaConf refuses a config (hookrun.config.load, on its error path only): one
line naming the key, with the closest key the schema has and the keys of its block.

    omegaconf_message(exc, HookrunConfig, Mode)
    # "data.batch_sise: Key 'batch_sise' not in 'DataConfig'; did you mean data.batch_size? (data has: ...)"

It is handed the schema and its modes (HookrunConfig, Mode).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from enum import Enum

from omegaconf.errors import OmegaConfBaseException

from hookrun.config.schema import REFUSED, nested_block, plugin_names
from hookrun.error_words import object_in_config, typed_line
from hookrun.errors import close_matches


def omegaconf_message(exc: OmegaConfBaseException, schema: type, modes: Iterable[Enum]) -> str:
    """The one line of a config OmegaConf refused as load merged it onto the schema: an object put in a config,
    a value of the wrong type, or a key the schema lacks (the closest key, and the keys its block has)."""
    first = str(exc).strip().splitlines()[0]
    key = getattr(exc, "full_key", None)
    live = {"model": "hookrun.run(cfg, model=module)", "data.dataset": "hookrun.run(cfg, dataset=items)"}.get(key or "")
    placed = object_in_config(key, first, live) if key else None
    if placed:
        return placed
    message = typed_line(key, first) if key and key not in first else first
    if key and first.startswith("Key ") and " not in " in first:  # (kind_names: on this error's path only)
        from hookrun.config.kind_names import shipped_names, unfound_kind

        if key in shipped_names():  # (a block kind's name is a key: only a mode's kind reaches here)
            return (f"{key}: one of hookrun's own run kinds, chosen by mode= ({', '.join(m.value for m in modes)}; "
                    f"record is mode=eval's), not a block of keys: set mode, and its settings as top-level keys"
                    + (f" (the {REFUSED[key]})" if key in REFUSED else ""))
        keys = schema_keys(schema)
        parent = key.rpartition(".")[0]
        siblings = [k for k in keys if k.rpartition(".")[0] == parent]  # the block's own keys first
        close = close_matches(key, siblings, n=1) or close_matches(key, [k for k in keys if k.count(".") == key.count(".")], n=1)
        if close:
            message += f"; did you mean {close[0]}?"
        if parent and siblings:
            message += f" ({parent} has: {', '.join(sorted(k.rpartition('.')[2] for k in siblings))})"
        elif not parent and (not close or close[0] in plugin_names()):  # (a block of a kind not found here)
            message += f" ({unfound_kind(key)})"
    return message


def schema_keys(schema: type) -> list[str]:
    """The dotted keys the schema types (data.batch_size, output.path, ...), and the kind plugins'
    blocks' names (their keys are typed by hookrun.config.plugins)."""
    out = []

    def walk(cls: type, prefix: str) -> None:
        for f in dataclasses.fields(cls):
            out.append(f"{prefix}{f.name}")
            inner = nested_block(cls, f.name)
            if inner is not None:
                walk(inner, f"{prefix}{f.name}.")

    walk(schema, "")
    return out + [name for name in plugin_names() if name not in out]  # the kind plugins' blocks
