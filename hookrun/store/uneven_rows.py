"""Rows that are not one per sample of every batch, which the plain record never writes: variable-length
rows, and the `<name>.index` of a capture that skips batches. CaptureColumns (store/columns.py) loads
this module at the first such rows.

Variable-length rows (append_ragged, below): one row per sample whose first dim varies (detection
boxes, n_i >= 0), or one per step (`record rows: ragged`: a tensor whose first dim changes from batch
to batch). Each row is sample i's values flattened, in a variable-length HDF5 dataset of shape (N,)
aligned with /samples/index; `ragged` and `row_shape` attributes say how to restore it
(docs/format.md): `ds[3].reshape(-1, *ds.attrs["row_shape"])` reads (n_3, 4).

A capture that skips a batch (`every`, `limit`, an index of its own) gets a `<name>.index` sibling
from then on (start_index): the sample indices of its rows (step numbers for per-step captures).
"""

from __future__ import annotations

from typing import Any

import h5py
import numpy as np

import hookrun.store as layout  # the format's chunk sizes
from hookrun.errors import RunError
from hookrun.store import CaptureMeta
from hookrun.store.records import Capture


def append_ragged(file: h5py.File, ds: h5py.Dataset | None, cap: Capture, step: int, rows_before: int,
                  compression: str | None = None) -> tuple[h5py.Dataset, list[np.ndarray]]:
    """Append one batch of variable-length rows (`cap.value`: a list of tensors, one per sample, or
    one for the step where `cap.per_step`), creating the dataset at its first batch; returns it, and
    the rows as it stores them (flat, its dtype: what their checksum digests).
    `rows_before`: the samples (steps) written before this batch."""
    arrs = [v.numpy(force=True) for v in cap.value]
    path = cap.key.path
    tail = arrs[0].shape[1:]
    if any(a.shape[1:] != tail for a in arrs):
        raise RunError(f"{path}: the samples of batch {step} have rows of shapes "
                       f"{sorted({a.shape for a in arrs})[:3]}; variable-length rows may vary in their first dim only")
    if ds is None:
        ds = file.create_dataset(path, (rows_before,), h5py.vlen_dtype(arrs[0].dtype), maxshape=(None,),
                                 chunks=(layout.RAGGED_CHUNK,), compression=compression)
        ds.attrs.update(CaptureMeta.of(cap, tail).to_attrs())
    if tuple(ds.attrs["row_shape"]) != tail:
        raise RunError(f"{path}: batch {step} has rows of shape (n, {tail}), earlier batches (n, {tuple(ds.attrs['row_shape'])})")
    if ds.shape[0] != rows_before:
        raise RunError(f"{path}: variable-length rows need the capture in every batch (batch {step})")
    n = ds.shape[0]
    ds.resize(n + len(arrs), axis=0)
    for i, a in enumerate(arrs):  # row by row: h5py turns equal-length rows into a 2-D array
        ds[n + i] = a.reshape(-1)
    return ds, [a.reshape(-1).astype(h5py.check_vlen_dtype(ds.dtype), copy=False) for a in arrs]


def start_index(file: h5py.File, path: str, col: Any, first: np.ndarray) -> h5py.Dataset:
    """A capture that skipped a batch (`col`: its store/columns.py Column): index its rows explicitly
    from now on, starting with `first`, the sample indices (step numbers) of the rows it has."""
    name = f"{path}.index"
    ds = file.create_dataset(name, data=first.astype(np.int64), maxshape=(None,),
                             chunks=(layout.capped(layout.INDEX_CHUNK, col.bound),))
    col.ds.attrs["index"] = name.rsplit("/", 1)[1]
    return ds
