"""Reading a cache in an object store: its manifest, and its parts fetched (verified) into a local cache.

    parts = Parts.open("s3://bucket/cache/captures.h5", cache_dir="~/.cache/hookrun")
    parts.entries          # every listed part, in batch order (rank by rank with many ranks)
    parts.ranks            # many ranks: RanksState (their manifests, status, the ranks not complete)
    path = parts.fetch(3)  # the 4th part as a local file: size and MD5 checked against the manifest

Only what the manifest lists is read (a part is listed once the store held it verified). A part
the store no longer has, or whose bytes differ from the manifest's size and MD5, is an error
naming it, never rows of zeros. Picklable: DataLoader workers each open their own connection.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import socket
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from hookrun.errors import HookrunError, NotFoundError
from hookrun.output.objects.manifest import MANIFEST, Manifest, PartEntry
from hookrun.output.objects.object_folder import RemoteFolder, reason
from hookrun.output.objects.ranked import RanksState, open_ranked


def default_cache_dir(url: str) -> Path:
    """$HOOKRUN_CACHE_DIR (or ~/.cache/hookrun)/<a hash of the URL>."""
    root = Path(os.environ.get("HOOKRUN_CACHE_DIR", Path.home() / ".cache" / "hookrun")).expanduser()
    return root / hashlib.sha1(url.encode()).hexdigest()[:16]


@dataclass
class Parts:
    url: str
    manifest: Manifest  # the run's: a top manifest of many ranks is read as one list of parts
    cache_dir: Path
    entries: list[PartEntry] = field(default_factory=list)
    ranks: RanksState | None = None  # a cache written by many ranks: their manifests and what is incomplete
    _folder: RemoteFolder | None = field(default=None, repr=False)
    _pid: int = field(default_factory=os.getpid, repr=False)  # a forked DataLoader worker opens its own

    @classmethod
    def open(cls, url: str, cache_dir: str | os.PathLike | None = None) -> Parts:
        url = url.rstrip("/")
        folder = RemoteFolder.open(url)
        top = read_manifest(folder, MANIFEST)
        entries, ranks = list(top.parts), None
        if top.ranks:  # many ranks (ranked.py): each rank's parts, in rank order, which is batch order
            top, ranks, entries = open_ranked(folder, top)
        cache = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir(url)
        cache.mkdir(parents=True, exist_ok=True)
        return cls(url, top, cache, entries, ranks, folder)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_folder": None}  # a worker process opens its own connection

    @property
    def folder(self) -> RemoteFolder:
        if self._folder is None or self._pid != os.getpid():
            self._folder, self._pid = RemoteFolder.open(self.url, check=False), os.getpid()
        return self._folder

    def local_name(self, k: int) -> str:
        """The part's file name here: its name in the store with its MD5 in it, so a part of another
        version of the cache (written again at its URL) never takes the name a reader's view reads."""
        name = Path(self.entries[k].name.replace("/", "."))
        return f"{name.stem}.{self.entries[k].md5[:12]}{name.suffix}"

    def version_folder(self) -> Path:
        """`cache_dir/all-<digest of the URL>`: where the view's parts of this URL go. Its own per URL, so
        caches read through one cache_dir never read each other's parts under one name; a cache still
        being written, read again, fetches only its new parts."""
        return self.cache_dir / f"all-{hashlib.sha1(self.url.encode()).hexdigest()[:16]}"

    def scratch(self, kind: str) -> Path:
        """A new folder of `cache_dir` for one reader alone (a loader's stream, stats, verify): no other
        reader, of this run or another one, fetches into it or evicts from it. Its name holds the process
        and host (KIND-PID@HOST-XXXXXXXX), and those a process of this host left as it died are removed first."""
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        clear_dead_scratch(self.cache_dir)
        return Path(tempfile.mkdtemp(prefix=f"{kind}-{os.getpid()}@{socket.gethostname()}-", dir=self.cache_dir))

    def fetch(self, k: int, into: Path | None = None) -> Path:
        """Part k as a verified local file in the cache (downloaded unless it is there already)."""
        entry = self.entries[k]
        folder = into or self.cache_dir
        folder.mkdir(parents=True, exist_ok=True)
        local = folder / self.local_name(k)
        mark = local.with_name(local.name + ".md5")
        if local.is_file() and mark.is_file() and mark.read_text() == entry.md5 and local.stat().st_size == entry.bytes:
            return local
        tmp = Path(tempfile.mkstemp(prefix=f".{local.name}.", suffix=".part", dir=folder)[1])
        try:  # into a file of its own, renamed into place once verified: a fetch killed part-way, or one of
            self.folder.get(entry.name, tmp)  # another reader at the same moment, never leaves a part half-written
        except FileNotFoundError:
            tmp.unlink(missing_ok=True)
            raise NotFoundError(f"{self.url}/{entry.name}: the manifest lists this part but the store does not have "
                                f"it; its rows cannot be read (the cache is damaged: write it again)") from None
        except Exception as exc:
            tmp.unlink(missing_ok=True)
            raise HookrunError(f"{self.url}/{entry.name}: the part cannot be fetched ({reason(exc)})") from None
        size, md5 = tmp.stat().st_size, _md5(tmp)
        if size != entry.bytes or md5 != entry.md5:
            tmp.unlink(missing_ok=True)
            raise HookrunError(f"{self.url}/{entry.name} is damaged: the store's copy has {size} bytes, MD5 {md5}; the "
                               f"manifest says {entry.bytes} bytes, MD5 {entry.md5} (its rows are not read)")
        mark.unlink(missing_ok=True)
        os.replace(tmp, local)
        mark.write_text(entry.md5)
        return local

    def evict(self, k: int, into: Path | None = None) -> None:
        local = (into or self.cache_dir) / self.local_name(k)
        local.unlink(missing_ok=True)
        local.with_name(local.name + ".md5").unlink(missing_ok=True)


SCRATCH = re.compile(r"-(\d+)@(.+)-[a-z0-9_]+$")  # scratch's name: KIND-PID@HOST-<mkdtemp's suffix>


def clear_dead_scratch(cache_dir: Path) -> None:
    """Remove the scratch folders of `cache_dir` whose process, on this host, is gone (was: a loader SIGKILLed
    mid-epoch left its prefetched parts, up to prefetch + 1 of output.part_bytes each, in the cache for good)."""
    from hookrun.store.lock_holder import alive

    here = socket.gethostname()
    for folder in cache_dir.iterdir():
        found = SCRATCH.search(folder.name)
        if found and folder.is_dir() and found[2] == here and not alive(int(found[1])):
            shutil.rmtree(folder, ignore_errors=True)


def read_manifest(folder: RemoteFolder, name: str) -> Manifest:
    try:
        text = folder.read_text(name)
    except FileNotFoundError:
        inside = f"captures.h5/{name}"  # (a run folder's URL: its cache is URL/captures.h5, as a local folder's file)
        hint = f"; did you mean {folder.url}/captures.h5?" if _exists(folder, inside) else ""
        raise NotFoundError(f"no hookrun cache at {folder.url} (it has no {name}: a run writes it as it starts){hint}") from None
    except Exception as exc:
        raise HookrunError(f"{folder.url}/{name} cannot be read ({reason(exc)})") from None
    return Manifest.from_json(text, f"{folder.url}/{name}")


def _exists(folder: RemoteFolder, name: str) -> bool:
    try:
        return folder.exists(name)
    except Exception:  # (a store that answers no more: no hint)
        return False


def _md5(path: Path) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        while block := f.read(64 << 20):
            h.update(block)
    return h.hexdigest()
