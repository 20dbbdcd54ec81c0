"""Patching grids as labelled arrays (xarray): one per site, `module` first, then its `over` axes.

    grid = as_grid("heads", values, layout, attrs)   # DataArray, dims ("module", "position", "head")

`layout` is runner/patching's Layout.describe() (as a file stores it); `values` holds every cell
of the run, numbered as there; `labels` (token text) names the `position` axis where known.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import xarray as xr

ATTRS = ("metric", "method", "direction", "metric_clean", "metric_corrupt", "normalize")


def as_grid(name: str, values: np.ndarray, layout: Mapping[str, Any], attrs: Mapping[str, Any],
            labels: list[str] | None = None) -> xr.DataArray:
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
