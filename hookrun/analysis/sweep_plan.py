"""What Hydra's records say of a multirun: each job's overrides as its basic sweeper expands the sweep
(multirun.yaml, or the sweep's config at its start), and an override list typed as Hydra types it.

    planned(Path("outputs/multirun/2026-11-21/10-00-00"))   # [['params.factor=0', ...], ...]
    typed_overrides(["params.factor=0.5", "+tag=a"])        # {'params.factor': 0.5, 'tag': 'a'}
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import yaml

# keys that say how a job runs, not what it computes (a resumed job is the same job): never a swept parameter
RUN_CONTROL = frozenset({"resume", "progress", "output.overwrite", "output.flush_every"})


@functools.cache
def _parser() -> Any:
    """Hydra's override parser (made once: every value of every job is read by it)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()


def typed_overrides(items: list | None) -> dict[str, Any]:
    """A job's override list ('key=value', '+key=value') as {key: the value typed as Hydra types it}."""
    parsed = {}
    for item in items or []:
        key, _, value = str(item).partition("=")
        key = key.lstrip("+~")
        if key not in RUN_CONTROL and not key.startswith("hydra."):
            parsed[key] = _value(value)
    return _set_later_left_out(parsed)


def _set_later_left_out(parsed: dict[str, Any]) -> dict[str, Any]:
    """A mapping override without the keys a later override sets (Hydra applies them in order): the jobs of
    `+scaled={factor: 2.5} scaled.factor=1,3` ran factors 1 and 3, and their `scaled` column said
    {'factor': 2.5}; a mapping left with no key is no column."""
    keys = list(parsed)
    for i, key in enumerate(keys):
        later = [k[len(key) + 1:].split(".") for k in keys[i + 1:] if k.startswith(f"{key}.")]
        if isinstance(parsed[key], dict) and later:
            parsed[key] = _without(parsed[key], later)
            if not parsed[key]:
                del parsed[key]
    return parsed


def _without(node: dict, paths: list[list[str]]) -> dict:
    out = dict(node)
    for first, *rest in paths:
        if first in out and not rest:
            del out[first]
        elif first in out and isinstance(out[first], dict):
            out[first] = _without(out[first], [rest])
    return out


def planned(folder: Path) -> list[list[str]]:
    """Each job's overrides as Hydra's basic sweeper expands the sweep multirun.yaml records; [] for
    another sweeper or no multirun.yaml."""
    try:
        return planned_jobs((yaml.safe_load((folder / "multirun.yaml").read_text()) or {}).get("hydra") or {})
    except Exception:  # (no multirun.yaml, or one this Hydra cannot read: the folders alone say what ran)
        return []


def planned_jobs(hydra: Any, parser: Any = None) -> list[list[str]]:
    """Each job's overrides as Hydra's basic sweeper expands a sweep's `hydra` node (its
    `hydra.sweeper.params`, then the command line's); [] for another sweeper."""
    sweeper, task = hydra.get("sweeper") or {}, (hydra.get("overrides") or {}).get("task") or []
    if not str(sweeper.get("_target_", "")).endswith("BasicSweeper"):
        return []
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    params = [f"{k}={v}" for k, v in (sweeper.get("params") or {}).items()]
    batches = BasicSweeper.split_arguments((parser or _parser()).parse_overrides([*params, *task]), None)
    return [list(job) for batch in batches for job in batch]


def _value(text: str | None) -> Any:
    """An override's value typed as Hydra's override grammar types it (0.5 a float, 3 an int, true,
    null, [1, 2], '"$\\frac$"' the text between the quotes); text the grammar refuses stays text."""
    if text is None:
        return None
    try:
        return _parser().parse_override(f"k={text}").value()
    except Exception:  # (Hydra ran it, so it parsed there; e.g. an interpolation's text)
        return text
