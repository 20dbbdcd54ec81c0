"""Where and how a run is written, below the runner: the destination (a local file or object-store
parts), its lock, resume (local and parts), ranks and their shards, and the clean stops on signals.
The object-store scheme is one folder, objects/ (writer, lock, resume, source and the reader
RemoteRun), loaded only through store/paths.py. It imports config/, store/, analysis/ (RemoteRun
is a Run) and errors; the runner (hookrun/runner/) asks it and never asks which destination it has.

Where a run is written: one object, made once in run() from output.path, that the runner asks
(its interface, Destination, and the order of the calls: output/interface.py).

    dest = open_destination(cfg)                   # by output.path's scheme: LocalFile, or StoreParts (objects/)
    dest.check_place(); lock = dest.locked()       # before anything is created: one writer per file
    store = dest.open_store(attrs, resume, part_bytes, **h5_kwargs)

LocalFile is the `file` scheme's: a run written to one HDF5 file on disk. The file appears under its
name only once it opens; a resumed run writes `<name>.resuming` and replaces the old file with it as
soon as it holds the old batches (`adopt`). With many ranks (LocalShards, output/local_shards.py) each
rank writes its own `captures.rank-NNNNN.h5` and rank 0 writes `captures.h5`, a view over them
(store/merge.py). Nothing above this module asks whether a path is a URL.

The moment a run is accepted (its lock held, every check passed, its output open), run() calls
`accepted()`; whoever waits on it listens with `on_accepted` (the CLI keeps Hydra's record of a run,
`.hydra/` and `hookrun.log`, until then: cli/around_hydra.py), so a run refused for any reason (the file
exists, another writer holds it, a bad config) writes nothing into its run folder. A dry run, and a
resume of a complete file, are never accepted: they write nothing either.

    with on_accepted(lambda: print("the output is this run's now")):
        hookrun.run(cfg)      # calls it once, just after the output opens; a refused run never does
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from hookrun.config.schema import HookrunConfig
from hookrun.errors import ConfigError
from hookrun.output.process import Ranks, every_rank
from hookrun.store import METADATA_BYTES
from hookrun.store.h5store import H5Store
from hookrun.store.paths import (
    BESIDE,
    OutputLock,
    WriterLock,
    flushing_path,
    local_path,
    scheme_of,
    writable_folder,
)

# the other schemes' destinations are imported by their scheme (store/paths.py), when used; resume
# (output/resume.py) and many ranks' files (output/local_shards.py) where a run asks for them
if TYPE_CHECKING:
    from hookrun.output.local_shards import LocalShards
    from hookrun.output.objects.destination import StoreParts
    from hookrun.output.resume import ResumeState
    from hookrun.store.records import RunStore

log = logging.getLogger("hookrun")


def open_destination(cfg: HookrunConfig, ranks: Ranks | None = None) -> LocalFile | StoreParts:
    """output.path, resolved once: an object-store URL (with output.staging) or a local file. With
    many ranks an error is every rank's alike."""
    try:
        return scheme_of(cfg.output.path).open_destination(cfg)  # (store/paths.py: by the path's scheme)
    except ConfigError as exc:
        raise (every_rank(exc) if ranks is not None and ranks.many else exc) from None


def in_run_folder(path: str, staging: str | None, folder: Path) -> tuple[str, str | None]:
    """The CLI's output.path and output.staging in its run folder: a relative file path goes there (a
    path starting with ~ is the user's home folder's, as in a shell), and so do an object store's staged
    parts unless output.staging says where."""
    if scheme_of(path).remote:
        return path, staging if staging is not None else str(folder)
    path = str(Path(local_path(path)).expanduser())  # (file:///tmp/run.h5 is /tmp/run.h5; ~/run.h5 the home folder's)
    return (path if Path(path).is_absolute() else str(folder / path)), staging


_LISTENERS: list[Callable[[], None]] = []


