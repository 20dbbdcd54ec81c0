"""The HDF5 store: appends one batch at a time to chunked, resizable datasets in one file.

    with H5Store(path, attrs={"config": yaml_text}) as store:
        store.write(step_record)
    # status is 'complete' after a clean exit, 'failed' or 'interrupted' otherwise

The file gets its name only once its skeleton is flushed (store/paths.py), is flushed after the
first batch, then every `flush_every` batches, or every FLUSH_SECONDS when that is None; between
flushes no metadata reaches the disk, so a killed run leaves a file that opens, holding every
batch up to the last flush. A batch that fails part-way is taken out again, so the counts always
equal the rows. Datasets are created at their first batch from the real shapes and
dtypes (store/columns.py). Rows of a per-sample
capture align with /samples/index; where a capture skips a batch it gets a `<name>.index` sibling
with the sample indices of its own rows (step numbers for per-step captures). docs/format.md is
the full description.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import h5py
import numpy as np

from hookrun.errors import RunError
from hookrun.store import FORMAT_VERSION, batch_bytes
from hookrun.store.columns import CHUNK_BYTES, CaptureColumns, Column, SampleTable, chunk_bytes_for
from hookrun.store.paths import create_hidden, flushing_path
from hookrun.store.records import Capture, StepRecord
from hookrun.store.writer import DigestLog

if TYPE_CHECKING:
    from hookrun.store.kind_tables import TableWriter

FLUSH_SECONDS = 2.0


class H5Store(CaptureColumns):
    def __init__(self, path: str | os.PathLike, attrs: dict, compression: str = "none", flush_every: int | None = None,
                 expected_samples: int | None = None, expected_steps: int | None = None, checksum: bool = False) -> None:
        self.path = Path(path)
        self.after_first_batch: Callable[[H5Store], None] | None = None
        self.copy_of: tuple[Path, int] | None = None  # resuming: the old file its batches are copied from, and how many
        self.closed_as: str | None = None  # the status close() gave the file
        self.checksum = checksum  # a digest of each batch's rows per capture (store/writer.py)
        self.compression = None if compression in (None, "none") else compression
        self.flush_every = flush_every
        self.expected = {False: expected_samples, True: expected_steps}  # rows a capture will get, where known
        self._previous = (0, 0)  # steps and samples of the last flush
        # each capture caches only the chunk it is filling (set in _new_dataset): appends never
        # re-read a chunk, and memory stays bounded however many rows or captures there are
        self.file, self.raw, hidden = create_hidden(self.path, rdcc_nbytes=2 * CHUNK_BYTES, rdcc_w0=1.0)
        try:
            self._skeleton(attrs)
            flushing_path(self.path).unlink(missing_ok=True)  # a killed flush's file: this run replaces it
            os.replace(hidden, self.path)  # visible only once it opens: the skeleton is on disk
        except BaseException:
            self.file.close()
            self.raw.close()
            hidden.unlink(missing_ok=True)
            raise

    def _skeleton(self, attrs: dict) -> None:
        self.file.attrs["format_version"] = FORMAT_VERSION
        for key, value in attrs.items():
            self.file.attrs[key] = str(value) if isinstance(value, str) else value
        self.file.attrs["status"] = "running"
        self.table = SampleTable(self.file, self.compression, self.expected[False])
        self.digests = DigestLog(self.file, self.expected[True])  # the run's /checksums table, written at each flush
        self._columns: dict[str, Column] = {}
        self.tables: dict[str, TableWriter] = {}  # a kind's named tables (/NAME), made at their first rows (store/kind_tables.py)
        self.run_state = None  # stateful actions' latest state, written at flush (store/run_state.py: made by the first)
        self.overflow: dict[str, int] = {}  # values a cast turned into inf, per capture path
        self.underflow: dict[str, int] = {}  # nonzero values a cast turned into 0, per capture path
        self.steps = 0
        self.samples = 0
        self.first_step = 0  # the step of the first batch written (a rank's shard starts past 0)
        self._flushed_at = time.monotonic()
        self.flush()

    # -- writing ---------------------------------------------------------------------------
    def write(self, rec: StepRecord) -> None:
        """Append one batch; a batch that fails part-way is taken out again (rows and new datasets),
        so every dataset holds whole batches and the counts agree with the rows."""
        new = sum(cap.key.path not in self._columns for cap in rec.captures)
        chunk_bytes = chunk_bytes_for(len(self._columns) + new)  # the chunks of the captures this batch creates
        self._check_space(rec, chunk_bytes)
        mark = self._mark()
        try:
            self._write(rec, chunk_bytes)
        except BaseException:
            from hookrun.store.roll_back import roll_back

            roll_back(self, mark)
            raise
        self.samples += len(rec.sample_index)
        self.steps += 1
        if rec.state:
            self.keep_state(rec.state)
        due = self.steps % self.flush_every == 0 if self.flush_every else time.monotonic() - self._flushed_at > FLUSH_SECONDS
        if due or self.steps == 1:  # the first batch's datasets reach the disk at once
            self.flush()
            if self.steps == 1 and self.after_first_batch is not None:
                self.after_first_batch(self)  # (output.overwrite: the new file takes the old one's name now)

    def _write(self, rec: StepRecord, chunk_bytes: int) -> None:
        start = self.samples
        if not self.steps:
            self.first_step = rec.step
        rows = self.table.mark()["rows"]  # each /samples dataset's rows before this batch
        self.table.write(rec, start)
        if self.checksum:  # the sample table too: a changed index, target or token map would map rows to the wrong samples
            for ds in (self.table.index, self.table.step, *self.table.optional.values()):
                self.digests.add_rows(ds, rows.get(ds.name, 0))
        for cap in rec.captures:
            self._write_capture(cap, rec, start, chunk_bytes)
        for name, rows in rec.tables.items():
            if name not in self.tables:
                from hookrun.store.kind_tables import (
                    table,  # (a kind's table: loaded at its first rows)
                )

                self.tables[name] = table(name).writer(self.file)
            self.tables[name].write(rec.step, rows)
        for cap in rec.captures:
            if cap.overflow is not None and (n_inf := int(cap.overflow)):
                self.overflow[cap.key.path] = self.overflow.get(cap.key.path, 0) + n_inf
            if cap.underflow is not None and (n_zero := int(cap.underflow)):
                self.underflow[cap.key.path] = self.underflow.get(cap.key.path, 0) + n_zero

    def _mark(self) -> dict:
        """The rows of every dataset before a batch (for store/roll_back.py)."""
        sets = [d for col in self._columns.values() for d in (col.ds, col.index) if d is not None]
        return {"rows": {d.name: d.shape[0] for d in sets}, "columns": set(self._columns), "table": self.table.mark(),
                "indexed": {p for p, col in self._columns.items() if col.index is not None},
                "pending": self.digests.mark(),
                "tables": {name: t.mark() for name, t in self.tables.items()}}

    def _check_space(self, rec: StepRecord, chunk_bytes: int) -> None:
        """Refuse a batch the disk may not hold, while there is still room to close the file
        cleanly. (Once HDF5 writes fail, its metadata and data on disk can disagree.)"""
        need = batch_bytes(self, rec, chunk_bytes)  # (the chunks _write gives its new captures)
        free = shutil.disk_usage(self.path.parent).free
        if free < need and self.copy_of is not None:  # (this file is the copy: deleted, the old one kept)
            raise RunError(f"resume: no space left on the device to copy the batches of {self.copy_of[0]} ({free} bytes free, "
                           f"batch {rec.step} needs about {need}); it is as it was, with its {self.copy_of[1]} batches: free "
                           f"some space and resume again")
        if free < need:
            raise RunError(
                f"writing {self.path} stopped before batch {rec.step}: no space left on the device "
                f"({free} bytes free, the batch needs about {need}); the file keeps every batch before it"
            )

    # -- state -----------------------------------------------------------------------------
    def flush(self) -> None:
        """Rows, their lengths and the counts reach the disk in one HDF5 flush. No metadata is
        written between flushes (store/paths.py), and what a flush rewrites in place is applied all
        at once (store/held.py), so a kill -9 at any moment leaves the file of one whole flush under
        its name, in which every dataset's length agrees with `samples_complete` and `steps_complete`."""
        self.digests.write()
        self._update_counts()
        self.raw.hold(filling_chunks(self._datasets()))
        try:
            self.file.flush()  # new space on disk; what the last flush's file is made of: held
        finally:
            self.raw.release()  # all at once (store/held.py); nothing once a write failed (a full disk)
        if self.raw.error is not None:  # the file keeps the last whole flush
            raise self.raw.error
        self._flushed_at = time.monotonic()
        self._previous = (self.steps, self.samples)

    @property
    def kept_steps(self) -> int:
        """The batches the file keeps: after a write the disk refused, the last whole flush's; else every one written."""
        return self._previous[0] if self.raw.error is not None else self.steps

    def _datasets(self) -> list[h5py.Dataset]:
        """The datasets rows are appended to (their last chunks are rewritten at each flush)."""
        cols = [d for col in self._columns.values() for d in (col.ds, col.index) if d is not None]
        tables = [self.digests.table] if self.digests.table is not None else []
        return cols + tables + [self.table.index, self.table.step, *self.table.optional.values()]

    def _update_counts(self) -> None:
        for t in self.tables.values():  # a kind's totals: those of the batches this flush holds
            t.flush()
        if self.run_state is not None:  # actions' state: that of the batches this flush holds
            self.run_state.flush(self.file, self.steps)
        self.file.attrs["steps_complete"] = self.steps
        self.file.attrs["samples_complete"] = self.samples
        self.file.attrs["previous_flush"] = np.array(self._previous, dtype=np.int64)  # (steps, samples)
        for name, counts in (("overflow_values", self.overflow), ("underflow_values", self.underflow)):
            for path, n in counts.items():
                if path in self._columns:
                    self._columns[path].ds.attrs[name] = n

    def overflow_by_key(self) -> dict[tuple, int]:
        """Values a cast turned from finite into inf, per capture (hook, module, role, call)."""
        return {self._columns[p].key: n for p, n in self.overflow.items() if p in self._columns}

    def underflow_by_key(self) -> dict[tuple, int]:
        """Nonzero values a cast turned into 0, per capture (hook, module, role, call)."""
        return {self._columns[p].key: n for p, n in self.underflow.items() if p in self._columns}

    def keep_state(self, state: dict[str, dict]) -> None:
        """The actions' state of the batches written so far (a resumed run's: those replayed), saved at
        the next flush; the first state makes the store's RunState (a run with no stateful action has none)."""
        if self.run_state is None:
            from hookrun.store.run_state import RunState

            self.run_state = RunState()
        self.run_state.keep(self.steps, state)

    def write_features(self, captures: list[Capture]) -> None:
        """End-of-run captures (one row per feature: top_examples), written once before close."""
        from hookrun.store.run_state import write_features

        write_features(self.file, captures)
        if self.checksum:  # checked by inspect --verify like every batch's rows (the table reaches the file at close's flush)
            for cap in captures:
                self.digests.add_rows(self.file[cap.key.path], 0)

    def set_attrs(self, attrs: dict) -> None:
        """Root attributes written at the end of a run (before close)."""
        for key, value in attrs.items():
            self.file.attrs[key] = value

    def close(self, status: str) -> None:
        if not self.file.id.valid:
            return
        try:
            self.flush()  # every row on disk before the status says so: a kill in close() cannot show a short file as complete
            self.raw.hold()
            self.closed_as = status
            try:
                self.file.attrs["status"] = status
                self.file.attrs["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
                self.file.close()
            finally:
                self.raw.release()
            if self.raw.error is not None:
                raise self.raw.error
        finally:
            if self.file.id.valid:
                self.file.close()
            self.raw.close()

    def __enter__(self) -> H5Store:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close("complete")
        elif issubclass(exc_type, KeyboardInterrupt):
            self.close("interrupted")
        else:
            self.close("failed")


def filling_chunks(datasets: list[h5py.Dataset]) -> list[tuple[int, int]]:
    """The byte ranges of each uncompressed dataset's last chunk, where it is on disk already."""
    ranges = []
    for ds in datasets:
        if ds.compression or not ds.chunks or not ds.shape[0] or h5py.check_vlen_dtype(ds.dtype) is not None:
            continue
        first = (ds.shape[0] - 1) // ds.chunks[0] * ds.chunks[0]
        info = ds.id.get_chunk_info_by_coord((first,) + (0,) * (ds.ndim - 1))
        if info.byte_offset is not None:
            ranges.append((info.byte_offset, info.byte_offset + info.size))
    return ranges
