"""Chunked, resizable datasets: how big a chunk is, and appending whole blocks of rows.

    ds = new_dataset(file, "captures/f/layer1.0/output", first_batch, compression=None, max_rows=64)
    append(ds, next_batch)

A chunk holds about CHUNK_BYTES along the row axis while a run has few captures; with many they
share CACHE_BUDGET (down to MIN_CHUNK_BYTES each), since each capture keeps the chunk it is
filling in memory. A chunk never holds more rows than the run will write.
"""

from __future__ import annotations

import math

import h5py
import numpy as np

CHUNK_BYTES = 1 << 20  # about 1 MiB per chunk along the row axis, with few captures
MIN_CHUNK_BYTES = 64 << 10  # ... and no less than 64 KiB, with many
CACHE_BUDGET = 64 << 20  # the open chunks of all captures together, held in memory until full


def chunk_bytes_for(n_captures: int) -> int:
    """Bytes per chunk when a run has `n_captures` capture datasets: CHUNK_BYTES while they fit in
    CACHE_BUDGET together, smaller (down to MIN_CHUNK_BYTES) when there are many."""
    return max(MIN_CHUNK_BYTES, min(CHUNK_BYTES, CACHE_BUDGET // max(1, n_captures)))


def new_dataset(file: h5py.File, name: str, like: np.ndarray, compression: str | None, chunk_rows: int | None = None,
                backfill: int = 0, max_rows: int | None = None, chunk_bytes: int = CHUNK_BYTES) -> h5py.Dataset:
    """A dataset with `like`'s row shape and dtype, `backfill` rows long. Chunks of about
    `chunk_bytes` along the rows (at least one row), but no more rows than the run will write; the
    dataset's chunk cache holds one chunk, the one being filled."""
    row_shape = like.shape[1:]
    row_bytes = max(1, int(np.prod(row_shape, dtype=np.int64)) * like.dtype.itemsize)
    rows = chunk_rows or max(1, chunk_bytes // row_bytes)
    if max_rows:  # as few chunks as the run needs, evenly filled (no half-empty last chunk)
        rows = math.ceil(max_rows / math.ceil(max_rows / rows))
    # a dim of size 0 (no boxes in this batch) needs a chunk of 1 there, and room to stay valid
    return file.create_dataset(
        name, shape=(backfill, *row_shape), dtype=like.dtype, maxshape=(None, *(d or None for d in row_shape)),
        chunks=(rows, *(d or 1 for d in row_shape)), compression=compression,
        rdcc_nbytes=rows * row_bytes + 1024, rdcc_w0=1.0,
    )


def append(ds: h5py.Dataset, rows: np.ndarray) -> None:
    """Add `rows` at the end of `ds` (one resize, one write)."""
    n = ds.shape[0]
    ds.resize(n + len(rows), axis=0)
    ds[n:] = rows
