"""Variable-length rows: one row per sample whose first dim varies (detection boxes, n_i >= 0),
or one per step (`record rows: ragged`: a tensor whose first dim changes from batch to batch).

    ds = append_ragged(file, None, capture, step=0, samples_before=0)   # creates the dataset
    ds[3].reshape(-1, *ds.attrs["row_shape"])                            # reading: (n_3, 4)

Each row is sample i's values flattened, in a variable-length HDF5 dataset of shape (N,) aligned
with /samples/index; `ragged` and `row_shape` attributes say how to restore it (docs/format.md).
"""

from __future__ import annotations

import h5py

from hookrun.errors import RunError
from hookrun.store.capture_schema import CaptureMeta
from hookrun.store.records import Capture


def append_ragged(file: h5py.File, ds: h5py.Dataset | None, cap: Capture, step: int, rows_before: int,
                  compression: str | None = None) -> h5py.Dataset:
    """Append one batch of variable-length rows (`cap.value`: a list of tensors, one per sample, or
    one for the step where `cap.per_step`), creating the dataset at its first batch; returns it.
    `rows_before`: the samples (steps) written before this batch."""
    arrs = [v.numpy(force=True) for v in cap.value]
    path = cap.key.path
    tail = arrs[0].shape[1:]
    if any(a.shape[1:] != tail for a in arrs):
        raise RunError(f"{path}: the samples of batch {step} have rows of shapes "
                       f"{sorted({a.shape for a in arrs})[:3]}; variable-length rows may vary in their first dim only")
    if ds is None:
        ds = file.create_dataset(path, (rows_before,), h5py.vlen_dtype(arrs[0].dtype), maxshape=(None,),
                                 chunks=(256,), compression=compression)
        ds.attrs.update(CaptureMeta.of(cap, tail).to_attrs())
    if tuple(ds.attrs["row_shape"]) != tail:
        raise RunError(f"{path}: batch {step} has rows of shape (n, {tail}), earlier batches (n, {tuple(ds.attrs['row_shape'])})")
    if ds.shape[0] != rows_before:
        raise RunError(f"{path}: variable-length rows need the capture in every batch (batch {step})")
    n = ds.shape[0]
    ds.resize(n + len(arrs), axis=0)
    for i, a in enumerate(arrs):  # row by row: h5py turns equal-length rows into a 2-D array
        ds[n + i] = a.reshape(-1)
    return ds
