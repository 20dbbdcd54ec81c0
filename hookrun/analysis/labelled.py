"""A run's captures as one xarray.Dataset, each axis named by meaning (the capture's `dims`).

    ds = to_dataset(run.file, [run.find("transformer.h.0.attn/softmax.0", "output")], slice(None))
    ds["p/transformer.h.0.attn/softmax.0/output"].dims     # ('sample', 'head', 'query', 'key')

The names are the file's own (`dims` attribute; derived for a file written before it). A row axis
carries its coordinates: `sample` the dataset index of each sample, `step` the batch number, and
`token` two coordinates, `sample` and `position` (/samples/token_sample and token_position), named
`token_sample` and `token_position` where the Dataset also has a `sample` axis (a coordinate may not
share its name with an axis). Captures share an axis where they agree on it (its size, and for a
row axis its coordinate): every attention pattern of a model shares `sample, head, query, key`. An
axis name on which the chosen captures disagree (`channel` of 64 and of 128) is qualified, for
each capture, with the capture's name: `blocks/layer2.0/output:channel`; for a row axis only the
captures that skip rows are (those whose rows are not the run's /samples/index, or token map).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import h5py
import numpy as np

from hookrun.errors import HookrunError
from hookrun.store import CaptureMeta, RowKind
from hookrun.store.listing import CaptureInfo, row_index

ROW_AXES = ("sample", "step", "token")


def to_dataset(f: h5py.File, chosen: list[CaptureInfo], rows: Any, attrs: dict) -> Any:
    """`rows`: a slice, or row numbers in any order (a list or an integer array; negative from the end)."""
    import xarray as xr

    if not isinstance(rows, slice):
        rows = np.asarray(rows)
        if rows.ndim != 1 or (rows.size and rows.dtype.kind not in "iu"):
            raise HookrunError(f"rows: a slice or a list of row numbers, got {rows.dtype} values of shape {rows.shape}")
        rows = rows.astype(np.int64)

    parts = [_part(f, info, rows) for info in chosen]
    canonical = _canonical(f, rows)
    uses: dict[str, set] = defaultdict(set)
    for p in parts:
        for d, sig in zip(p["dims"], p["sigs"], strict=True):
            uses[d].add(sig)

    def final(p: dict, i: int) -> str:
        d = p["dims"][i]
        if len(uses[d]) == 1 or (d in canonical and p["sigs"][i] == canonical[d]):
            return d
        return f"{p['name']}:{d}"

    named = [(p, [final(p, i) for i in range(len(p["dims"]))]) for p in parts]
    has_sample_axis = any("sample" in dims for _, dims in named)
    variables = {}
    for p, dims in named:
        first = dims[0]
        coords: dict[str, Any] = {first: p["index"]} if p["rows"] is not RowKind.TOKENS else {}
        if p["rows"] is RowKind.TOKENS:
            prefix = f"{p['name']}:" if first != "token" else "token_" if has_sample_axis else ""
            coords[f"{prefix}sample"] = (first, p["index"])
            if p["position"] is not None:
                coords[f"{prefix}position"] = (first, p["position"])
        variables[p["name"]] = xr.DataArray(p["data"], dims=tuple(dims), coords=coords, attrs=p["attrs"])
    return xr.Dataset(variables, attrs=attrs)


def _part(f: h5py.File, info: CaptureInfo, rows: slice) -> dict:
    """One capture: its data, names, row coordinates, and each axis's signature (what another
    capture must agree on to share the axis)."""
    ds = f[info.path]
    meta = CaptureMeta.from_attrs(ds.attrs)
    data = take(ds, rows, info.label)
    index = row_index(f, ds)[rows]
    position = None
    if meta.rows is RowKind.TOKENS and not meta.index:
        position = f["samples/token_position"][: ds.shape[0]][rows]
    dims = list(meta.dims)
    if len(dims) != data.ndim:  # (a damaged or hand-edited attribute): the rows' axis, then dim_1, ...
        dims = [dims[0] if dims else "dim_0", *[f"dim_{i}" for i in range(1, data.ndim)]]
    sigs = [(data.shape[0], index.tobytes())] + [(n,) for n in data.shape[1:]]
    return {"name": info.label, "data": data, "dims": dims, "sigs": sigs,
            "index": index, "position": position, "rows": meta.rows, "attrs": _plain(dict(ds.attrs))}


def _canonical(f: h5py.File, rows: slice) -> dict[str, tuple]:
    """The signature of the run's own row axes: /samples/index and the token map."""
    out = {"sample": _sig(take(f["samples/index"], rows, "/samples/index"))}
    if "samples/token_sample" in f:
        out["token"] = _sig(take(f["samples/token_sample"], rows, "/samples/token_sample"))
    return out


def take(ds: h5py.Dataset, rows: slice | np.ndarray, label: str) -> np.ndarray:
    """ds's rows: a slice as h5py reads it; row numbers (h5py reads only increasing, distinct ones) each
    read once, in increasing order, then put in the order given."""
    if isinstance(rows, slice):
        return ds[rows]
    n = ds.shape[0]
    bad = rows[(rows >= n) | (rows < -n)]
    if bad.size:
        raise HookrunError(f"rows: {bad[0]} is past the {n} rows of {label} (rows 0 to {n - 1}, or -{n} to -1)")
    wanted, order = np.unique(rows % n if n else rows, return_inverse=True)
    return ds[wanted][order] if wanted.size else ds[:0]


def _sig(index: np.ndarray) -> tuple:
    return (len(index), index.tobytes())


def _plain(attrs: dict) -> dict:
    return {k: (v.tolist() if isinstance(v, np.ndarray) else v.item() if isinstance(v, np.generic) else v)
            for k, v in attrs.items()}
