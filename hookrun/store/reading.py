"""Reading a run: one reader over a local file, a merged view of ranks, or any scheme's source.

    with open_source("outputs/run/captures.h5") as src:   # or a run folder, or "s3://bucket/cache/captures.h5"
        src.file["samples/index"][:]                        # an h5py.File: the file, or a view over the parts

Everything in hookrun that reads a run's file opens it here: `open_run` (analysis/, the user's
reader, built on this), resume's replay source, `op: patch`'s source, a mean read from an earlier run, the ranks'
checks, `inspect` and `plot`. The path's scheme (store/paths.py) names the source: LocalSource
here (an HDF5 file; a merged view of ranks is refused where a shard file is missing, since HDF5
would read its rows as zeros), or the object store's PartsSource (output/objects/source.py: the
manifest at once, and at the first use of `file` every part fetched, verified, under one view).
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import h5py

from hookrun.errors import HookrunError, NotFoundError
from hookrun.store import FORMAT_VERSION, HOOKRUN_VERSION, REFUSED
from hookrun.store.listing import damage
from hookrun.store.live import changed_while_read, settled, wait_for_flush
from hookrun.store.paths import flushing_path, local_path, scheme_of
from hookrun.store.view_sources import check_shards, check_sources, shard_names


class UrlPath(str):
    """A URL where a local reader keeps a Path: `.name` is its last part (messages use it); it is
    never a local folder or file, and resolves to itself."""

    @property
    def name(self) -> str:
        return self.rstrip("/").rsplit("/", 1)[-1]

    @property
    def parent(self) -> UrlPath:
        return UrlPath(self.rstrip("/").rsplit("/", 1)[0])

    def is_dir(self) -> bool:
        return False

    def is_file(self) -> bool:
        return False

    def resolve(self) -> UrlPath:
        return self


class RunSource(Protocol):
    """An open run: its HDF5 content as one h5py.File, whatever holds it."""

    path: Path | UrlPath

    @property
    def file(self) -> h5py.File: ...

    def close(self) -> None: ...


def check_format(f: h5py.File, path: Path) -> None:
    """A file of the layout this hookrun reads (docs/format.md), with the sample index every run writes."""
    version = f.attrs["format_version"]
    version = version.decode() if isinstance(version, bytes) else str(version)
    if version != FORMAT_VERSION:
        wrote = f.attrs.get("hookrun_version", "another hookrun")
        raise HookrunError(f"{str(path)!r} is in format {version}; this hookrun ({HOOKRUN_VERSION}) reads format "
                           f"{FORMAT_VERSION}: read it with the hookrun that wrote it ({wrote})")
    if "samples/index" not in f:
        raise HookrunError(f"{str(path)!r} has no /samples/index, which every hookrun run writes when it starts: the "
                           f"file is damaged, or another program wrote it")


def shards_beside(path: Path) -> list[str]:
    """The rank shards of the view `path` (captures.rank-NNNNN.h5 for captures.h5) beside it, each with
    its state: `captures.rank-00001.h5 (running, 2 batches)`; [] where there are none."""
    pattern = re.compile(re.escape(path.stem) + r"\.rank-\d{5}" + re.escape(path.suffix) + "$")
    found = sorted(p for p in path.parent.glob(f"{glob.escape(path.stem)}.rank-*") if pattern.match(p.name))
    return [f"{p.name} ({shard_state(p)})" for p in found]


def shard_state(path: Path) -> str:
    try:
        with h5py.File(path, "r", locking=False) as f:
            return f"{f.attrs.get('status', 'unreadable')}, {int(f.attrs.get('steps_complete', 0))} batches"
    except (OSError, KeyError, ValueError, TypeError):
        return "unreadable"


class LocalSource:
    """A hookrun HDF5 file on disk (a merged view of ranks included: its shards must be beside it).
    `wait`: a live run's file stepped aside for a flush is waited for (resume opens the aside file
    itself, so it does not wait). `rows=False`: only the attributes will be read, so neither
    the format nor a view's shards are checked (the ranks' checks read any file's world size)."""

    def __init__(self, path: str | os.PathLike, wait: bool = True, rows: bool = True) -> None:
        self.path = Path(path)
        if not self.path.is_file() and not (wait and wait_for_flush(self.path)):
            aside = flushing_path(self.path)
            if aside.is_file():
                raise NotFoundError(f"no file {str(self.path)!r}, but {aside.name} beside it: the run was killed while it "
                                    f"flushed; resume=true recovers its batches")
            shards = shards_beside(self.path)
            if shards:  # every rank stopped before rank 0 wrote the view (torchrun's whole group killed)
                raise NotFoundError(f"no file {str(self.path)!r}, but the shards of a run of many processes beside it (it "
                                    f"stopped before its merged view was written): {', '.join(shards)}; run the same "
                                    f"command with resume=true to finish them and write the view")
            raise NotFoundError(f"no file {str(self.path)!r}")
        try:
            self._file = open_read(self.path)
        except OSError as exc:
            raise changed_while_read(self.path, damage(exc)) or HookrunError(
                f"{str(self.path)!r} is not a readable HDF5 file: {exc}") from None
        except H5_ERRORS as exc:  # the superblock read, but what it points at cannot be
            raise damaged(self.path, exc) from None
        try:
            if rows and "format_version" not in self._file.attrs:
                raise HookrunError(f"{str(self.path)!r} is not a hookrun file (no format_version attribute)")
            if rows:
                check_format(self._file, self.path)
                list(self._file)  # the root's link table: its heap overwritten fails here, not at a first lookup
                dict(self._file.attrs.items())  # every root attribute's value (a damaged one: here, not in run.attrs)
                check_sources(self._file, self.path)
                check_shards(self._file, self.path)
        except HookrunError:
            self._file.close()
            raise
        except H5_ERRORS as exc:  # the root group's header (its attributes, its links) overwritten
            self._file.close()
            raise damaged(self.path, exc) from None

    @property
    def file(self) -> h5py.File:
        return self._file

    def part_files(self) -> Iterator[h5py.File]:
        """The file itself: one 'part' (inspect --verify reads every part alike); a merged view of
        ranks: each of its shard files, which hold the rows and their checksums (the view holds none)."""
        names = shard_names(self._file)
        if not names:
            yield self._file
            return
        for name in names:
            shard = self.path.parent / name
            try:
                part = open_read(shard)
            except OSError as exc:
                raise damaged(shard, exc) from None
            with part:
                yield part

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> LocalSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


