"""What the command line's checks say once they have found a fault (around_hydra.py finds it, on every
call; these words are loaded only then): an override the shell split at its spaces or brace-expanded,
an integer given to a boolean, and a kind's key set where the config has no such block.

    split_line("hooks={a:", ["hooks={a:", "b}"])   # "the override 'hooks={a:' was split by the shell ..."
    missing_block_line("scaled.factor=3", "scaled", [], conf)   # "... this config has no scaled block; add one ..."

The CLI prints each line as `hookrun: error: ...` and exits with 2.
"""

from __future__ import annotations

import re
from pathlib import Path

QUOTE = "put the whole override in single quotes, e.g. 'hooks={fmap: {at: layer1, type: forward}}'"


def split_line(arg: str, pieces: list[str]) -> str:
    """`arg` and the arguments after it, one override the shell split at its spaces."""
    whole = " ".join(pieces)
    return (f"the override {arg!r} was split by the shell at its spaces into {len(pieces)} "
            f"arguments; put it in single quotes: '{whole}'")


def not_boolean_line(key: str, value: str) -> str:
    """`dry_run=2`: an integer other than 0 and 1 given to a boolean (Hydra's schema reads it as true)."""
    return f"{key}={value} is not a boolean; give true or false"


def repeated_line(key: str, found: list[tuple[int, str]], side_by_side: bool) -> str:
    """`key` given more than once (`found`: its places and overrides); `side_by_side`: in a row, as the
    shell leaves an unquoted {..,..} it brace-expanded."""
    given = ", ".join(arg for _, arg in found)
    if side_by_side and any(":" in arg.partition("=")[2] for _, arg in found):  # a mapping's pieces: one word
        return (f"{key} is given {len(found)} times ({given}): the shell brace-expanded an "
                f"unquoted {{..,..}} into several arguments; {QUOTE} (a sweep is -m {key}=a,b)")
    return (f"{key} is given {len(found)} times ({given}): give it once (a later value does not replace an "
            f"earlier one); to run several values, sweep: -m {key}=a,b"
            + ("; an unquoted {..,..} is split by the shell this way: quote it" if side_by_side else ""))


def missing_block_line(override: str, block: str, swept: list[str], conf: str | Path) -> str:
    """`BLOCK.key=value` (no `+`) where the config has no BLOCK: how to add one (`swept`: the sweeps over
    group options that Hydra leaves out of the config it composes first)."""
    if swept:
        return (f"{override}: the sweep {', '.join(swept)} is composed first without its options, where there is no "
                f"{block} block; write '++{override}' (it sets the key where a job has the block, and adds it elsewhere)")
    key, _, value = override.partition("=")
    rest = key.split(".", 1)[1]
    add = f"'+{block}={{{rest}: {value}}}'" if "." not in rest else f"'+{override}'"
    having = experiments_with(block, conf)
    pick = f" or pick an experiment that has one ({', '.join(f'experiment={e}' for e in having[:3])})" if having else ""
    return f"{override}: this config has no {block} block; add one with {add}{pick}"


def experiments_with(block: str, conf: str | Path) -> list[str]:
    """The shipped experiments whose file gives `block:` at its top level."""
    top = re.compile(rf"^{re.escape(block)}:", re.MULTILINE)
    return sorted(p.stem for p in Path(conf, "experiment").glob("*.yaml") if top.search(p.read_text(errors="replace")))
