"""Checksums of stored rows: one xxh3-64 digest per batch of each capture, checked on resume and by
`python -m hookrun.inspect --verify FILE`.

    ds.attrs["digest"] == "/checksums:3"              # the run's table, and this capture's number in it
    f["/checksums"][j] == [3, end_row, xxh3]          # rows [previous end, end_row) of one batch of capture 3
    table_of(ds)                                      # (batches, 2): [end_row, xxh3] of that capture
    found = verify(file)                              # .problems == [] when every row matches its checksum

Every append of a capture's rows (one batch) adds one row to the run's /checksums table: the
capture's number, its row count after the batch and the xxh3-64 digest of those rows' bytes as
stored. A reader recomputes it from the rows alone, so a damaged block of a file is named, never
read as if it were data. Written by the store's writer thread at each flush; xxh3 runs at about
15 GB/s (docs/benchmarks.md has its cost). Files of hookrun 0.2 kept one sibling table per
capture (`ds.attrs["digest"] == "output.digest"`, (batches, 2)); table_of reads both.
Each capture's `<role>.index` and every /samples dataset (what maps a row to its sample) are
digested too, from their rows read back as stored (DigestLog.add_rows).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import h5py
import numpy as np
import xxhash

from hookrun.store.format import DIGEST_CHUNK, capped
from hookrun.store.listing import damage, list_captures
from hookrun.store.lock import FLUSHING

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


def table_of(ds: h5py.Dataset, name: str) -> np.ndarray:
    """(batches, 2) [end_row, xxh3] of the capture `ds` whose `digest` attribute is `name`."""
    if name.startswith(TABLE + ":"):
        table = ds.file[TABLE][:]
        return table[table[:, 0] == int(name.rsplit(":", 1)[1])][:, 1:]
    return ds.parent[name][:]  # hookrun 0.2: a sibling table per capture


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


def check_block(table: np.ndarray, start: int, end: int, rows: np.ndarray) -> bool | None:
    """Whether rows [start, end) match the digest the table holds for exactly that block; None
    where the table has no entry ending at `end` (nothing to check against)."""
    hit = np.flatnonzero(table[:, 0] == end)
    if not len(hit):
        return None
    k = int(hit[0])
    if (int(table[k - 1, 0]) if k else 0) != start:
        return None
    return int(table[k, 1]) == digest(rows)


@dataclass
class Verified:
    """What `verify` found: damaged blocks, and the datasets checked and those without checksums."""

    problems: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)

    def __add__(self, other: Verified) -> Verified:
        return Verified(self.problems + other.problems, self.checked + other.checked, self.unchecked + other.unchecked)


def verify(f: h5py.File) -> Verified:
    """Check every capture, its `<role>.index` and every /samples dataset (what maps a row to its
    sample: index, step, target, the token map, the data.store keys) against their checksums. A
    problem names the dataset and the rows, or what could not be read; a dataset written without
    checksums (output.checksum=false; by an earlier hookrun: a `.index`, the /samples datasets but
    index and step) is listed as unchecked, never as passing. Every number in /checksums
    must belong to a dataset: one that none carries is a dataset missing from the file."""
    out = Verified()
    try:
        captures = [info.path for info in list_captures(f)]
        samples = [f"/samples/{name}" for name in f["samples"]] if "samples" in f else []
    except Exception as exc:  # a damaged object header: named by list_captures
        out.problems.append(str(exc))
        return out
    torn = f.filename.endswith(FLUSHING)  # hookrun 0.2's file killed inside a flush: its table may run ahead
    claimed: set[str] = set()
    todo = captures + samples
    while todo:
        path = todo.pop(0)
        try:
            ds = f[path]
            tag = str(ds.attrs.get("digest", "") or "")
            if path in captures and (leaf := str(ds.attrs.get("index", "") or "")):
                todo.insert(0, f"{ds.parent.name}/{leaf}")  # the sample (step) of each of its rows
        except (KeyError, OSError, RuntimeError) as exc:
            out.problems.append(f"{path}: cannot be opened ({damage(exc)})")
            continue
        if not tag:
            out.unchecked.append(path)
            continue
        out.checked.append(path)
        claimed.add(tag)
        out.problems += _check_rows(ds, path, tag, torn)
    out.problems += _unclaimed(f, claimed)
    return out


def _unclaimed(f: h5py.File, claimed: set[str]) -> list[str]:
    """The numbers in /checksums that no dataset's `digest` attribute names: each one a capture or
    sample dataset that was written, checksummed and is no longer in the file (deleted, or its
    header lost its attributes)."""
    if TABLE not in f:
        return []
    try:
        table = f[TABLE][:]
    except (OSError, RuntimeError) as exc:
        return [f"{TABLE}: cannot be read ({damage(exc)})"]
    problems = []
    for k in np.unique(table[:, 0]).tolist():
        if f"{TABLE}:{k}" not in claimed:
            ends = table[table[:, 0] == k][:, 1]
            problems.append(f"{TABLE}: number {k} ({len(ends)} batch(es), rows 0..{int(ends.max()) - 1}) belongs to no "
                            f"dataset in the file: a capture or sample dataset it checked is missing")
    return problems


def sample_map_damage(f: h5py.File) -> list[str]:
    """The damaged blocks of what maps a row to its sample (every /samples dataset, each capture's `.index`),
    which resume copies into its new file (it checks the captures' rows as it reads them: check_block). Only
    the blocks the file holds: rows past them are a killed run's last batches, which resume does again."""
    try:
        paths = [f"/samples/{name}" for name in f["samples"]] if "samples" in f else []
        paths += [f"{f[i.path].parent.name}/{leaf}" for i in list_captures(f) if (leaf := str(f[i.path].attrs.get("index", "") or ""))]
        tagged = [(p, str(f[p].attrs.get("digest", "") or "")) for p in paths]
    except Exception:  # (a damaged header: resume names it where it reads it)
        return []
    return [problem for p, tag in tagged if tag for problem in _check_rows(f[p], p, tag, torn=True, whole=False)]


def _check_rows(ds: h5py.Dataset, path: str, tag: str, torn: bool = False, whole: bool = True) -> list[str]:
    """Every block of one dataset against its digests. A file at rest holds one whole flush (the table
    is written with the rows it covers), so digests past the dataset's end are rows it lost; only a
    `torn` file (hookrun 0.2's, killed inside a flush) may hold a table ahead of its rows. `whole`: rows
    no digest covers are named too."""
    try:
        table = table_of(ds, tag)
    except (KeyError, OSError, RuntimeError) as exc:
        return [f"{path}: its checksums cannot be read ({damage(exc)})"]
    problems, start, n = [], 0, ds.shape[0]
    for end, want in table.tolist():
        if end > n:
            if not torn:
                last = int(table[:, 0].max())
                cut = f"; rows {start}..{n - 1}, the start of that batch, cannot be checked" if start < n else ""
                return problems + [f"{path}: rows {n}..{last - 1} are missing: its checksums cover {last} rows, "
                                   f"the dataset holds {n}{cut}"]
            break  # (the torn flush's rows: not part of the file)
        try:
            rows = ds[start:end]
            got = digest_stored(ds, rows)
        except (OSError, RuntimeError) as exc:
            problems.append(f"{path}: rows {start}..{end - 1} cannot be read ({damage(exc)})")
        else:
            if got != want:
                problems.append(f"{path}: rows {start}..{end - 1} do not match their checksum (damaged on disk)")
        start = end
    if start < n and whole:  # rows that no digest covers (a table cut short): unverified, hence named
        problems.append(f"{path}: rows {start}..{n - 1} have no checksum (the /checksums table ends at row {start})")
    return problems
