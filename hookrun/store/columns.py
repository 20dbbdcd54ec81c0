"""Capture columns: the dataset of each capture in an HDF5 run file, created at its first batch from
the real shape and dtype (a later batch's rows of a dtype it cannot hold are refused), appended to batch
by batch, given a `<name>.index` sibling once its rows skip batches, digested into /checksums.

    from hookrun.store.h5store import H5Store
    with H5Store(path, attrs={}) as store:
        store.write(step_record)          # each capture's rows go through CaptureColumns
        rows = store.rows_by_key()        # {(hook, module, role, call): rows written}

CaptureColumns is a part of H5Store (store/h5store.py), which owns the file, the sample table, the
digest log and the counts these methods read: `file`, `table`, `digests`, `compression`, `expected`,
`checksum`, `steps`, `first_step` and the `_columns` dict by capture path.

Variable-length rows and the `<name>.index` of a capture that skips batches: store/uneven_rows.py,
loaded at the first such rows.

The /samples group: what each row is (dataset index, batch, target, path, batch keys, token map).

    table = SampleTable(file, compression=None)
    table.write(step_record, start=samples_before)

/samples/index and /samples/step exist from the start; target from the first batch (every batch has
one, or none does); path, `data.store` keys, texts and the token map (/samples/token_sample,
token_position, token_generated) at the first batch with them, backfilled. docs/format.md: each.

Chunked, resizable datasets: how big a chunk is, and appending whole blocks of rows.

    ds = new_dataset(file, "captures/f/layer1.0/output", first_batch, compression=None, max_rows=64)
    append(ds, next_batch)

A chunk holds about CHUNK_BYTES of rows with few captures; with many they share CACHE_BUDGET (down to
MIN_CHUNK_BYTES each: each keeps the chunk it fills in memory). No chunk holds more rows than the
run can write (store/__init__.py: `limit`, `every`, samples, token rows): HDF5 allocates whole chunks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import h5py
import numpy as np

import hookrun.store as layout  # the format's chunk sizes
from hookrun.errors import RunError
from hookrun.store import CaptureMeta, storable_text
from hookrun.store.records import Capture, StepRecord
from hookrun.store.writer import DigestLog, digest, digest_ragged


@dataclass
class Column:
    ds: h5py.Dataset
    per_step: bool
    key: tuple  # (hook, module, role, call)
    index: h5py.Dataset | None = None  # sample (or step) index of each row, once rows skip
    digest_id: int | None = None  # its number in the run's /checksums table (store/writer.py)
    bound: int | None = None  # the most rows it can get (store/__init__.py), where known


class CaptureColumns:
    """The capture-writing half of H5Store: one column (dataset, its index, its digest id) per capture."""

    # set by H5Store
    file: h5py.File
    table: SampleTable
    digests: DigestLog
    compression: str | None
    expected: dict[bool, int | None]
    checksum: bool
    steps: int
    first_step: int
    _columns: dict[str, Column]

    def _write_capture(self, cap: Capture, rec: StepRecord, samples_before: int, chunk_bytes: int) -> None:
        path = cap.key.path
        col = self._columns.get(path)
        if cap.ragged:  # variable-length rows
            from hookrun.store.uneven_rows import append_ragged

            ds, flat = append_ragged(self.file, col.ds if col else None, cap, rec.step,
                                     self.steps if cap.per_step else samples_before, self.compression)
            k = cap.key
            col = col or self._columns.setdefault(path, Column(ds, cap.per_step, (k.hook, k.module, k.role, k.call)))
            self._digest(path, col, flat)
            return
        arr = cap.value.numpy(force=True)
        if col is None:
            col = self._columns[path] = self._new_column(cap, arr, chunk_bytes, rec)
        if col.per_step != cap.per_step:
            kind = "one row per step" if col.per_step else "one row per sample"
            raise RunError(f"{path}: its first batch gave {kind}, batch {rec.step} did not (shape {arr.shape})")
        rows = arr[None] if cap.per_step else arr
        if rows.shape[1:] != col.ds.shape[1:]:
            raise RunError(f"{path}: batch {rec.step} has rows of shape {rows.shape[1:]}, earlier batches {col.ds.shape[1:]}; a "
                           f"capture needs one shape per row (select or reduce to one, or record it with rows: ragged where "
                           f"its first dim changes from batch to batch)")
        if not np.can_cast(rows.dtype, col.ds.dtype, "safe"):  # (float64 rows cast into a float16 column: 1e6 became inf)
            raise RunError(f"{path}: batch {rec.step} gives {rows.dtype} rows, earlier batches {col.ds.dtype} (the capture's dtype, which "
                           f"cannot hold them); store one dtype: the record's dtype: {rows.dtype}, or output.dtype={rows.dtype}")
        expected = self.steps if cap.per_step else samples_before
        if cap.tokens:
            if col.ds.shape[0] != self.table.tokens - len(rows):
                raise RunError(f"{path}: rows: token needs the capture in every batch (batch {rec.step} "
                               f"starts at token row {self.table.tokens - len(rows)}, the capture has {col.ds.shape[0]})")
            append(col.ds, rows)
            self._digest(path, col, rows)
            return
        had = col.index.shape[0] if col.index is not None else 0  # (a new index: its rows before this batch too)
        if col.index is None and (col.ds.shape[0] != expected or cap.index is not None):
            from hookrun.store.uneven_rows import start_index

            have = col.ds.shape[0]
            col.index = start_index(self.file, path, col, self.first_step + np.arange(have) if col.per_step
                                    else self.table.index[:have])
        if col.index is not None:
            ids = np.array([rec.step]) if cap.per_step else (cap.index if cap.index is not None else rec.sample_index)
            append(col.index, ids.astype(np.int64, copy=False))
            if self.checksum:  # which sample each row is: checksummed as the rows are
                self.digests.add_rows(col.index, had)
        append(col.ds, rows)
        self._digest(path, col, rows)

    def _digest(self, path: str, col: Column, rows: np.ndarray | list) -> None:
        """One row of the capture's checksum table: its row count after this batch, xxh3 of the rows
        (kept in memory, written at the next flush: one HDF5 append per capture per flush)."""
        if self.checksum:
            if col.digest_id is None:
                col.digest_id = self.digests.new_id(col.ds)
            value = digest_ragged(rows) if isinstance(rows, list) else digest(rows.astype(col.ds.dtype, copy=False))
            self.digests.add(col.digest_id, col.ds.shape[0], value)

    def _new_column(self, cap: Capture, arr: np.ndarray, chunk_bytes: int, rec: StepRecord) -> Column:
        row = arr if cap.per_step else arr[0]
        n = len(rec.sample_index)
        bound = layout.capture_bound(cap, self.expected[False], self.expected[True], max(1, n),
                              rec.token_width or math.ceil(len(arr) / max(1, n)))  # (no mask: every token is real)
        ds = self._new_dataset(cap.key.path, arr[None] if cap.per_step else arr, max_rows=bound, chunk_bytes=chunk_bytes)
        meta = CaptureMeta.of(cap, row.shape)
        ds.attrs.update(meta.to_attrs())
        return Column(ds, cap.per_step, meta.key, bound=bound)

    def _new_dataset(self, name: str, like: np.ndarray, **kwargs) -> h5py.Dataset:
        return new_dataset(self.file, name, like, self.compression, **kwargs)

    def rows_by_key(self) -> dict[tuple, int]:
        """Rows written so far per capture, by (hook, module, role, call)."""
        return {col.key: col.ds.shape[0] for col in self._columns.values()}


TOKEN_NAMES = ("token_sample", "token_position", "token_generated")


class SampleTable:
    def __init__(self, file: h5py.File, compression: str | None, rows: int | None = None) -> None:
        """`rows`: the samples the run will write, where known: no chunk holds more (a run of 2 samples
        wrote three 64 KiB chunks of sample numbers)."""
        self.file, self.compression, self.rows = file, compression, rows
        self.chunk = layout.capped(layout.INDEX_CHUNK, rows)
        group = file.create_group("samples")
        self.index = group.create_dataset("index", (0,), "int64", maxshape=(None,), chunks=(self.chunk,))
        self.step = group.create_dataset("step", (0,), "int64", maxshape=(None,), chunks=(self.chunk,))
        self.optional: dict[str, h5py.Dataset] = {}  # target, path, data.store keys, texts, token map
        self.tokens = 0  # token rows so far

    def write(self, rec: StepRecord, start: int) -> None:
        """Append one batch's rows; `start` is the number of samples before it."""
        n = len(rec.sample_index)
        self._check_target(rec, start)
        append(self.index, rec.sample_index.astype(np.int64, copy=False))
        append(self.step, np.full(n, rec.step, dtype=np.int64))
        if rec.target is not None:
            self.append("target", rec.target, start, chunk_rows=self.chunk, step=rec.step)
        if rec.path is not None:
            self.append("path", np.array(rec.path, dtype=object), start, step=rec.step)
        for name, arr in (rec.samples or {}).items():
            self.append(name, arr, start, step=rec.step)
        if rec.tokens is not None:  # the token map of `rows: token` captures: samples x tokens rows at most
            width = rec.token_width or math.ceil(len(rec.tokens[0]) / max(1, n))
            chunk = layout.capped(layout.TOKEN_CHUNK, self.rows * width if self.rows else None)
            for name, arr in zip(TOKEN_NAMES, rec.tokens, strict=False):
                dtype = "uint8" if name == "token_generated" else "int64"
                self.append(name, np.asarray(arr).astype(dtype, copy=False), self.tokens, chunk_rows=chunk)
            self.tokens += len(rec.tokens[0])

    def _check_target(self, rec: StepRecord, start: int) -> None:
        """A target in every batch or in none: else /samples/target is short, or says class 0 of samples without one."""
        if (has := rec.target is not None) == ("target" in self.optional) or (has and not start):
            return
        raise RunError(f"/samples/target: batch {rec.step} (samples {rec.sample_index[0]}..{rec.sample_index[-1]}) "
                       f"{'has a target, the batches before it had none' if has else 'has no target, the batches before it had one'}; "
                       f"every item must give a target, or none does (data.target=null)")

    def append(self, name: str, arr: np.ndarray, backfill: int, chunk_rows: int | None = None, step: int = 0) -> None:
        """Rows of /samples/NAME: a sample's (chunks of up to 4096, no more than the run's samples), or
        with `chunk_rows` the token map's."""
        chunk_rows = chunk_rows or min(4096, self.chunk)
        ds = self.optional.get(name)
        if arr.dtype == object:
            arr = storable_text(arr)
        if ds is None and arr.dtype == object:  # paths and texts: UTF-8 strings
            ds = self.file["samples"].create_dataset(name, (backfill,), h5py.string_dtype(), maxshape=(None,),
                                                     chunks=(chunk_rows,))
        elif ds is None:
            ds = new_dataset(self.file, f"samples/{name}", arr, self.compression, chunk_rows=chunk_rows, backfill=backfill)
        self.optional[name] = ds
        if arr.shape[1:] != ds.shape[1:]:
            fix = "every item's target must have one shape" if name == "target" else "pad every sample to one length, e.g. data.padding=max_length"
            raise RunError(f"/samples/{name}: batch {step} has rows of shape {arr.shape[1:]}, earlier batches "
                           f"{ds.shape[1:]}; {fix}")
        append(ds, arr)

    def mark(self) -> dict:
        """Its state before a batch, for store/roll_back.py."""
        sets = [self.index, self.step, *self.optional.values()]
        return {"rows": {d.name: d.shape[0] for d in sets}, "optional": set(self.optional), "tokens": self.tokens}


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
    rows = chunk_rows or layout.chunk_rows(row_bytes, chunk_bytes, max_rows)
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
