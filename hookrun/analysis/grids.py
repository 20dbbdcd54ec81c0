"""Patching grids as labelled arrays (xarray): one per site, `module` first, then its `over` axes.

    grid = as_grid("heads", values, layout, attrs)   # DataArray, dims ("module", "position", "head")

`layout` is runner/kinds/patching's Layout.describe() (as a file stores it); `values` holds every cell
of the run, numbered as there; `labels` (token text) names the `position` axis where known.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from hookrun.errors import HookrunError

ATTRS = ("metric", "method", "direction", "metric_clean", "metric_corrupt", "normalize")


def as_grid(name: str, values: np.ndarray, layout: Mapping[str, Any], attrs: Mapping[str, Any],
            labels: list[str] | None = None) -> Any:
    try:
        import xarray as xr  # (imported here: hookrun imports without it)
    except ModuleNotFoundError:
        raise HookrunError(f"the patching grid {name!r} is a labelled array and needs xarray: pip install 'hookrun[xarray]'") from None

    if name not in layout:
        raise LookupError(f"no patching grid {name!r}; the grids: {', '.join(layout) or 'none'}")
    g = layout[name]
    shape = (len(g["modules"]), *g["sizes"])
    n = int(np.prod(shape))
    data = np.asarray(values[g["offset"]: g["offset"] + n], dtype=np.float64)
    if len(data) < n:  # an unfinished run: the cells not yet written are NaN
        data = np.concatenate([data, np.full(n - len(data), np.nan)])
    coords: dict[str, Any] = {"module": list(g["modules"])}
    for axis, size in zip(g["over"], g["sizes"], strict=True):
        coords[axis] = list(labels) if axis == "position" and labels is not None and len(labels) == size else np.arange(size)
    return xr.DataArray(data.reshape(shape), dims=("module", *g["over"]), coords=coords, name=name,
                        attrs={k: attrs[k] for k in ATTRS if k in attrs})


def patching_meta(attrs: Any) -> dict | None:
    """A run's `patching` root attribute (JSON), from its root attributes (an h5py file's `attrs`, or
    an object-store run's manifest), or None where the run was no patching run."""
    import json

    text = attrs.get("patching")
    return json.loads(text) if text is not None else None


def file_grid(file: Any, name: str, which: str = "value") -> Any:
    """Grid `name` of a patching run's file: its rows (one per cell, /samples/index the cell number)
    placed at their cells; cells not written (an unfinished run) are NaN."""
    meta = patching_meta(file.attrs)
    if meta is None:
        raise LookupError(f"no patching grid {name!r}: {file.filename} is not a patching run (it has no grids)")
    if which not in ("value", "exact"):
        raise LookupError(f"which={which!r}; choose value or exact")
    values = np.full(int(meta["cells"]), np.nan)
    path = f"captures/patching/cells/{which}"
    if path in file:
        rows = file[path][:]
        values[file["samples/index"][: len(rows)]] = rows
    return as_grid(name, values, meta["layout"], meta, meta.get("labels"))


def grid_lines(attrs: Any) -> list[str]:
    """inspect's lines for a patching run's grids (from the root attributes alone)."""
    meta = patching_meta(attrs)
    if meta is None:
        return []
    lines = [f"  grids     {meta['method']} {meta['direction']} patching, metric {meta['metric']} (clean "
             f"{meta['metric_clean']:.4g}, corrupt {meta['metric_corrupt']:.4g}){', normalized' if meta['normalize'] else ''}"]
    for name, g in meta["layout"].items():
        shape = " x ".join(f"{a} {n}" for a, n in zip(("module", *g["over"]), (len(g["modules"]), *g["sizes"]), strict=True))
        lines.append(f"    {name:12s}{shape}")
    return lines
