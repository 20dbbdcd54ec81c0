"""The upload worker: finished parts go to the object store on a thread while the next is written.

    up = Uploader(folder, manifest, MANIFEST)
    up.submit(part)        # blocks while the part before is still uploading: two parts on disk at most
    up.raise_error()       # StoreError once the store stayed away past RETRY_SECONDS
    up.close()             # waits for the last upload

One part at a time, in order: upload, verify (size and checksum, object_folder.py), list it in the
manifest (written to the store), and only then remove the local file. A kill at any moment leaves
either a part that the manifest lists and the store holds verified, or a local part that resume
uploads again. A failed step is retried with exponential backoff (0.5 s doubling to 8 s) until
RETRY_SECONDS have passed; then the worker stops, keeps the part locally, and every later call
raises StoreError: the run stops `interrupted` and `resume=true` goes on from the local parts.

Where a run in an object store goes: its URL, its local staging folder, its part and manifest names.

    out = ObjectStoreOutput.of("s3://bucket/cache/captures.h5", staging="outputs/run")
    out.parts_dir, out.manifest_name, out.part(3)     # .../captures.h5.parts, manifest.json, part-00003.h5

With many processes each rank has its own (`dataclasses.replace(out, rank=r)`): its parts under
`rank-RRRRR/`, its manifest `manifest.rank-RRRRR.json`, its staging folder; the store's client is
opened once (`folder()`) and shared by the copies.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hookrun.errors import ConfigError, StoreError
from hookrun.output.objects.manifest import MANIFEST, Manifest, PartEntry, part_name, rank_manifest
from hookrun.output.objects.object_folder import RemoteFolder, reason

log = logging.getLogger("hookrun")
RETRY_SECONDS = float(os.environ.get("HOOKRUN_UPLOAD_RETRY_SECONDS", "300"))
FIRST_DELAY, MAX_DELAY = 0.5, 8.0


@dataclass
class LocalPart:
    path: Path  # the finished part in the staging folder
    entry: PartEntry  # what the manifest will say of it (md5 filled in by the upload)
    captures: dict[str, dict]  # its captures' schema, for the manifest


def retrying(what: str, step: Callable[[], object], patience: float | None = None) -> object:
    """`step()`, retried with backoff while it raises, for `patience` seconds (RETRY_SECONDS)."""
    patience = RETRY_SECONDS if patience is None else patience
    started, delay, tries = time.monotonic(), FIRST_DELAY, 0
    while True:
        tries += 1
        try:
            return step()
        except Exception as exc:
            waited = time.monotonic() - started
            if waited + delay > patience:
                raise StoreError(f"{what} failed {tries} time(s) over {waited:.0f} s: {reason(exc)}") from None
            log.warning("%s failed (%s); retrying in %.1f s", what, reason(exc), delay)
            time.sleep(delay)
            delay = min(MAX_DELAY, delay * 2)


class Uploader:
    def __init__(self, folder: RemoteFolder, manifest: Manifest, manifest_name: str,
                 on_removed: Callable[[Path], None] | None = None) -> None:
        self.folder, self.manifest, self.manifest_name = folder, manifest, manifest_name
        self.on_removed = on_removed
        self.error: StoreError | None = None
        self.kept: list[Path] = []  # parts left locally after the store went away
        self._slot = threading.Semaphore(1)  # one part in flight: the writer waits for it at the next part
        self._thread: threading.Thread | None = None

    def submit(self, part: LocalPart) -> None:
        """Upload `part` on the worker thread; waits while the part before is still uploading."""
        self._slot.acquire()
        if self.error is not None:
            self._slot.release()
            self.kept.append(part.path)
            self.raise_error()
        self._thread = threading.Thread(target=self._work, args=(part,), name="hookrun-upload", daemon=True)
        self._thread.start()

    def _work(self, part: LocalPart) -> None:
        try:
            self.upload(part)
        except StoreError as exc:
            self.error = exc
            self.kept.append(part.path)
        except BaseException as exc:  # a bug, or the disk: still stop the run, saying what happened
            self.error = StoreError(f"uploading {part.path.name} failed: {reason(exc)}")
            self.kept.append(part.path)
        finally:
            self._slot.release()

    def upload(self, part: LocalPart) -> None:
        """Upload, verify, list in the manifest, remove locally (on the calling thread)."""
        name = part.entry.name
        part.entry.md5 = retrying(f"uploading {name} to {self.folder.url}",
                                  lambda: self.folder.put_verified(part.path, name))
        self.manifest.add(part.entry, part.captures)
        text = self.manifest.to_json()
        retrying(f"writing {self.folder.url}/{self.manifest_name}", lambda: self.folder.write_text(self.manifest_name, text))
        part.path.unlink(missing_ok=True)
        if self.on_removed is not None:
            self.on_removed(part.path)
        log.info("part %s: %d batches, %.1f MB uploaded and verified", name, part.entry.steps[1] - part.entry.steps[0],
                 part.entry.bytes / 1e6)

    def raise_error(self) -> None:
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        """Wait for the upload in flight (it retries for RETRY_SECONDS at most)."""
        self._slot.acquire()
        self._slot.release()


@dataclass
class ObjectStoreOutput:
    """Where a run in an object store goes: its URL, the local staging folder, and (with many
    processes) this rank's own part names and manifest."""

    url: str
    staging: Path
    rank: int | None = None
    _folder: RemoteFolder | None = field(default=None, repr=False, compare=False)

    @classmethod
    def of(cls, url: str, staging: str | None) -> ObjectStoreOutput:
        """output.path and output.staging (None: the current folder; the CLI gives the run folder)."""
        scheme, rest = url.split("://", 1)
        if not rest or rest.startswith("/"):  # s3:///captures.h5: the bucket's name is empty
            raise ConfigError(f"output.path: {url} names no bucket (nothing between {scheme}:// and the next /); give "
                              f"{scheme}://BUCKET/NAME, such as {scheme}://my-bucket/cache/captures.h5")
        bucket_and_key = rest.strip("/")
        if "/" not in bucket_and_key:
            raise ConfigError(f"output.path: {url} names a bucket only; give an object name under it, such as "
                              f"{url.rstrip('/')}/cache/captures.h5 (the cache's parts and manifest go under that name)")
        return cls(url.rstrip("/"), Path(staging or ".").expanduser())

    def __str__(self) -> str:
        return self.url

    @property
    def name(self) -> str:
        return self.url.rstrip("/").rsplit("/", 1)[-1]

    @property
    def parts_dir(self) -> Path:
        """Where parts are written before they are uploaded."""
        suffix = "" if self.rank is None else f".rank-{self.rank:05d}"
        return self.staging / f"{self.name}{suffix}.parts"

    @property
    def manifest_name(self) -> str:
        return MANIFEST if self.rank is None else rank_manifest(self.rank)

    def part(self, k: int) -> str:
        return part_name(k, self.rank)

    def owns(self, name: str) -> bool:
        """Whether the object `name` under the URL is this output's to replace: all of a one-process
        run's; with many ranks, this rank's manifest and parts only."""
        return self.rank is None or name == self.manifest_name or name.startswith(f"rank-{self.rank:05d}/")

    def folder(self, check: bool = True) -> RemoteFolder:
        """The run's folder in the store: opened (one client) at the first call, then the same one."""
        if self._folder is None:
            self._folder = RemoteFolder.open(self.url, check=check)
        elif check:
            self._folder.check()
        return self._folder

    def read_manifest(self, folder: RemoteFolder) -> Manifest | None:
        try:
            if not folder.exists(self.manifest_name):
                return None
            text = folder.read_text(self.manifest_name)
        except Exception as exc:
            raise ConfigError(f"{self.url}: its manifest cannot be read ({reason(exc)})") from None
        return Manifest.from_json(text, f"{self.url}/{self.manifest_name}")
