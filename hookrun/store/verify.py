"""Checking stored rows against their checksums (store/writer.py writes them): resume's checks of the
file it copies, and `python -m hookrun.inspect --verify FILE`.

    table_of(ds, ds.attrs["digest"])                  # (batches, 2): [end_row, xxh3] of that capture
    found = verify(file)                              # .problems == [] when every row matches its checksum

Files of hookrun 0.2 kept one sibling table per capture (`ds.attrs["digest"] == "output.digest"`,
(batches, 2)); table_of reads both.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import h5py
import numpy as np

from hookrun.store.listing import damage, list_captures
from hookrun.store.paths import FLUSHING
from hookrun.store.writer import TABLE, digest, digest_stored


def table_of(ds: h5py.Dataset, name: str) -> np.ndarray:
    """(batches, 2) [end_row, xxh3] of the capture `ds` whose `digest` attribute is `name`."""
    if name.startswith(TABLE + ":"):
        table = ds.file[TABLE][:]
        return table[table[:, 0] == int(name.rsplit(":", 1)[1])][:, 1:]
    return ds.parent[name][:]  # hookrun 0.2: a sibling table per capture


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
