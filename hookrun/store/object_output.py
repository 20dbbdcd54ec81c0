"""Where a run in an object store goes: its URL, its local staging folder, its part and manifest names.

    out = ObjectStoreOutput.of("s3://bucket/cache/captures.h5", staging="outputs/run")
    out.parts_dir, out.manifest_name, out.part(3)     # .../captures.h5.parts, manifest.json, part-00003.h5

With many processes each rank has its own (`dataclasses.replace(out, rank=r)`): its parts under
`rank-RRRRR/`, its manifest `manifest.rank-RRRRR.json`, its staging folder; the store's client is
opened once (`folder()`) and shared by the copies.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from hookrun.errors import ConfigError
from hookrun.store.manifest import MANIFEST, Manifest, part_name, rank_manifest
from hookrun.store.object_folder import RemoteFolder, reason


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
        bucket_and_key = url.split("://", 1)[1].strip("/")
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
