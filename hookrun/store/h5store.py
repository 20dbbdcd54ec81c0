"""The HDF5 store: appends one batch at a time to chunked, resizable datasets in one file.

    with H5Store(path, attrs={"config": yaml_text}) as store:
        store.write(step_record)
    # status is 'complete' after a clean exit, 'failed' or 'interrupted' otherwise

The file is flushed every `flush_every` batches, or every FLUSH_SECONDS when that is None; between
flushes no metadata reaches the disk, so a killed run leaves a file that opens, holding every
batch up to the last flush. Datasets are created at their first batch from the real shapes and
dtypes. Rows of a per-sample
capture align with /samples/index; where a capture skips a batch it gets a `<name>.index` sibling
with the sample indices of its own rows (step numbers for per-step captures). docs/format.md is
the full description.
"""

from __future__ import annotations

import math
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from hookrun.errors import RunError
from hookrun.store.format import FORMAT_VERSION
from hookrun.store.ragged import append_ragged
from hookrun.store.records import Capture, StepRecord

CHUNK_BYTES = 1 << 20  # about 1 MiB per chunk along the row axis, with few captures
MIN_CHUNK_BYTES = 64 << 10  # ... and no less than 64 KiB, with many
CACHE_BUDGET = 64 << 20  # the open chunks of all captures together, held in memory until full
FLUSH_SECONDS = 2.0
SPACE_MARGIN = 1 << 20  # bytes kept free for metadata and for closing the file


@dataclass
class _Column:
    ds: h5py.Dataset
    per_step: bool
    key: tuple  # (hook, module, role, call)
    index: h5py.Dataset | None = None  # sample (or step) index of each row, once rows skip


