"""A run's paths: where it lives, by the scheme of its path; one writer per output file, by a lock
file beside it; and a new file created under a hidden name, so that a kill -9 at any moment leaves a
file that opens under its own name.

Where a run lives: the one registry of destinations (where a run is written), sources (where it is
read from) and readers (what open_run hands the user). Nothing else in hookrun asks whether a path is a URL.

    scheme_of("outputs/run/captures.h5").name    # 'file': a local HDF5 file (output/__init__.py)
    scheme_of("s3://bucket/cache/captures.h5")   # 'objects': parts in an object store (output/objects/)
    open_destination(cfg) / open_source(path)    # output/__init__.py and store/reading.py ask here

A scheme names its destination, its source and its reader by import path ("module:callable"),
resolved when first used: `destination(cfg) -> Destination` (output/interface.py's protocol:
writer, lock, resume), `source(path, cache_dir) -> RunSource` (store/reading.py's protocol) and
`reader(source) -> Run` (analysis/run_reader.py's Run or a subclass; analysis/opening.py's
open_run asks it). Adding one, say `gs://` through another client, is one module that calls
`register_scheme(Scheme("gs", ...))` (imported through `imports:` or at the top of a user's script)
and its test; or, from a user's package, one entry point of the group `hookrun.schemes` naming its
Scheme (`gs = "my_pkg.store:SCHEME"`: store/scheme_entry_points.py), which every process finds (inspect,
plot and report of a `gs://` run too, that no `imports:` reaches); a URL whose scheme no entry names
goes to the object store (fsspec), as `s3://` does.

One writer per output file (an exclusive lock file beside it, held for the whole run):

    with OutputLock(Path("outputs/run/captures.h5")):   # ConfigError if another run holds it
        ...  # check, create, resume and replace captures.h5 (and captures.h5.resuming)

The lock is `<file>.lock`, locked with flock(2) before anything is created or truncated, and
removed when the run ends; the operating system drops the lock of a killed process, so a stale
lock file never blocks the next run. A run that is refused touches nothing.

Opening an HDF5 file for writing:

    writable_folder(Path("."), "output.path")       # made if missing, else a ConfigError naming the key
    f, hidden = create_hidden(Path("captures.h5"))   # h5py.File at .captures.h5.<pid>.creating
    ...  # write the skeleton, f.flush()
    os.replace(hidden, "captures.h5")               # the visible name always opens

Three things together: the file appears under its name only once its skeleton is on disk; dirty
metadata stays in memory until an explicit flush; and freed file space is never reused. (A reader's
side, the live writer and a killed run's last flush: store/live.py.)
"""

from __future__ import annotations

import importlib
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

import h5py

from hookrun.errors import ConfigError
from hookrun.store.held import HeldWrites

LOCAL_PREFIXES = ("", "file", "local")  # a path with one of these (or none) is a local file


@dataclass(frozen=True)
class Scheme:
    name: str  # the URL scheme it serves ("s3"), or "file" for local paths
    remote: bool  # a URL, not a local path: the CLI stages it in the run folder, readers fetch it
    destination: str  # "module:callable": (cfg) -> a Destination
    source: str  # "module:callable": (path, cache_dir) -> a RunSource
    reader: str = "hookrun.analysis.run_reader:Run"  # "module:callable": (source) -> the user's Run (Run: any source)
    why: str = ""  # a package's entry point that cannot serve (store/scheme_entry_points.py): every use is this one line

    def open_destination(self, cfg: Any) -> Any:
        return self._resolve(self.destination)(cfg)

    def open_source(self, path: Any, cache_dir: Any = None) -> Any:
        return self._resolve(self.source)(path, cache_dir)

    def open_reader(self, source: Any) -> Any:
        return self._resolve(self.reader)(source)

    def _resolve(self, target: str) -> Any:
        if self.why:
            raise ConfigError(self.why)
        module, _, attr = target.partition(":")
        return getattr(importlib.import_module(module), attr)


