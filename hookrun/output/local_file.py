"""A run written to one HDF5 file on disk: the local Destination.

    dest = LocalFile(Path("outputs/run/captures.h5"))
    dest.check_place(); lock = dest.locked()       # before anything is created: one writer per file
    store = dest.open_store(attrs, resume, part_bytes, **h5_kwargs)

The file appears under its name only once it opens; a resumed run writes `<name>.resuming` and
replaces the old file with it only once it holds the old batches too (`end`). With many ranks
(LocalShards in output/local_shards.py, the layout output/shards.py's ShardRun drives) each rank
writes its own `captures.rank-NNNNN.h5` and rank 0 writes `captures.h5`, a view over them.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import TYPE_CHECKING

from hookrun.config.schema import HookrunConfig
from hookrun.errors import ConfigError
from hookrun.store.h5store import H5Store
from hookrun.store.lock import OutputLock, WriterLock, flushing_path, writable_folder

if TYPE_CHECKING:  # resume=true and many ranks load theirs when asked (a plain run needs neither)
    from hookrun.output.local_shards import LocalShards
    from hookrun.output.ranks import Ranks
    from hookrun.output.resume import ResumeState
    from hookrun.store.records import RunStore


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
            from hookrun.output.local_shards import check_not_a_view

            check_not_a_view(self.path)

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
        self.target = real.with_name(real.name + ".resuming") if resume is not None else real
        try:
            return H5Store(self.target, attrs, **h5_kwargs)
        except OSError as exc:
            raise ConfigError(f"output.path: cannot create {str(self.target)!r}: {exc}") from None

    def end(self, resume: ResumeState | None, replayed: bool) -> None:
        """The store is closed: a resumed file replaces the old one once it holds the old batches."""
        if resume is None or self.target is None:
            return
        if replayed:
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
    """output.path as a local HDF5 file (the `file` scheme's destination, store/schemes.py)."""
    return LocalFile(Path(cfg.output.path).expanduser())