class H5Store:
    def __init__(self, path: str | os.PathLike, attrs: dict, compression: str = "none", flush_every: int | None = None,
                 expected_samples: int | None = None, expected_steps: int | None = None) -> None:
        self.path = Path(path)
        self.compression = None if compression in (None, "none") else compression
        self.flush_every = flush_every
        self.expected = {False: expected_samples, True: expected_steps}  # rows a capture will get, where known
        # each capture caches only the chunk it is filling (set in _new_dataset): appends never
        # re-read a chunk, and memory stays bounded however many rows or captures there are
        self.file = h5py.File(self.path, "w", rdcc_nbytes=2 * CHUNK_BYTES, rdcc_w0=1.0)
        _metadata_only_at_flush(self.file)
        self.file.attrs["format_version"] = FORMAT_VERSION
        for key, value in attrs.items():
            self.file.attrs[key] = str(value) if isinstance(value, str) else value
        self.file.attrs["status"] = "running"
        samples = self.file.create_group("samples")
        self._index = samples.create_dataset("index", (0,), "int64", maxshape=(None,), chunks=(8192,))
        self._step = samples.create_dataset("step", (0,), "int64", maxshape=(None,), chunks=(8192,))
        self._target: h5py.Dataset | None = None
        self._paths: h5py.Dataset | None = None
        self._columns: dict[str, _Column] = {}
        self._extra: dict[str, h5py.Dataset] = {}  # /samples/<name> of data.store
        self._tokens: tuple[h5py.Dataset, h5py.Dataset] | None = None  # /samples/token_sample, token_position
        self.tokens = 0  # token rows so far
        self.steps = 0
        self.samples = 0
        self._flushed_at = time.monotonic()
        self._update_counts()

    # -- writing ---------------------------------------------------------------------------
    def write(self, rec: StepRecord) -> None:
        self._check_space(rec)
        n = len(rec.sample_index)
        start = self.samples
        _append(self._index, rec.sample_index.astype(np.int64, copy=False))
        _append(self._step, np.full(n, rec.step, dtype=np.int64))
        if rec.target is not None:
            if self._target is None:
                self._target = self._new_dataset("samples/target", rec.target, chunk_rows=8192, backfill=start)
            _append(self._target, rec.target)
        if rec.path is not None:
            if self._paths is None:
                self._paths = self.file["samples"].create_dataset(
                    "path", (start,), h5py.string_dtype(), maxshape=(None,), chunks=(4096,)
                )
            _append(self._paths, np.array(rec.path, dtype=object))
        for name, arr in (rec.samples or {}).items():
            ds = self._extra.get(name)
            if ds is None:
                ds = self._extra[name] = self._new_dataset(f"samples/{name}", arr, chunk_rows=4096, backfill=start)
            if arr.shape[1:] != ds.shape[1:]:
                raise RunError(f"/samples/{name}: batch {rec.step} has rows of shape {arr.shape[1:]}, earlier batches "
                               f"{ds.shape[1:]} (pad every sample to one length, e.g. data.padding=max_length)")
            _append(ds, arr)
        if rec.tokens is not None:
            self._write_tokens(rec.tokens)
        new = sum(cap.key.path not in self._columns for cap in rec.captures)
        chunk_bytes = chunk_bytes_for(len(self._columns) + new)  # for the captures this batch creates
        for cap in rec.captures:
            self._write_capture(cap, rec, start, chunk_bytes)
        self.samples += n
        self.steps += 1
        due = self.steps % self.flush_every == 0 if self.flush_every else time.monotonic() - self._flushed_at > FLUSH_SECONDS
        if due:
            self.flush()

    def _write_tokens(self, tokens: tuple[np.ndarray, np.ndarray]) -> None:
        """The token map of `rows: token` captures: the sample and position of every token row."""
        if self._tokens is None:
            group = self.file["samples"]
            self._tokens = tuple(group.create_dataset(name, (0,), "int64", maxshape=(None,), chunks=(8192,))
                                 for name in ("token_sample", "token_position"))
        for ds, arr in zip(self._tokens, tokens, strict=True):
            _append(ds, arr.astype(np.int64, copy=False))
        self.tokens += len(tokens[0])

    def _check_space(self, rec: StepRecord) -> None:
        """Refuse a batch the disk may not hold, while there is still room to close the file
        cleanly. (Once HDF5 writes fail, its metadata and data on disk can disagree.)"""
        need = SPACE_MARGIN
        for cap in rec.captures:
            if cap.ragged:
                need += sum(v.numel() * v.element_size() for v in cap.value)
                continue
            need += cap.value.numel() * cap.value.element_size()
            col = self._columns.get(cap.key.path)
            chunk = col.ds.chunks if col is not None else None
            need += int(np.prod(chunk)) * col.ds.dtype.itemsize if chunk else CHUNK_BYTES  # a new chunk may start
        free = shutil.disk_usage(self.path.parent).free
        if free < need:
            raise RunError(
                f"writing {self.path} stopped before batch {rec.step}: no space left on the device "
                f"({free} bytes free, the batch needs about {need}); the file keeps every batch before it"
            )

    def _write_capture(self, cap: Capture, rec: StepRecord, samples_before: int, chunk_bytes: int) -> None:
        if cap.ragged:
            self._write_ragged(cap, rec, samples_before)
            return
        arr = cap.value.numpy(force=True)
        path = cap.key.path
        col = self._columns.get(path)
        if col is None:
            col = self._columns[path] = self._new_column(cap, arr, chunk_bytes)
        if col.per_step != cap.per_step:
            kind = "one row per step" if col.per_step else "one row per sample"
            raise RunError(f"{path}: its first batch gave {kind}, batch {rec.step} did not (shape {arr.shape})")
        rows = arr[None] if cap.per_step else arr
        if rows.shape[1:] != col.ds.shape[1:]:
            raise RunError(
                f"{path}: batch {rec.step} has rows of shape {rows.shape[1:]}, earlier batches "
                f"{col.ds.shape[1:]}; a capture needs one shape per row (select or reduce to one, or record it with "
                f"rows: ragged where its first dim changes from batch to batch)"
            )
        expected = self.steps if cap.per_step else samples_before
        if cap.tokens:
            if col.ds.shape[0] != self.tokens - len(rows):
                raise RunError(f"{path}: rows: token needs the capture in every batch (batch {rec.step} "
                               f"starts at token row {self.tokens - len(rows)}, the capture has {col.ds.shape[0]})")
            _append(col.ds, rows)
            return
        if col.index is None and (col.ds.shape[0] != expected or cap.index is not None):
            col.index = self._start_index(path, col)
        if col.index is not None:
            ids = np.array([rec.step]) if cap.per_step else (cap.index if cap.index is not None else rec.sample_index)
            _append(col.index, ids.astype(np.int64, copy=False))
        _append(col.ds, rows)

    def _write_ragged(self, cap: Capture, rec: StepRecord, samples_before: int) -> None:
        col = self._columns.get(cap.key.path)
        before = self.steps if cap.per_step else samples_before
        ds = append_ragged(self.file, col.ds if col else None, cap, rec.step, before, self.compression)
        if col is None:
            k = cap.key
            self._columns[cap.key.path] = _Column(ds, cap.per_step, (k.hook, k.module, k.role, k.call))

    def _new_column(self, cap: Capture, arr: np.ndarray, chunk_bytes: int) -> _Column:
        row = arr if cap.per_step else arr[0]
        ds = self._new_dataset(cap.key.path, arr[None] if cap.per_step else arr,
                               max_rows=None if cap.tokens else self.expected[cap.per_step],
                               chunk_bytes=chunk_bytes)
        k = cap.key
        ds.attrs.update(
            hook=k.hook, module=k.module, type=k.type, role=k.role, call=k.call,
            rows="steps" if cap.per_step else ("tokens" if cap.tokens else "samples"), torch_dtype=cap.torch_dtype,
            row_shape=np.array(row.shape, dtype=np.int64), index="",
        )
        for key, value in cap.attrs.items():
            ds.attrs[key] = value
        return _Column(ds, cap.per_step, (k.hook, k.module, k.role, k.call))

    def _start_index(self, path: str, col: _Column) -> h5py.Dataset:
        """A capture that skipped a batch: index its rows explicitly from now on."""
        have = col.ds.shape[0]
        first = np.arange(have) if col.per_step else self._index[:have]
        name = f"{path}.index"
        ds = self.file.create_dataset(name, data=first.astype(np.int64), maxshape=(None,), chunks=(8192,))
        col.ds.attrs["index"] = name.rsplit("/", 1)[1]
        return ds

    def _new_dataset(self, name: str, like: np.ndarray, chunk_rows: int | None = None, backfill: int = 0,
                     max_rows: int | None = None, chunk_bytes: int = CHUNK_BYTES) -> h5py.Dataset:
        """Chunks of about `chunk_bytes` along the rows (at least one row), but no more rows than the
        run will write; the dataset's chunk cache holds one chunk, the one being filled."""
        row_shape = like.shape[1:]
        row_bytes = max(1, int(np.prod(row_shape, dtype=np.int64)) * like.dtype.itemsize)
        rows = chunk_rows or max(1, chunk_bytes // row_bytes)
        if max_rows:  # as few chunks as the run needs, evenly filled (no half-empty last chunk)
            rows = math.ceil(max_rows / math.ceil(max_rows / rows))
        # a dim of size 0 (no boxes in this batch) needs a chunk of 1 there, and room to stay valid
        return self.file.create_dataset(
            name, shape=(backfill, *row_shape), dtype=like.dtype, maxshape=(None, *(d or None for d in row_shape)),
            chunks=(rows, *(d or 1 for d in row_shape)), compression=self.compression,
            rdcc_nbytes=rows * row_bytes + 1024, rdcc_w0=1.0,
        )

    def rows_by_key(self) -> dict[tuple, int]:
        """Rows written so far per capture, by (hook, module, role, call)."""
        return {col.key: col.ds.shape[0] for col in self._columns.values()}

    # -- state -----------------------------------------------------------------------------
    def flush(self) -> None:
        self._update_counts()
        self.file.flush()
        self._flushed_at = time.monotonic()

    def _update_counts(self) -> None:
        self.file.attrs["steps_complete"] = self.steps
        self.file.attrs["samples_complete"] = self.samples

    def close(self, status: str) -> None:
        if not self.file.id.valid:
            return
        try:
            self._update_counts()
            self.file.flush()  # every row on disk before the status says so: a kill in close() cannot show a short file as complete
            self.file.attrs["status"] = status
            self.file.attrs["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        finally:
            self.file.close()

    def __enter__(self) -> H5Store:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close("complete")
        elif issubclass(exc_type, KeyboardInterrupt):
            self.close("interrupted")
        else:
            self.close("failed")


def chunk_bytes_for(n_captures: int) -> int:
    """Bytes per chunk when a run has `n_captures` capture datasets: CHUNK_BYTES while they fit in
    CACHE_BUDGET together, smaller (down to MIN_CHUNK_BYTES) when there are many."""
    return max(MIN_CHUNK_BYTES, min(CHUNK_BYTES, CACHE_BUDGET // max(1, n_captures)))


def _metadata_only_at_flush(f: h5py.File) -> None:
    """Keep dirty metadata in memory until flush(): then a crash (kill -9) leaves the file as it
    was at the last flush, which plain h5py and h5ls open. (SWMR files, the other way, need
    h5clear after a crash before h5ls or a plain h5py.File can open them.)"""
    cfg = f.id.get_mdc_config()
    cfg.evictions_enabled = False
    cfg.incr_mode = 0  # H5C_incr__off
    cfg.flash_incr_mode = 0  # H5C_flash_incr__off
    cfg.decr_mode = 0  # H5C_decr__off
    f.id.set_mdc_config(cfg)


def _append(ds: h5py.Dataset, rows: np.ndarray) -> None:
    n = ds.shape[0]
    ds.resize(n + len(rows), axis=0)
    ds[n:] = rows