LOCAL = Scheme("file", False, "hookrun.output:local_destination", "hookrun.store.reading:local_source",
               "hookrun.analysis.run_reader:Run")
OBJECTS = Scheme("objects", True, "hookrun.output.objects.destination:parts_destination",
                 "hookrun.output.objects.source:parts_source", "hookrun.output.objects.remote_run:RemoteRun")
SCHEMES: dict[str, Scheme] = {"s3": OBJECTS}


def register_scheme(scheme: Scheme) -> Scheme:
    """Serve the URLs `NAME://...` with `scheme`'s destination and source."""
    SCHEMES[scheme.name.lower()] = scheme
    return scheme


def prefix(path: object) -> str | None:
    """The URL scheme of `path` ("s3"), or None for a local path."""
    m = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://", str(path))
    return m.group(1).lower() if m and m.group(1).lower() not in LOCAL_PREFIXES else None


def local_path(path: object) -> str:
    """A local path as the file system names it: `file:///tmp/run.h5` (or `local://`) -> `/tmp/run.h5`."""
    m = re.match(r"^(?:file|local)://", str(path), re.IGNORECASE)
    return str(path)[m.end():] if m else str(path)


def local_only(path: object, option: str, what: str) -> str:
    """`path` as the file system names it, for an option that writes local files only (a command's --out);
    a URL is one ConfigError line, not a local folder named `s3:` (Path('s3://b/x') is 's3:/b/x')."""
    if scheme_of(path).remote:
        raise ConfigError(f"{option} {path}: an object-store URL; {what} writes to a local path only: name one (and "
                          f"copy it to the store after)")
    return local_path(path)


def scheme_of(path: object) -> Scheme:
    """The scheme that serves `path`: a registered one, one a package declares, the object store for any other
    URL, else local."""
    name = prefix(path)
    if name is None:
        return LOCAL
    if name in SCHEMES:
        return SCHEMES[name]
    from hookrun.store.scheme_entry_points import declared  # (a user's package may declare it)

    found = declared(name, Scheme)
    return (found if found.why else register_scheme(found)) if found else OBJECTS


try:
    import fcntl
except ImportError:  # Windows
    fcntl = None
    import msvcrt

L = TypeVar("L", bound="WriterLock")


@runtime_checkable
class WriterLock(Protocol):
    """One writer per output, whatever the output is: `acquire` refuses in one ConfigError line naming
    the holder, `release` lets the next run in; used as a context manager around the whole run.

    | lock                                        | where                      | a killed holder                     |
    |---------------------------------------------|----------------------------|-------------------------------------|
    | OutputLock (this module)                    | `<file>.lock`, flock(2)    | the OS drops its lock               |
    | RemoteLock (output/objects/remote_lock.py)  | `<url>/writer.lock` object | taken over when its lease has ended |

    A destination (hookrun/output/) holds one, or both for an object-store run (the URL's lock and
    the staging folder's)."""

    def acquire(self) -> None: ...

    def release(self) -> None: ...

    def __enter__(self: L) -> L:  # (a lock that subclasses WriterLock gets these two: acquire, then release)
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


BESIDE = (".resuming", ".replacing")  # a new file written beside the old one (resume, overwrite: output/__init__.py)


def lock_path(output: Path) -> Path:
    """The lock file of an output file: `captures.h5` -> `captures.h5.lock`, beside it."""
    return output.with_name(output.name + ".lock")


