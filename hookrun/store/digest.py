"""Checksums of stored rows: one xxh3-64 digest per batch of each capture, checked on resume and by
`python -m hookrun.inspect --verify FILE`.

    ds.attrs["digest"] == "/checksums:3"              # the run's table, and this capture's number in it
    f["/checksums"][j] == [3, end_row, xxh3]          # rows [previous end, end_row) of one batch of capture 3
    table_of(ds)                                      # (batches, 2): [end_row, xxh3] of that capture
    problems = verify(file)                           # [] when every row matches its checksum

Every append of a capture's rows (one batch) adds one row to the run's /checksums table: the
capture's number, its row count after the batch and the xxh3-64 digest of those rows' bytes as
stored. A reader recomputes it from the rows alone, so a damaged block of a file is named, never
read as if it were data. Written by the store's writer thread at each flush; xxh3 runs at about
15 GB/s (docs/benchmarks.md has its cost). Files of hookrun 0.2 kept one sibling table per
capture (`ds.attrs["digest"] == "output.digest"`, (batches, 2)); table_of reads both.
"""

from __future__ import annotations

import h5py
import numpy as np
import xxhash

from hookrun.store.schema import CaptureMeta, damage, list_captures

TABLE = "/checksums"


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


def verify(f: h5py.File, rows_per_read: int = 1 << 16) -> tuple[list[str], int, int]:
    """Check every capture with a digest: (problems, captures checked, captures without digests).
    A problem names the capture and the rows, or what could not be read."""
    problems: list[str] = []
    checked = unchecked = 0
    try:
        captures = list_captures(f)
    except Exception as exc:  # a damaged object header: named by list_captures
        return [str(exc)], 0, 0
    for info in captures:
        ds = f[info.path]
        meta = CaptureMeta.from_attrs(ds.attrs)
        if not meta.digest or meta.ragged:
            unchecked += 1
            continue
        checked += 1
        try:
            table = table_of(ds, meta.digest)
        except (KeyError, OSError, RuntimeError) as exc:
            problems.append(f"{info.path}: its checksums cannot be read ({damage(exc)})")
            continue
        start, n = 0, ds.shape[0]
        for end, want in table.tolist():
            if end > n:  # digests of rows written after the file's last flush: not part of the file
                break
            try:
                got = digest(ds[start:end])
            except (OSError, RuntimeError) as exc:
                problems.append(f"{info.path}: rows {start}..{end - 1} cannot be read ({damage(exc)})")
            else:
                if got != want:
                    problems.append(f"{info.path}: rows {start}..{end - 1} do not match their checksum (damaged on disk)")
            start = end
    return problems, checked, unchecked
