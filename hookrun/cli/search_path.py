"""The config folders a command line adds to the shipped conf/: `--config-dir DIR` (`-cd DIR`,
`--config-dir=DIR`) and `hydra.searchpath=[...]`, as one `hydra.searchpath` override for Hydra's
compose API (the app's own early checks compose the user's experiments as the run will).

    entries = search_entries(["--config-dir", "mycfg"], ["experiment=mine"])   # ['file:///abs/mycfg']
    as_override(entries)                                                    # ['hydra.searchpath=[file:///abs/mycfg]']
    folders_of(entries)                                                     # ['/abs/mycfg']
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

FLAGS = ("--config-dir", "-cd")


def user_config_dirs(argv: list[str]) -> list[str]:
    """`--config-dir DIR` / `-cd DIR` / `--config-dir=DIR`, as absolute file:// entries (in the order given)."""
    found = []
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if name in FLAGS and eq:
            found.append(value)
        elif arg in FLAGS and i + 1 < len(argv):
            found.append(argv[i + 1])
    return [f"file://{os.path.abspath(d)}" for d in found]


def search_entries(argv: list[str], overrides: list[str]) -> list[str]:
    """The search path's entries: the --config-dir folders of `argv` first, then those the overrides' own
    hydra.searchpath lists."""
    entries = user_config_dirs(argv)
    for arg in overrides:
        if arg.lstrip("+").partition("=")[0] == "hydra.searchpath":
            listed = OverridesParser.create().parse_override(arg).value()  # (a malformed one: Hydra's own error)
            entries += [str(e) for e in (listed if isinstance(listed, list) else [listed])]
    return entries


def as_override(entries: list[str]) -> list[str]:
    """The entries as one `hydra.searchpath=[...]` override for compose (none where there are none)."""
    return [f"hydra.searchpath=[{','.join(entries)}]"] if entries else []


def folders_of(entries: list[str]) -> list[str]:
    """The entries that are folders (file:// or a bare path), where a group's options may lie beside conf/'s."""
    return [e.removeprefix("file://") for e in entries if not e.startswith(NOT_FOLDERS)]


NOT_FOLDERS = ("pkg://", "structured://")  # Hydra's search path entries that are no folder (file:// or a bare path are)


def group_choices(overrides: list[str], folders: list[str]) -> list[str]:
    """`GROUP=OPTION` overrides of a group that is a folder in any of `folders` (a sweep's first option)."""
    chosen = []
    for o in overrides:
        key, _, value = o.lstrip("+").partition("=")
        if "." not in key and "/" not in key and any(Path(f, key).is_dir() for f in folders):
            chosen.append(f"{key}={value.split(',')[0]}")
    return chosen


def every_block(schema: Any, blocks: list[str]) -> DictConfig:
    """The schema's keys with every block present (empty): a config that could not be composed claims no block
    is missing."""
    cfg = OmegaConf.structured(schema)
    for block in blocks:
        cfg[block] = {}
    return cfg


def compose_groups(overrides: list[str], conf: str, schema: Any, blocks: list[str]) -> DictConfig:
    """These overrides' group choices alone (a sweep's first choice), composed on `conf` and the user's search
    path too (--config-dir, hydra.searchpath); where they do not compose, the schema, every block in."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    try:
        entries = search_entries(sys.argv[1:], overrides)
        groups = group_choices(overrides, [conf, *folders_of(entries)]) + as_override(entries)
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=conf, version_base="1.3", job_name="hookrun"):
            return compose("config", overrides=groups)
    except Exception:  # a group choice is wrong too: no block is said to be missing (Hydra then says what is wrong)
        return every_block(schema, blocks)
    finally:
        GlobalHydra.instance().clear()