H5_ERRORS = (KeyError, OSError, RuntimeError, ValueError)  # what h5py raises for bytes HDF5 cannot parse


def damaged(path: Path | str, exc: BaseException) -> HookrunError:
    """One line naming a file whose HDF5 objects cannot be read (a header overwritten on disk); where
    its run is still writing it, that it changed while it was read (store/paths.py)."""
    return changed_while_read(path, damage(exc)) or HookrunError(f"{str(path)!r} is damaged: {damage(exc)}; run it again (or use an intact copy)")


def open_read(path: Path) -> h5py.File:
    """Read-only, without HDF5's file lock (a live run's file is read beside its writer); a file this
    process already holds open with HDF5's default locking must be opened with the same flags. A
    killed run's flush helper is waited for: its last message half written is no file to read."""
    settled(path)
    try:
        return h5py.File(path, "r", locking=False)
    except OSError as exc:
        if "locking flag" not in str(exc):
            raise
        return h5py.File(path, "r")


def is_remote(path: str | os.PathLike) -> bool:
    """Whether `path` names a run behind a URL (read through its scheme's source), not a local file or folder."""
    return scheme_of(path).remote


def run_path(text: str) -> Path | UrlPath:
    """A path given on a command line: a URL stays a URL (a Path would turn `s3://` into `s3:/`)."""
    return UrlPath(text.rstrip("/")) if scheme_of(text).remote else Path(local_path(text))


