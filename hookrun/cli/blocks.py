"""The blocks of the kinds (runner/kinds/*, and a kind plugin's) on the command line.

    ConfigStore.instance().store(name="hookrun_schema", node=hydra_slots(HookrunConfig))
    line = missing_block(["experiment=resnet_layer1", "my_kind.method=x"], compose_groups, conf)
    # "my_kind.method=x: this config has no my_kind block; add one with '+my_kind={method: x}' ..."

A block that is off is null in the composed config. OmegaConf cannot merge anything into a null
node typed with the block's dataclass (`+my_kind={method: x}` ended in "'NoneType' object has no
attribute 'get'", `my_kind.method=x` in "Unexpected type for root: NoneType"), so the schema Hydra
composes onto types every null block as Any (`hydra_slots`): `+my_kind={...}`, `my_kind={...}`,
`+my_kind.method=...` then add the block, and `hookrun.config.schema.load` types it (its unknown
keys and wrong types are one line there, before anything is built). `my_kind.method=x` without a
`+`, where the config has no such block, reads as a change to a block the user thinks is there: it
is refused in one line saying how to add one (`missing_block`)."""

from __future__ import annotations

import dataclasses
import re
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _optional_dataclass(hint: Any) -> bool:
    return any(dataclasses.is_dataclass(t) for t in typing.get_args(hint)) and type(None) in typing.get_args(hint)


def block_names(schema: type, own: type) -> list[str]:
    """The top-level keys that are a kind's block: an optional dataclass of hookrun's own schema
    `own`, or a null slot `schema` adds to it (a kind plugin's)."""
    hints = typing.get_type_hints(own)
    names = [f.name for f in dataclasses.fields(own) if _optional_dataclass(hints[f.name])]
    mine = set(hints)
    return names + [f.name for f in dataclasses.fields(schema) if f.name not in mine and f.default is None]


def hydra_slots(schema: type) -> type:
    """`schema` with every block whose default is null typed Any, so the command line can add it."""
    hints = typing.get_type_hints(schema)
    null = [(f.name, Any, dataclasses.field(default=None)) for f in dataclasses.fields(schema)
            if _optional_dataclass(hints[f.name]) and f.default is None]
    return dataclasses.make_dataclass(schema.__name__, null, bases=(schema,)) if null else schema


def missing_block(overrides: list[str], blocks: list[str], compose_groups: Callable[[], Any], conf: str | Path,
                  swept: list[str] = (), added_by_key: Callable[[str], bool] = lambda _: False) -> str | None:
    """One line for `BLOCK.key=value` (no `+`) where the config, as its groups compose it, has no
    BLOCK; None where every such override has its block. `compose_groups()` composes the group
    choices alone (called only where a block's key is set); `swept`: the sweeps over group options
    (`-m experiment=a,b`), which Hydra leaves out of the config it composes first; `added_by_key(BLOCK)`:
    a key of that block adds it (its kind plugin says so: `added_by_key`)."""
    given = {o.lstrip("+").split("=", 1)[0] for o in overrides if "=" in o}
    dotted = [o for o in overrides if not o.startswith(("+", "~")) and "=" in o and "." in o.split("=", 1)[0]
              and o.split(".", 1)[0] in blocks and o.split(".", 1)[0] not in given]
    if not dotted:
        return None
    cfg = compose_groups()
    for override in dotted:
        block = override.split(".", 1)[0]
        if cfg.get(block) is None and added_by_key(block):
            continue
        if cfg.get(block) is None and swept:
            return (f"{override}: the sweep {', '.join(swept)} is composed first without its options, where there is no "
                    f"{block} block; write '++{override}' (it sets the key where a job has the block, and adds it elsewhere)")
        if cfg.get(block) is None:
            key, _, value = override.partition("=")
            rest = key.split(".", 1)[1]
            add = f"'+{block}={{{rest}: {value}}}'" if "." not in rest else f"'+{override}'"
            having = experiments_with(block, conf)
            pick = f" or pick an experiment that has one ({', '.join(f'experiment={e}' for e in having[:3])})" if having else ""
            return f"{override}: this config has no {block} block; add one with {add}{pick}"
    return None


def experiments_with(block: str, conf: str | Path) -> list[str]:
    """The shipped experiments whose file gives `block:` at its top level."""
    top = re.compile(rf"^{re.escape(block)}:", re.MULTILINE)
    return sorted(p.stem for p in Path(conf, "experiment").glob("*.yaml") if top.search(p.read_text(errors="replace")))
