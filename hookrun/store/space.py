"""The bytes a batch adds to a run's file, counted before it is written: H5Store refuses a batch the disk
cannot hold while there is still room to close the file cleanly.

    need = batch_bytes(store, rec)            # whole chunks the batch's rows open, plus room for metadata

A chunked dataset takes whole chunks on disk, so a batch needs the chunks its rows open: for a capture's
first batch the chunk is the one its column will be made with (store/columns.py's new_dataset: about
chunk_bytes_for(captures) bytes, no more rows than the capture can get), from the shapes the batch holds;
a capture of a few bytes a row opens a chunk of a few bytes. The sample table's numbers, variable-length
rows and the metadata a flush writes (object headers, chunk indexes, the checksums table) are counted too.
"""

from __future__ import annotations

import math
from typing import Any

from hookrun.store import format as layout
from hookrun.store.columns import chunk_bytes_for
from hookrun.store.records import StepRecord

METADATA_BYTES = 64 << 10  # kept free for what a flush and the close write beside the rows (a new file's is ~20 KB)
DATASET_BYTES = 8 << 10  # each new dataset's object header and chunk index (~3 KB measured)


def batch_bytes(store: Any, rec: StepRecord) -> int:
    """Bytes `rec` may add to `store`'s file (an H5Store), rounded up to whole chunks."""
    n = len(rec.sample_index)
    new = [cap for cap in rec.captures if cap.key.path not in store._columns]
    chunk_bytes = chunk_bytes_for(len(store._columns) + len(new))  # as H5Store._write
    need = METADATA_BYTES + DATASET_BYTES * len(new)
    table = store.table
    for ds in (table.index, table.step, *table.optional.values()):  # the sample table's rows
        need += _growth(ds.shape[0], n, ds.chunks[0] if ds.chunks else n, ds.dtype.itemsize)
    if store.samples == 0:
        need += 2 * DATASET_BYTES  # (optional columns: target, tokens, made at the first batch)
    for cap in rec.captures:
        if cap.ragged:
            need += sum(v.numel() * v.element_size() for v in cap.value) + 16 * len(cap.value) + \
                (layout.RAGGED_CHUNK * 16 if cap.key.path not in store._columns else 0)
            continue
        shape = tuple(cap.value.shape)
        rows, row_shape = (1, shape) if cap.per_step else (shape[0], shape[1:])
        row_bytes = max(1, math.prod(row_shape) * cap.value.element_size())
        col = store._columns.get(cap.key.path)
        if col is not None:
            chunk = col.ds.chunks[0] if col.ds.chunks else rows
            need += _growth(col.ds.shape[0], rows, chunk, row_bytes)
            continue
        bound = layout.capture_bound(cap, store.expected[False], store.expected[True], max(1, n),
                                     rec.token_width or math.ceil(max(1, rows) / max(1, n)))
        chunk = layout.chunk_rows(row_bytes, chunk_bytes, bound)  # as columns.new_dataset
        need += _growth(0, rows, chunk, row_bytes)
    return need


def _growth(have: int, rows: int, chunk: int, row_bytes: int) -> int:
    """Bytes of the whole chunks `rows` more rows open in a dataset of `have` rows."""
    return (layout.allocated(have + rows, chunk) - layout.allocated(have, chunk)) * row_bytes
