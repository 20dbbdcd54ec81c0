"""A run written to one HDF5 file on disk: the local Destination, and its shards with many ranks.

    dest = LocalFile(Path("outputs/run/captures.h5"))
    dest.check_place(); lock = dest.locked()       # before anything is created: one writer per file
    store = dest.open_store(attrs, resume, part_bytes, **h5_kwargs)

The file appears under its name only once it opens; a resumed run writes `<name>.resuming` and
replaces the old file with it as soon as it holds the old batches (`adopt`). With many ranks
(LocalShards, the layout output/shards.py's ShardRun drives) each rank writes its own
`captures.rank-NNNNN.h5` and rank 0 writes `captures.h5`, a view over them (store/merge.py).
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from hookrun.config.schema import HookrunConfig, replaced
from hookrun.errors import ConfigError, HookrunError
from hookrun.output.ranks import Ranks, every_rank, rank_device, shard_path
from hookrun.store.format import METADATA_BYTES
from hookrun.store.h5store import H5Store
from hookrun.store.lock import BESIDE, OutputLock, WriterLock, flushing_path, writable_folder
from hookrun.store.schemes import local_path

# resume (output/resume.py) and many ranks' view and reads (store/merge.py, store/reading.py) load
# where a run asks for them: a plain run needs none
if TYPE_CHECKING:
    from hookrun.output.resume import ResumeState
    from hookrun.store.merge import View
    from hookrun.store.records import RunStore

log = logging.getLogger("hookrun")


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
            check_not_a_view(self.path)
            found = shard_ranks(self.path)
            if found:  # a many-process run's shards: one process would ignore them and start again beside them
                worlds = {written_world(shard_path(self.path, i)) for i in found} - {None}
                raise other_world(self.path.parent, max(worlds | {found[-1] + 1}), 1)

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
        return LocalShards(cfg, ranks, self)


class LocalShards:
    """Many ranks on a local file: a shard file per rank, and rank 0's merged view."""

    def __init__(self, cfg: HookrunConfig, ranks: Ranks, dest: LocalFile | None = None) -> None:
        self.cfg, self.r = cfg, ranks
        self.merged = Path(cfg.output.path).expanduser() if dest is None else dest.path
        self.shards = [shard_path(self.merged, i) for i in range(ranks.world)]
        self.mine = LocalFile(self.shards[ranks.rank], shard=True)

    def rendezvous(self) -> tuple[str, Path]:
        """The key prefix of this output in the ranks' store (the jobs of a multirun under torchrun
        share one store), and the folder of its FileStore (submitit, srun)."""
        return f"{self.merged.resolve()}/", self.merged.parent

    def begin(self) -> None:
        """Rank 0, once every rank has checked: nothing to write before the shards."""

    def rank_cfg(self) -> HookrunConfig:
        """This rank's config: its own device and shard file."""
        from hookrun.store.merge import shard_status

        mine = self.mine.path
        if self.cfg.resume and shard_status(mine) == "unreadable":  # killed before its first flush
            log.warning("resume: %s holds no readable batch (killed before its first flush); running its shard "
                        "from the start (the old file is kept as %s.unreadable)", mine, mine.name)
            os.replace(mine, mine.with_name(mine.name + ".unreadable"))
        return replaced(self.cfg, device=rank_device(self.cfg.device, self.r.local_rank),
                                   output=dataclasses.replace(self.cfg.output, path=str(mine)))

    def check_files(self) -> None:
        """Nothing is overwritten unless asked; a resume keeps the world size of the files."""
        cfg, found = self.cfg, shard_ranks(self.merged)
        if cfg.resume:
            worlds = {written_world(self.shards[i]) for i in found if i < self.r.world} - {None}
            if self.merged.is_file() and not found:
                worlds.add(written_world(self.merged) or 1)
            if any(i >= self.r.world for i in found) or worlds - {self.r.world}:
                raise every_rank(other_world(self.merged.parent, max(worlds | {max(found, default=-1) + 1}), self.r.world))
            if found and self.merged.is_file() and written_world(self.merged) is None:  # the view would replace it
                raise every_rank(ConfigError(
                    f"resume: {self.merged} is not the view of the shards beside it (a one-process run's file); a "
                    f"{self.r.world}-process resume would replace it: move it away, or start a new run"))
            return
        if cfg.output.overwrite:
            return
        taken = ([self.merged] if self.merged.exists() else []) + [self.shards[i] for i in found if i < self.r.world]
        if taken:
            raise every_rank(ConfigError(f"output.path: {', '.join(str(p) for p in taken[:3])} exist(s); set "
                                         f"output.overwrite=true, resume=true, or choose another path"))

    def combine(self, attrs: dict) -> View:
        """The shards as one run: the merged view over the shard files."""
        from hookrun.store.merge import build_view

        return build_view(self.merged, self.shards, attrs)

    def not_complete(self) -> str:
        return f"{self.merged} is a view over {self.r.world} shards and these are not complete"


def shard_ranks(merged: Path) -> list[int]:
    """The ranks whose shard files (`captures.rank-NNNNN.h5` for `captures.h5`) lie beside `merged`."""
    pattern = re.compile(re.escape(merged.stem) + r"\.rank-(\d{5})" + re.escape(merged.suffix) + "$")
    return sorted(int(m.group(1)) for p in merged.parent.glob("*") if (m := pattern.match(p.name)))


def other_world(folder: Path, was: int, world: int) -> ConfigError:
    return ConfigError(f"resume: {folder} was written by {was} process(es) and this run has {world}; resume with "
                       f"{was} (torchrun --nproc_per_node, or tasks), or start a new run")


def check_not_a_view(path: Path) -> None:
    """A one-process resume of a merged view would read a view as a run: refuse it, saying why."""
    world = written_world(path) if path.is_file() else None
    if world is not None and world > 1:
        raise ConfigError(f"resume: {path} is the merged view of a {world}-process run; resume it with the same "
                          f"launcher and {world} processes (torchrun --nproc_per_node={world}, or {world} tasks)")


def written_world(path: Path) -> int | None:
    """The world size a shard or view was written with (None: unreadable or not a ranked file)."""
    from hookrun.store.reading import LocalSource

    try:
        with LocalSource(path, wait=False, rows=False) as source:
            value = source.file.attrs.get("world_size")
            return int(value) if value is not None else None
    except HookrunError:
        return None


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
    path = str(local_path(cfg.output.path))
    if path.endswith(("/", os.sep)):  # (Path drops the slash: 'new/' wrote a file named new)
        raise ConfigError(f"output.path: {path!r} ends in '/', a folder; give a file path such as {path}captures.h5")
    return LocalFile(Path(path).expanduser())
