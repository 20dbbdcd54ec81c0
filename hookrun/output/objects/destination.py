"""A run written to an object store: the Destination over HDF5 parts uploaded as they finish.

    dest = StoreParts(ObjectStoreOutput.of("s3://bucket/cache/captures.h5", staging))
    dest.check_place(); lock = dest.locked()    # the store reachable; one writer (a lock object + the staging folder's)
    store = dest.open_store(attrs, resume, part_bytes, **h5_kwargs)   # a PartedStore (parts.py)

Before the lock: the store answers and the staging folder can be written. Under it: nothing is
overwritten unless asked (the manifest is the run's mark), and a resume continues from the parts
the manifest lists (PartsResume, below). Two runs on one URL: the second is refused in
one line naming the first (remote_lock.py).

With many ranks (PartsShards, the layout output/shards.py's ShardRun drives), as LocalShards for a
local file with the object store in place of the shard files and the merged view: before any batch
every rank checks the store (ranked.py: reachable, not taken, the same number of processes on
resume) and rank 0 writes the top manifest (running). Each rank writes its block of batches as
parts under `rank-RRRRR/` with its own manifest, lock and staging folder
(`<output.staging>/<name>.rank-RRRRR.parts`), exactly as one process writes a run; when every rank
has ended, rank 0 writes the top manifest again, complete or naming the ranks that are not.
`resume=true` resumes each rank from its own manifest and staging folder.

Resume of an object-store run: its verified parts are kept as they are, and the part being
written when it stopped is replayed (a Resume, output/resume.py).

    state = open_parts_resume(out, cfg_yaml)  # None where the object store holds no run
    steps = state.replay(store)               # the kept parts' batches, plus the partial part's

The destination for an object-store URL (this module) opens it; a local file's resume
is ResumeState (output/resume.py), whose replay this one uses for the partial part.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import h5py
import yaml

from hookrun.config.differing import config_differences
from hookrun.config.schema import HookrunConfig, replaced, to_yaml
from hookrun.errors import ConfigError, StoreError
from hookrun.output.objects.object_folder import reason
from hookrun.output.objects.parts import ObjectStoreOutput, PartedStore, ResumePoint, prepare_resume
from hookrun.output.objects.ranked import begin_ranks, check_ranked_output, finish_ranks
from hookrun.output.objects.remote_lock import RemoteLock, lock_name
from hookrun.output.process import Ranks
from hookrun.output.ranks import rank_device
from hookrun.output.resume import ResumeState, check_same_model, open_resume
from hookrun.store.merge import View
from hookrun.store.paths import OutputLock, WriterLock, writable_folder
from hookrun.store.records import RunStore


class StoreParts:
    """output.path as an object-store URL (parts.py's ObjectStoreOutput: its parts, manifest, staging)."""

    def __init__(self, out: ObjectStoreOutput) -> None:
        self.out = out
        self.store: PartedStore | None = None

    def __str__(self) -> str:
        return self.out.url

    @property
    def result(self) -> str:
        return self.out.url

    # -- before any batch --------------------------------------------------------------------------
    def check_resume(self) -> None:
        """(A one-process resume of a many-rank cache is refused when the parts are read: PartsResume.)"""

    def check_place(self) -> None:
        """The store answers (one listing: endpoint, credentials, bucket), the staging folder is writable."""
        self.out.folder()
        writable_folder(self.out.parts_dir, "output.staging")

    def locked(self) -> ExitStack:
        """A lock object under the URL (remote_lock.py), and the staging folder's lock file."""
        stack = ExitStack()
        try:
            locks: tuple[Callable[[], WriterLock], ...] = (
                lambda: RemoteLock(self.out.folder(check=False), lock_name(self.out.rank)),
                lambda: OutputLock(self.out.parts_dir))
            for lock in locks:
                stack.enter_context(lock())
        except BaseException:
            stack.close()
            raise
        return stack

    def check_free(self, overwrite: bool, dry_run: bool) -> None:
        """Nothing is overwritten unless asked: a manifest there is an earlier run's (a dry run asks
        the store nothing)."""
        if dry_run or overwrite:
            return
        try:
            taken = self.out.folder(check=False).exists(self.out.manifest_name)
        except Exception as exc:
            raise ConfigError(f"{self.out.url}: the object store cannot be used ({reason(exc)})") from None
        if taken:
            raise ConfigError(f"output.path: {self.out.url} exists (it has a {self.out.manifest_name}); set "
                              f"output.overwrite=true, resume=true, or choose another path")

    def check_state(self, stateful: list) -> None:
        if stateful:
            raise ConfigError(f"{stateful[0].where}: {type(stateful[0]).__name__} keeps a state over the run, "
                              f"which an object-store output does not save yet; write to a local file")

    def check_still_free(self, overwrite: bool) -> None:
        """(Checked under the lock already: the lock object keeps every other writer out.)"""

    # -- the run -----------------------------------------------------------------------------------
    def open_resume(self, config_yaml: str) -> PartsResume | None:
        return open_parts_resume(self.out, config_yaml)

    def resumed_from(self, resume: bool) -> None:
        return None

    def open_store(self, attrs: dict, resume: PartsResume | None, part_bytes: int, **h5_kwargs) -> PartedStore:
        if resume is not None:  # the weights and device of the run its parts hold
            check_same_model(resume.attrs, attrs, self.out.url)
        try:
            self.store = PartedStore(self.out, attrs, part_bytes, resume.point if resume is not None else None,
                                     **h5_kwargs)
        except StoreError as exc:
            raise ConfigError(f"output.path: {exc}") from None
        return self.store

    def adopt(self, store: PartedStore) -> None:
        """(The verified parts stay where they are: a kill from here on keeps them.)"""

    def end(self, resume: PartsResume | None, replayed: bool) -> None:
        """(Each part was uploaded as it finished; the manifest was written as the store closed.)"""

    def size(self, store: PartedStore) -> int:
        return sum(part.bytes for part in store.manifest.parts)

    # -- many ranks --------------------------------------------------------------------------------
    def for_rank(self, rank: int) -> StoreParts:
        return StoreParts(dataclasses.replace(self.out, rank=rank))  # (the same client: one a run)

    def shards(self, cfg: HookrunConfig, ranks: Ranks) -> PartsShards:
        return PartsShards(cfg, ranks, self)


class PartsShards:
    """Many ranks on an object store: each rank's parts and manifest, and rank 0's top manifest."""

    def __init__(self, cfg: HookrunConfig, ranks: Ranks, dest: StoreParts) -> None:
        self.cfg, self.r = cfg, ranks
        self.url = dest.out.url
        self.merged = self.url  # what RunResult.path says: the URL
        self.staging = dest.out.staging
        self.mine = dest.for_rank(ranks.rank)  # this rank's part names, manifest, staging folder and lock

    def rendezvous(self) -> tuple[str, Path]:
        return f"{self.url}/", self.staging  # (the staging folder: the run folder by default)

    def check_files(self) -> None:
        check_ranked_output(self.url, self.r.world, self.cfg.output.overwrite, self.cfg.resume)

    def begin(self) -> None:
        """Rank 0, once every rank has checked: the top manifest, running."""
        if self.r.rank == 0 and not self.cfg.dry_run:
            begin_ranks(self.url, self.r.world, self.run_attrs(), self.cfg.resume)

    def rank_cfg(self) -> HookrunConfig:
        return replaced(self.cfg, device=rank_device(self.cfg.device, self.r.local_rank))

    def run_attrs(self) -> dict:
        return {"config": to_yaml(self.cfg), "launcher": self.r.launcher, "world_size": self.r.world}

    def combine(self, attrs: dict) -> View:
        started = time.perf_counter()
        state = finish_ranks(self.url, self.r.world, {**attrs, **self.run_attrs()})
        return View(self.url, state.status, state.incomplete, state.samples, time.perf_counter() - started)

    def not_complete(self) -> str:
        return f"{self.url} holds the parts of {self.r.world} ranks and these are not complete"


@dataclass
class PartsResume:
    """A run in an object store to continue: its verified parts (parts.py), and the part that
    was being written when it stopped, whose whole batches are replayed."""

    point: ResumePoint
    partial: ResumeState | None
    status: str

    @property
    def steps(self) -> int:
        return self.point.manifest.steps + (self.partial.steps if self.partial is not None else 0)

    @property
    def attrs(self) -> Mapping:
        return self.partial.attrs if self.partial is not None else self.point.manifest.attrs

    @property
    def file(self) -> h5py.File | None:
        return self.partial.file if self.partial is not None else None

    def replay(self, store: RunStore) -> int:
        """The verified parts stay as they are; the part being written is replayed into `store`,
        then removed (its batches are in the new part)."""
        kept = self.point.manifest.steps
        if self.partial is not None:
            kept += self.partial.replay(store)
            self.partial.close()
            self.partial.path.unlink(missing_ok=True)
            self.partial = None
        return kept

    def close(self) -> None:
        if self.partial is not None:
            self.partial.close()


def open_parts_resume(out: ObjectStoreOutput, config_yaml: str) -> PartsResume | None:
    """The run in the object store to continue (its finished local parts uploaded now), None where
    there is none; ConfigError where the config changed."""
    point = prepare_resume(out, out.folder(check=False))
    if point is None:
        return None
    old = point.manifest.attrs.get("config")
    if old is not None:
        changed = config_differences(yaml.safe_load(old), yaml.safe_load(config_yaml))
        if changed:
            raise ConfigError(f"resume: the config differs from the one {out.url} was written with, in "
                              f"{', '.join(changed)}; resume with the same settings (or start a new run)")
    partial = open_resume(point.partial, config_yaml) if point.partial is not None else None
    status = point.manifest.status if partial is None else "interrupted"
    return PartsResume(point, partial, status)


def parts_destination(cfg: HookrunConfig) -> StoreParts:
    """output.path as parts in an object store, staged in output.staging (the object-store scheme's
    destination, store/paths.py)."""
    return StoreParts(ObjectStoreOutput.of(cfg.output.path, cfg.output.staging))