@contextmanager
def on_accepted(listener: Callable[[], None]) -> Iterator[None]:
    """Within: `listener()` is called when a run is accepted (runner/__init__.py: execute)."""
    _LISTENERS.append(listener)
    try:
        yield
    finally:
        _LISTENERS.remove(listener)


def accepted() -> None:
    """The run's output is open: tell whoever waits (the CLI's run record)."""
    for listener in list(_LISTENERS):
        listener()


class LocalFile:
    """output.path as a local file (`shard`: one rank's file of a many-process run)."""

    def __init__(self, path: Path, shard: bool = False) -> None:
        self.path, self.shard = path, shard
        self.target: Path | None = None

    def __str__(self) -> str:
        return str(self.path)

    @property
    def result(self) -> Path:
        return self.path

    # -- before any batch --------------------------------------------------------------------------
    def check_resume(self) -> None:
        if not self.shard:
            from hookrun.output.local_shards import check_one_process

            check_one_process(self.path)

    def check_place(self) -> None:
        """A name the file can have, its folder made (the lock file goes there)."""
        check_output(self.path, overwrite=True)

    def locked(self) -> WriterLock:
        return OutputLock(real_path(self.path))

    def check_free(self, overwrite: bool, dry_run: bool) -> None:
        """Nothing is overwritten unless asked (prepare(), before the model is built)."""
        check_output(self.path, overwrite, create=not dry_run)

    def check_state(self, stateful: list) -> None:
        """(A local file saves the actions' state at each flush.)"""

    def check_still_free(self, overwrite: bool) -> None:
        """Again under the lock, now that the model is built: still ours to write."""
        check_output(self.path, overwrite)

    # -- the run -----------------------------------------------------------------------------------
    def open_resume(self, config_yaml: str) -> ResumeState | None:
        from hookrun.output.resume import open_resume

        return open_resume(self.path, config_yaml)

    def resumed_from(self, resume: bool) -> Path | None:
        return self.path if resume and self.path.exists() else None

    def open_store(self, attrs: dict, resume: ResumeState | None, part_bytes: int, **h5_kwargs) -> H5Store:
        real = real_path(self.path)  # through a symlink: the link stays, its target is written
        if resume is not None:  # (resume.py is loaded: the run opened it)
            from hookrun.output.resume import check_same_model

            check_same_model(resume.attrs, attrs, self.path)
            need, free = Path(resume.file.filename).stat().st_size + METADATA_BYTES, shutil.disk_usage(real.parent).free
            if free < need:  # its batches are copied first, beside it
                raise ConfigError(f"resume: copying the {resume.steps} kept batches of {str(self.path)!r} needs about {need} "
                                  f"bytes free beside it and {free} are; free some space and resume again (the file is as it was)")
        # output.overwrite: the old file keeps its name until the new one holds a batch (an error found at the
        # first batch, or a kill before it, leaves it as it was)
        suffix = ".resuming" if resume is not None else ".replacing" if real.exists() else ""
        self.target = real.with_name(real.name + suffix)
        try:
            self.store = H5Store(self.target, attrs, **h5_kwargs)
        except OSError as exc:
            raise ConfigError(f"output.path: cannot create {str(self.target)!r}: {exc}") from None
        if suffix == ".replacing":
            self.store.after_first_batch = self.adopt
        if resume is not None:  # until adopt(): a full disk names the old file and its batches, not the copy
            self.store.copy_of = (self.path, resume.steps)
        return self.store

    def adopt(self, store: H5Store) -> None:
        """The old batches are replayed (or, overwriting, the first new one is written): flushed, the new file
        replaces the old one now, so a kill from here on keeps them and every batch flushed after (it
        replaced it at the end of the run: a resume killed again lost all it had added). The old file
        stays open for reading until the run ends."""
        if self.target is None or not self.target.name.endswith(BESIDE):
            return
        store.flush()
        real = real_path(self.path)
        os.replace(self.target, real)  # (the store writes through its open descriptor: the name may change)
        flushing_path(real).unlink(missing_ok=True)  # the old file, where a kill in a flush left it
        store.path, store.copy_of, self.target = real, None, None

    def end(self, resume: ResumeState | None, replayed: bool) -> None:
        """The store is closed: a resumed file replaces the old one once it holds the old batches (adopt);
        overwriting, a run that failed before its first batch leaves the old file as it was."""
        if self.target is None or not self.target.name.endswith(BESIDE):
            return
        if resume is None and self.store.closed_as == "failed":
            self.target.unlink(missing_ok=True)
            log.warning("%s is as it was: the run that was to overwrite it failed before its first batch", self.path)
        elif replayed or resume is None:
            real = real_path(self.path)
            os.replace(self.target, real)
            flushing_path(real).unlink(missing_ok=True)  # the old file, where a kill in a flush left it
        else:
            self.target.unlink(missing_ok=True)

    def size(self, store: RunStore) -> int:
        return self.path.stat().st_size

    # -- many ranks --------------------------------------------------------------------------------
    def shards(self, cfg: HookrunConfig, ranks: Ranks) -> LocalShards:
        from hookrun.output.local_shards import LocalShards

        return LocalShards(cfg, ranks, self)


