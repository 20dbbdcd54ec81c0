"""Object-store access: one folder-like prefix of an fsspec URL, and verified uploads to it.

    folder = RemoteFolder.open("s3://bucket/cache/captures.h5")   # ConfigError if unreachable
    folder.put_verified(Path("part-00000.h5"), "part-00000.h5")   # size and checksum checked
    folder.read_text("manifest.json"); folder.get("part-00000.h5", Path("cache/part-00000.h5"))

Any URL whose fsspec filesystem is installed works (`s3://` through s3fs, `gs://`, `az://`,
`memory://`). Credentials and the endpoint come from the standard places only (for S3 botocore's
chain: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL, AWS_PROFILE and
~/.aws/config); nothing here writes them anywhere, and error messages name the URL and the
store's own reason, never a key. An upload is verified before it counts: the object's size, then
S3's ETag (the MD5 of the bytes, or of the multipart upload's parts) against the same computed from
the local file; a store that reports no such checksum is read back and compared byte for byte.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable
from pathlib import Path

from hookrun.errors import ConfigError, StoreError

log = logging.getLogger("hookrun")
UPLOAD_CHUNK = 64 << 20  # S3 multipart part size (and the read-back block)
UPLOAD_THREADS = 4  # concurrent multipart parts of one upload
OURS = re.compile(r"^(manifest(\.rank-\d{5})?\.json|(rank-\d{5}/)?part-\d{5}\.h5)$")  # what a run writes


def _options(protocol: str) -> dict:
    """fsspec options: a fresh S3 client each time (the endpoint is read from the environment when
    it is made) and no stale listings; bounded timeouts so an unreachable endpoint is told fast."""
    if protocol in ("s3", "s3a"):
        return {"skip_instance_cache": True, "use_listings_cache": False, **_session(),
                "config_kwargs": {"connect_timeout": 5, "read_timeout": 60, "retries": {"max_attempts": 2}}}
    return {}


_LOADER: list = []  # botocore's data loader, made once: it caches the parsed service models


def _session() -> dict:
    """A new aiobotocore session (credentials, profile and endpoint resolved afresh, as s3fs's own
    would be) that shares one botocore data loader, so S3's service model (JSON) is parsed once per
    process instead of at every open: 0.1-0.2 s of CPU each time on a small machine."""
    try:
        from aiobotocore.session import AioSession
        from botocore.loaders import create_loader
    except ImportError:  # pragma: no cover - s3fs brings both
        return {}
    if not _LOADER:
        _LOADER.append(create_loader())
    session = AioSession()
    session.register_component("data_loader", _LOADER[0])
    return {"session": session}


def reason(exc: BaseException) -> str:
    """The store's reason in one line, with anything that looks like a credential taken out."""
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
    text = re.sub(r"(?i)(signature|credential|secret|key)=\S+", r"\1=...", text)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class RemoteFolder:
    """The objects under one URL prefix (`<url>/NAME`)."""

    def __init__(self, url: str, fs, root: str) -> None:
        self.url, self.fs, self.root = url.rstrip("/"), fs, root.rstrip("/")

    @classmethod
    def open(cls, url: str, check: bool = True) -> RemoteFolder:
        """The folder at `url`; with `check`, one listing proves the endpoint, credentials and
        bucket work (ConfigError otherwise: a line before any batch runs)."""
        try:
            import fsspec
        except ImportError:  # pragma: no cover - fsspec comes with s3fs
            raise ConfigError(f"{url}: object-store paths need fsspec and a filesystem: pip install 'hookrun[s3]'") from None
        protocol = url.split("://", 1)[0].lower()
        try:
            fs, root = fsspec.url_to_fs(url, **_options(protocol))
        except (ImportError, ValueError) as exc:
            hint = "pip install 'hookrun[s3]'" if protocol.startswith("s3") else f"install fsspec's filesystem for {protocol}://"
            raise ConfigError(f"{url}: no filesystem for {protocol}:// is installed ({reason(exc)}); {hint}") from None
        folder = cls(url, fs, root)
        if check:
            folder.check()
        return folder

    def path(self, name: str) -> str:
        return f"{self.root}/{name}" if name else self.root

    def check(self) -> None:
        """One call that proves the endpoint, the credentials and the bucket work (S3: the bucket
        exists and can be listed): anything else is one line naming the URL."""
        try:
            if "s3" in _protocols(self.fs) or "s3a" in _protocols(self.fs):
                bucket = self.root.split("/", 1)[0]
                try:
                    self.fs.ls(bucket, detail=False)  # (exists() reads an unreachable endpoint as "no")
                except FileNotFoundError:
                    raise ConfigError(f"{self.url}: the bucket {bucket!r} does not exist at this endpoint; create "
                                      f"it (aws s3 mb s3://{bucket}) or fix the URL") from None
            else:
                self.fs.exists(self.root)
        except ConfigError:
            raise
        except Exception as exc:
            raise ConfigError(f"{self.url}: the object store cannot be used ({reason(exc)}); check AWS_ENDPOINT_URL, "
                              f"the credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or AWS_PROFILE) and the "
                              f"bucket name") from None

    # -- small objects -------------------------------------------------------------------------
    def exists(self, name: str) -> bool:
        return bool(self.fs.exists(self.path(name)))

    def read_text(self, name: str) -> str:
        with self.fs.open(self.path(name), "rb") as f:
            return f.read().decode()

    def write_text(self, name: str, text: str) -> None:
        """One PUT: readers see the old object or the new one, never a mix."""
        self.fs.pipe_file(self.path(name), text.encode())

    def create_text(self, name: str, text: str) -> None:
        """One PUT that succeeds only where no object `name` exists (S3: If-None-Match: *);
        FileExistsError where one does. NotImplementedError where the store cannot tell."""
        try:
            self.fs.pipe_file(self.path(name), text.encode(), mode="create")
        except TypeError:  # a filesystem whose pipe_file has no mode
            raise NotImplementedError(f"{self.url}: the store has no conditional write") from None
        except OSError as exc:  # SeaweedFS's 412 does not name its condition, so s3fs does not say FileExistsError
            if isinstance(exc, FileExistsError) or not precondition_failed(exc):
                raise
            raise FileExistsError(str(exc)) from exc

    def tag(self, name: str) -> str | None:
        """The object's ETag (what a conditional replace names), None where the store gives none."""
        info = self.fs.info(self.path(name))
        tag = info.get("ETag", info.get("etag"))
        return str(tag) if tag else None

    def replace_text(self, name: str, text: str, tag: str | None) -> None:
        """Replace `name` only while it is still the object with ETag `tag` (S3: If-Match); an
        error (OSError, FileExistsError) where another writer replaced it first. A store without
        ETags: removed and created again, which fails where another writer created it between."""
        if tag is None:
            self.fs.rm(self.path(name))
            self.create_text(name, text)
        else:
            self.fs.pipe_file(self.path(name), text.encode(), IfMatch=tag)

    def remove(self, name: str) -> None:
        self.fs.rm(self.path(name))

    def names(self) -> list[str]:
        """The names of the objects (and sub-prefixes) directly under the prefix; [] where there is none."""
        try:
            return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(self.root, detail=False))
        except FileNotFoundError:
            return []

    def remove_all(self, keep: Callable[[str], bool] | None = None) -> None:
        """The cache objects under the prefix, those hookrun writes only: its manifests and parts
        (output.overwrite, or a new run over an old one's leftovers), but those whose name under
        the prefix `keep` says to keep (with many ranks each rank clears its own)."""
        if not self.fs.exists(self.root):
            return
        names = [p[len(self.root) + 1 :] for p in self.fs.find(self.root)]
        found = [self.path(n) for n in names if OURS.match(n) and not (keep and keep(n))]
        if found:
            self.fs.rm(found)

    # -- parts -----------------------------------------------------------------------------------
    def put_verified(self, local: Path, name: str) -> str:
        """Upload `local` as `name` and check what the store holds: size, then checksum; returns
        the part's MD5. Raises StoreError where they differ (the caller retries)."""
        size = local.stat().st_size
        remote = self.path(name)
        if "s3" in _protocols(self.fs):
            self.fs.put_file(str(local), remote, chunksize=UPLOAD_CHUNK, max_concurrency=UPLOAD_THREADS)
        else:
            self.fs.put_file(str(local), remote)
        info = self.fs.info(remote)
        if int(info.get("size", -1)) != size:
            raise StoreError(f"{self.url}/{name}: the store holds {info.get('size')} bytes, the part has {size}")
        md5, want = digests(local, UPLOAD_CHUNK)
        etag = str(info.get("ETag", info.get("etag", ""))).strip('"')
        if re.fullmatch(r"[0-9a-f]{32}(-\d+)?", etag):
            if etag != want:
                raise StoreError(f"{self.url}/{name}: the store's checksum {etag} is not the part's {want}")
        elif self.md5(name) != md5:  # no checksum from the store: read it back
            raise StoreError(f"{self.url}/{name}: the bytes read back differ from the part's")
        return md5

    def md5(self, name: str) -> str:
        h = hashlib.md5()
        with self.fs.open(self.path(name), "rb", block_size=UPLOAD_CHUNK) as f:
            while block := f.read(UPLOAD_CHUNK):
                h.update(block)
        return h.hexdigest()

    def get(self, name: str, local: Path) -> None:
        """Download `name` to `local` (through a temporary name: a partial file never has it)."""
        tmp = local.with_name(local.name + ".downloading")
        try:
            self.fs.get_file(self.path(name), str(tmp))
            tmp.replace(local)
        finally:
            tmp.unlink(missing_ok=True)