def open_source(path: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> RunSource:
    """The run at `path`: a captures.h5 file, a run folder holding one, or an object-store URL
    (`cache_dir`: where its parts are fetched to; default $HOOKRUN_CACHE_DIR or ~/.cache/hookrun),
    read by the source its scheme names (store/paths.py)."""
    return scheme_of(path).open_source(path, cache_dir)


def local_source(path: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> LocalSource:
    """A local file, or a run folder's captures.h5 (the `file` scheme's source)."""
    local = Path(local_path(path)).expanduser()
    if local.is_dir() and not (local / "captures.h5").exists() and (local / "multirun.yaml").is_file():
        jobs = [d.relative_to(local).as_posix() for d in job_dirs(local, "config.yaml")]  # (N/, or N/run/ under a nested subdir)
        if not jobs:
            raise NotFoundError(empty_sweep(local))
        ran = [j for j in jobs if folder_file(local / j) is not None]
        if not ran:  # (a hint to a job's folder would name one with no file: say what became of each)
            what = "; ".join(f"job {j} {job_state(local / j)}" for j in jobs[:4]) + ("; ..." if len(jobs) > 4 else "")
            raise NotFoundError(f"{str(local)!r} is a sweep folder none of whose {len(jobs)} job(s) left a run's file: "
                                f"{what}; run the sweep again once that is fixed")
        raise NotFoundError(f"{str(local)!r} is a sweep folder of {len(jobs)} job(s) ({', '.join(jobs[:4])}"
                            f"{', ...' if len(jobs) > 4 else ''}); open_run reads one run: give a job's folder, e.g. "
                            f"{str(local / ran[0])!r}, or hookrun.open_sweep(folder) for the sweep's table")
    found = folder_file(local) if local.is_dir() else None
    if local.is_dir() and found is None and (local / REFUSED).is_file():
        raise NotFoundError(f"{str(local)!r} is a sweep's job that left no run's file: it {job_state(local)}; run it "
                            f"again once that is fixed")
    if local.is_dir() and found is None:
        runs = sorted(p.parent.parent.relative_to(local).as_posix() for p in local.glob("*/.hydra/config.yaml"))
        if runs:  # a folder of runs (outputs/DATE): name them, not a captures.h5 it never had
            raise NotFoundError(f"{str(local)!r} holds no run's file but {len(runs)} run folder(s): "
                                f"{', '.join(runs[:4])}{', ...' if len(runs) > 4 else ''}; give one of them (a sweep "
                                f"folder has Hydra's multirun.yaml; hookrun.open_sweep tabulates any folder of runs)")
    return LocalSource((found or local / "captures.h5") if local.is_dir() else local)


def folder_file(folder: Path) -> Path | None:
    """A run folder's file: captures.h5, else the output.path its .hydra/config.yaml names (relative
    to the folder, as Hydra ran it), else its one .h5 file; None where it has none."""
    import yaml

    if (folder / "captures.h5").is_file():
        return folder / "captures.h5"
    config = folder / ".hydra" / "config.yaml"
    if config.is_file():
        try:
            cfg = yaml.safe_load(config.read_text()) or {}
            path = Path(str((cfg.get("output") or {}).get("path", "captures.h5"))).expanduser()
        except (yaml.YAMLError, AttributeError, OSError):
            path = Path("captures.h5")
        path = path if path.is_absolute() else folder / path
        if path.is_file():
            return path
    files = sorted(folder.glob("*.h5"))
    return files[0] if len(files) == 1 else None


def job_dirs(folder: Path, record: str = "overrides.yaml") -> list[Path]:
    """The folders holding a job's .hydra/RECORD (overrides.yaml; open_run asks for config.yaml), at any depth: `N/`, `N/run/`, or where
    hydra.sweep.subdir=${hydra.job.override_dirname} nests a value with a slash (a checkpoint's
    path) over several folders; a job's own subfolders are not searched (they hold no jobs)."""
    found = []
    for root, dirs, _ in os.walk(folder):
        here = Path(root)
        if here != folder and (here / ".hydra" / record).is_file():
            found.append(here)
            dirs.clear()
        else:
            dirs[:] = [d for d in dirs if not d.startswith(".")]
    return sorted(found)


def job_state(folder: Path) -> str:
    """'was refused: LINE' (the job's refused.txt, docs/format.md), or 'has no run's file' (it failed before its
    file opened, or has not run)."""
    try:
        line = (folder / REFUSED).read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return "has no run's file (not run yet, or failed before its file opened)"
    return f"was refused: {line}"


def empty_sweep(folder: Path) -> str:
    """What a sweep folder that Hydra made (multirun.yaml) but no job wrote to is."""
    return (f"{str(folder)!r} is a sweep folder (multirun.yaml) with no job's run in it: its jobs have not started, "
            f"or each failed before its first batch and left nothing (the sweep printed why); run the sweep again "
            f"once its error is fixed")