def real_path(out: Path) -> Path:
    """The file to write for output path `out`: the target of a symlink, else `out` itself."""
    return out.resolve() if out.is_symlink() else out


def check_output(path: str | Path, overwrite: bool, create: bool = True) -> Path:
    """A name the output can have, not a folder, not taken unless `overwrite`; with `create`, its
    folder made and writable."""
    out = Path(path).expanduser()
    try:
        if out.is_dir():
            raise ConfigError(f"output.path: {str(out)!r} is a folder; give a file path such as captures.h5")
        exists = out.exists()
    except OSError as exc:  # ENAMETOOLONG, ELOOP, EACCES on a parent ...
        raise ConfigError(f"output.path: {_os_reason(out, exc)}") from None
    room = _name_max(out) - len(".creating") - 24  # beside it: .<name>.<pid>.creating, <name>.resuming, <name>.lock
    if len(out.name.encode()) > room:
        raise ConfigError(f"output.path: the file name {out.name[:40]!r}... is too long ({len(out.name.encode())} bytes; "
                          f"hookrun needs it under {room + 1} bytes, to add .lock or .resuming): choose a shorter output.path")
    if exists and not overwrite:
        raise ConfigError(f"output.path: {str(out)!r} exists; set output.overwrite=true, resume=true, or choose another path")
    if not exists and not overwrite and flushing_path(out).exists():
        raise ConfigError(f"output.path: {str(flushing_path(out))!r} is what a run killed while flushing {out.name} left; "
                          f"resume=true recovers its batches, output.overwrite=true starts again, or choose another path")
    if create:
        writable_folder(out.parent, "output.path")
    return out


def _os_reason(out: Path, exc: OSError) -> str:
    if exc.errno == errno.ENAMETOOLONG:
        longest = max(out.parts, key=len)
        return (f"the name {longest[:40]!r}... is too long ({len(longest.encode())} bytes; file systems allow "
                f"{_name_max(out)} bytes in a name): choose a shorter output.path")
    return f"{str(out)[:200]!r} cannot be used: {exc.strerror or exc}"


def _name_max(out: Path) -> int:
    folder = next((p for p in [out.parent, *out.parents] if p.exists()), Path("."))
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def local_destination(cfg: HookrunConfig) -> LocalFile:
    """output.path as a local HDF5 file (the `file` scheme's destination, store/paths.py)."""
    path = str(local_path(cfg.output.path))
    if path.endswith(("/", os.sep)):  # (Path drops the slash: 'new/' wrote a file named new)
        raise ConfigError(f"output.path: {path!r} ends in '/', a folder; give a file path such as {path}captures.h5")
    return LocalFile(Path(path).expanduser())