def precondition_failed(exc: BaseException) -> bool:
    """Whether the store refused a conditional write (S3's 412 PreconditionFailed)."""
    cause = getattr(exc, "__cause__", None)
    code = (getattr(cause, "response", None) or {}).get("Error", {}).get("Code")
    return code == "PreconditionFailed" or "pre-condition" in str(exc) or isinstance(exc, FileExistsError)


def _protocols(fs) -> tuple[str, ...]:
    p = fs.protocol
    return tuple(p) if isinstance(p, (tuple, list)) else (p,)


def digests(path: Path, chunk: int) -> tuple[str, str]:
    """The MD5 of `path`, and the ETag S3 gives it uploaded as s3fs does with parts of `chunk`
    bytes: that MD5 for one PUT (files under two chunks), else the MD5 of the parts' MD5s and
    '-<parts>'. One pass over the file."""
    whole, parts = hashlib.md5(), []
    one_put = path.stat().st_size < 2 * chunk  # its ETag is the MD5: the parts' MD5s are not needed
    with open(path, "rb") as f:
        while block := f.read(chunk):
            whole.update(block)
            if not one_put:
                parts.append(hashlib.md5(block).digest())
    md5 = whole.hexdigest()
    if one_put:
        return md5, md5
    return md5, f"{hashlib.md5(b''.join(parts)).hexdigest()}-{len(parts)}"