class OutputLock(WriterLock):
    def __init__(self, output: Path) -> None:
        self.output = output
        self.path = lock_path(output)
        self._fd: int | None = None

    def acquire(self) -> None:
        deadline = time.monotonic() + 0.5
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise ConfigError(f"output.path: cannot create the lock file {str(self.path)!r}: {exc.strerror}") from None
            if not try_lock(fd):  # another process holds it: which (store/lock_holder.py)
                from hookrun.store.lock_holder import read_pid, writer_alive

                holder = read_pid(fd)
                os.close(fd)
                if not writer_alive(holder) and time.monotonic() < deadline:  # a reader's probe (live_writer), for an
                    time.sleep(0.01)  # instant, or a writer between its lock and its pid: try again
                    continue
                raise ConfigError(
                    f"output.path: another hookrun run{f' (pid {holder})' if holder else ''} is writing "
                    f"{str(self.output)!r} (it holds {self.path.name}); wait for it to end, or choose another path"
                ) from None
            # the previous holder removes the lock file as it ends: lock the file that is there now
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                try:  # (a full disk fails here, not at the open)
                    os.ftruncate(fd, 0)
                    os.write(fd, f"{os.getpid()}\n".encode())
                except OSError as exc:
                    self._fd = fd
                    self.release()
                    raise ConfigError(f"output.path: cannot write the lock file {str(self.path)!r}: {exc.strerror}") from None
                self._fd = fd
                for suffix in BESIDE:  # a killed run's new file: no writer owns it now that the lock is ours
                    self.output.with_name(self.output.name + suffix).unlink(missing_ok=True)
                return
            os.close(fd)

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)  # while still holding it: a waiting run then retries on a new file
        except OSError:  # (Windows keeps an open file) a leftover lock file blocks nothing
            pass
        finally:
            os.close(self._fd)
            self._fd = None


def try_lock(fd: int, shared: bool = False) -> bool:
    """An exclusive (or `shared`: POSIX only), non-blocking lock on the open file `fd`: False where
    another process holds it."""
    try:
        if fcntl is not None:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        else:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
    except OSError:  # BlockingIOError (EWOULDBLOCK), or EACCES on Windows
        return False
    return True


# Space HDF5 frees (an old B-tree node, a moved object header) is never handed out again: the
# metadata of the last flush may still point there, and a kill before the next flush must find it
# intact. The file grows by the freed bytes, a few KiB per capture.
FILE_SPACE = {"fs_strategy": "none"}


FLUSHING = ".flushing"  # hookrun 0.2 renamed a file so for the whole flush


def flushing_path(path: Path) -> Path:
    """Where a file stands while HDF5 flushes it (H5Store._aside); left there by a kill in a flush."""
    return path.with_name(path.name + FLUSHING)


def writable_folder(folder: Path, key: str) -> None:
    """The folder files will be created in (an output file's, a staging folder of parts), made if
    missing and checked writable; a ConfigError naming the config `key` where it cannot be."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{key}: cannot create the folder {str(folder)!r}: {exc.strerror}") from None
    if not os.access(folder, os.W_OK):
        raise ConfigError(f"{key}: the folder {str(folder)!r} is not writable")


def create_hidden(path: Path, **kwargs) -> tuple[h5py.File, HeldWrites, Path]:
    """A new, empty HDF5 file under a hidden name beside `path`, to be moved to `path` once its
    skeleton is flushed, and the file object HDF5 writes it through. (The caller holds the
    output's lock: leftovers of a killed run go.)"""
    for old in path.parent.glob(f".{path.name}.*.creating"):
        old.unlink(missing_ok=True)
    hidden = path.with_name(f".{path.name}.{os.getpid()}.creating")
    raw = HeldWrites(hidden)
    try:
        f = h5py.File(raw, "w", **FILE_SPACE, **kwargs)
    except BaseException:
        raw.close()
        raise
    _metadata_only_at_flush(f)
    return f, raw, hidden


def _metadata_only_at_flush(f: h5py.File) -> None:
    """Keep dirty metadata in memory until flush(): then a crash (kill -9) leaves the file as it
    was at the last flush, which plain h5py and h5ls open. (SWMR files, the other way, need
    h5clear after a crash before h5ls or a plain h5py.File can open them.)"""
    cfg = f.id.get_mdc_config()
    cfg.evictions_enabled = False
    cfg.incr_mode = 0  # H5C_incr__off
    cfg.flash_incr_mode = 0  # H5C_flash_incr__off
    cfg.decr_mode = 0  # H5C_decr__off
    f.id.set_mdc_config(cfg)
