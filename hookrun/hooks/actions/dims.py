"""Dims of a recorded tensor by name, and `select` specs: how record finds the dims it works on.

    dim_index("channel", 4, ev, "output")           # 1
    parse_select({"dim": "token", "index": "last"}, where)  # ("token", "last", "last")
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hookrun.errors import ConfigError, RunError, one_of
from hookrun.hooks.events import Event

DIM_NAMES = {"channel": 1, "height": 2, "width": 3, "token": 1, "feature": -1}


def check_dim(spec: Any, where: str) -> None:
    if isinstance(spec, bool) or not (isinstance(spec, int) or spec == "spatial" or spec in DIM_NAMES):
        raise ConfigError(f"{where}: dim {spec!r}; use a number, 'spatial' or one of: {one_of(DIM_NAMES)}")
    if spec == 0:
        raise ConfigError(f"{where}: dim 0 is the batch; reduce or select over the dims of a sample (1, 2, ...)")


def dim_list(spec: Any, ndim: int, ev: Event, role: str) -> list[int]:
    if spec == "spatial":
        if ndim < 3:
            raise RunError(f"hook {ev.hook!r} at {ev.where}: {role} has {ndim} dims, no spatial dims to reduce")
        return list(range(2, ndim))
    return [dim_index(spec, ndim, ev, role)]


def dim_index(spec: Any, ndim: int, ev: Event, role: str) -> int:
    d = DIM_NAMES.get(spec, spec) if isinstance(spec, str) else spec
    d = d + ndim if d < 0 else d
    if not 0 < d < ndim:
        raise RunError(f"hook {ev.hook!r} at {ev.where}: {role} has {ndim} dims, so dim {spec!r} does not exist")
    return d


def parse_select(spec: Any, where: str) -> tuple[Any, Any, str]:
    """{dim: channel, index: [0, 3]} or {dim: 1, index: "0:64:2"} -> (dim, index list or slice, label)."""
    if not isinstance(spec, Mapping) or set(spec) - {"dim", "index"} or "index" not in spec:
        raise ConfigError(f"{where}: select expects {{dim: DIM, index: [i, j, ...] or 'start:stop:step'}}, got {spec!r}")
    dim = spec.get("dim", 1)
    check_dim(dim, where)
    index = spec["index"]
    if index == "last":
        return dim, "last", "last"
    if isinstance(index, str):
        try:
            parts = [int(p) if p.strip() else None for p in index.split(":")]
            if not 2 <= len(parts) <= 3:
                raise ValueError
        except ValueError:
            raise ConfigError(f"{where}: select index {index!r} is not a slice like '0:64' or '0:64:2'") from None
        return dim, slice(*parts), index
    if isinstance(index, int):
        index = [index]
    if not isinstance(index, list | tuple) or not all(isinstance(i, int) for i in index):
        raise ConfigError(f"{where}: select index must be a list of whole numbers or a slice string, got {index!r}")
    return dim, list(index), ",".join(map(str, index))
