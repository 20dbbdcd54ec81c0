"""Checksums of stored rows: one xxh3-64 digest per batch of each capture, written as the rows are.

    ds.attrs["digest"] == "/checksums:3"              # the run's table, and this capture's number in it
    f["/checksums"][j] == [3, end_row, xxh3]          # rows [previous end, end_row) of one batch of capture 3

Every append of a capture's rows (one batch) adds one row to the run's /checksums table: the
capture's number, its row count after the batch and the xxh3-64 digest of those rows' bytes as
stored. A reader recomputes it from the rows alone, so a damaged block of a file is named, never
read as if it were data (store/verify.py: resume and `python -m hookrun.inspect --verify FILE`).
Written by the store's writer thread at each flush; xxh3 runs at about 15 GB/s (docs/benchmarks.md
has its cost). Each capture's `<role>.index` and every /samples dataset (what maps a row to its
sample) are digested too, from their rows read back as stored (DigestLog.add_rows).
"""

from __future__ import annotations

import h5py
import numpy as np
import xxhash

from hookrun.store.format import DIGEST_CHUNK, capped

TABLE = "/checksums"


class DigestLog:
    """The run's /checksums table as a store writes it: rows kept in memory between flushes, one
    HDF5 append per flush (a table per capture held a chunk cache each: 600 captures grew memory
    past the load test's bound)."""

    def __init__(self, file: h5py.File, steps: int | None = None) -> None:
        self.file, self.steps = file, steps  # steps: the run's batches, where known (no chunk holds more rows)
        self.pending: list[tuple[int, int, int]] = []  # (dataset's number, rows after the batch, xxh3)
        self.table: h5py.Dataset | None = None
        self.ids: dict[str, int] = {}  # datasets numbered by id_of (the sample table's)
        self.next_id = 0

    def new_id(self, ds: h5py.Dataset) -> int:
        """The next number in the table, named in the dataset's `digest` attribute."""
        k, self.next_id = self.next_id, self.next_id + 1
        ds.attrs["digest"] = f"{TABLE}:{k}"
        return k

    def id_of(self, ds: h5py.Dataset) -> int:
        """The dataset's number, given at its first call."""
        if ds.name not in self.ids:
            self.ids[ds.name] = self.new_id(ds)
        return self.ids[ds.name]

    def add(self, k: int, rows_after: int, value: int) -> None:
        self.pending.append((k, rows_after, value))

    def add_rows(self, ds: h5py.Dataset, start: int) -> None:
        """The digest of `ds`'s rows from `start` to its end (what a batch appended; a new dataset's
        backfill too), read back as stored; nothing where no row was appended."""
        if ds.shape[0] > start:
            self.add(self.id_of(ds), ds.shape[0], digest_stored(ds, ds[start:]))

    def mark(self) -> tuple[int, int]:
        return len(self.pending), self.next_id

    def roll_back(self, mark: tuple[int, int]) -> None:
        """Take out a failed batch's digests, and the numbers it gave: its new datasets are deleted, and
        one that stays (the sample table's) loses its `digest` attribute, to get a number again."""
        del self.pending[mark[0]:]
        for name in [name for name, k in self.ids.items() if k >= mark[1]]:
            del self.ids[name]
            if name in self.file and "digest" in self.file[name].attrs:
                del self.file[name].attrs["digest"]
        self.next_id = mark[1]

    def write(self) -> None:
        """The digests of the batches since the last flush, appended to the table."""
        if not self.pending:
            return
        if self.table is None:
            rows = capped(DIGEST_CHUNK, self.steps * len(self.pending) if self.steps else None)  # the first batch's x steps
            self.table = self.file.create_dataset(TABLE, (0, 3), "uint64", maxshape=(None, 3), chunks=(rows, 3),
                                                  rdcc_nbytes=64 << 10, rdcc_w0=1.0)
        rows = np.array(self.pending, dtype=np.uint64)
        n = self.table.shape[0]
        self.table.resize(n + len(rows), axis=0)
        self.table[n:] = rows
        self.pending.clear()


def digest(rows: np.ndarray) -> int:
    """The xxh3-64 digest of rows as they are stored (C order, the dataset's dtype)."""
    flat = np.ascontiguousarray(rows).reshape(-1).view(np.uint8)  # also for a dim of size 0
    return xxhash.xxh3_64_intdigest(flat)


def digest_ragged(rows: list[np.ndarray]) -> int:
    """The xxh3-64 digest of variable-length rows (each flattened, in the dataset's base dtype):
    their lengths (int64), then their values, so rows moved between samples do not match."""
    h = xxhash.xxh3_64(np.array([r.size for r in rows], dtype=np.int64).tobytes())
    for r in rows:
        h.update(np.ascontiguousarray(r).reshape(-1).view(np.uint8))
    return h.intdigest()


def digest_stored(ds: h5py.Dataset, rows: np.ndarray) -> int:
    """The digest of rows read from `ds` (or as they are written to it): fixed-size rows as they are,
    variable-length ones by digest_ragged (texts as their UTF-8 bytes)."""
    base = h5py.check_vlen_dtype(ds.dtype)
    if base is None:
        return digest(rows)
    if base in (str, bytes):
        return digest_ragged([np.frombuffer(v.encode() if isinstance(v, str) else bytes(v), np.uint8)
                              for v in rows.reshape(-1)])
    return digest_ragged(list(rows))
