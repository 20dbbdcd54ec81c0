"""The object-store scheme's source: a cache's manifest at once, its parts fetched when rows are read.

    with parts_source("s3://bucket/cache/captures.h5") as src:   # store/paths.py's OBJECTS asks here
        src.parts.manifest.status                   # the manifest only: nothing is downloaded yet
        src.file["samples/index"][:]                # every part fetched, verified, under one local view

A RunSource (store/reading.py's protocol) as LocalSource is: at the first use of `file`, every part
the manifest lists is fetched into the cache folder (fetch.py: size and MD5 checked against the
manifest) and opened as one virtual-dataset view (store/merge.py); `part_files` hands them one at a
time (inspect --verify). Its reader is RemoteRun (remote_run.py).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import h5py

from hookrun.errors import HookrunError
from hookrun.output.objects.fetch import Parts
from hookrun.store.merge import build_view
from hookrun.store.reading import UrlPath


class PartsSource:
    """A cache in an object store: its manifest (read at once), its parts fetched when rows are read."""

    def __init__(self, url: str, cache_dir: str | os.PathLike | None = None) -> None:
        self.path = UrlPath(url.rstrip("/"))
        self.parts = Parts.open(self.path, cache_dir)
        self._file: h5py.File | None = None
        self._view: Path | None = None

    @property
    def opened(self) -> bool:
        """Whether the parts are here already (a summary reads the manifest alone)."""
        return self._file is not None

    @property
    def file(self) -> h5py.File:
        """A local view over every part (each fetched and verified first)."""
        if self._file is None:
            folder = self.parts.version_folder()  # this URL's parts: no other cache's under one name
            paths = [self.parts.fetch(k, folder) for k in range(len(self.parts.entries))]
            if not paths:
                raise HookrunError(f"{self.path}: the cache has no part yet (status {self.parts.manifest.status})")
            view = self._view = Path(tempfile.mkstemp(prefix="view-", suffix=".h5", dir=folder)[1])  # this reader's own
            attrs = {k: v for k, v in self.parts.manifest.attrs.items() if isinstance(v, (str, int, float))}
            build_view(view, paths, attrs)
            with h5py.File(view, "r+") as f:
                f.attrs["status"] = self.parts.manifest.status
                f.attrs["parts_of"] = str(self.path)
                del f.attrs["world_size"]
            self._file = h5py.File(view, "r", locking=False)
        return self._file

    def part_files(self, problems: list[str] | None = None) -> Iterator[h5py.File]:
        """Every part in turn, fetched and verified, open; each removed once the next is asked for.
        With `problems`, a part that cannot be fetched or fails its MD5 is named there and skipped
        (inspect --verify names every damaged part); without, it raises."""
        folder = self.parts.scratch("verify")
        try:
            for k in range(len(self.parts.entries)):
                try:
                    path = self.parts.fetch(k, folder)
                except HookrunError as exc:
                    if problems is None:
                        raise
                    problems.append(str(exc))
                    continue
                try:
                    with h5py.File(path, "r", locking=False) as f:
                        yield f
                finally:
                    self.parts.evict(k, folder)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._view is not None:
            self._view.unlink(missing_ok=True)
            self._view = None

    def __enter__(self) -> PartsSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def parts_source(path: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> PartsSource:
    """An object store's parts under a URL (the object-store scheme's source, store/paths.py)."""
    return PartsSource(str(path), cache_dir)
