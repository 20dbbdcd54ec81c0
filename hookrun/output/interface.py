"""The interfaces the runner asks of where a run is written, for type checkers and readers (no run
imports this module: the runner names them under TYPE_CHECKING).

    dest = open_destination(cfg)                 # LocalFile or StoreParts, from output.path
    dest.check_place()                           # before the lock: a place the run can write
    with dest.locked():                          # one writer
        resume = dest.open_resume(config_yaml)   # a Resume (output/resume.py), or None
        store = dest.open_store(attrs, resume, part_bytes, **h5_kwargs)   # a RunStore (store/records.py)
        ...
        dest.end(resume, replayed)

Two classes satisfy Destination: LocalFile (one HDF5 file: output/__init__.py) and StoreParts
(HDF5 parts in an object store: output/objects/destination.py). With many ranks, `dest.shards(cfg, ranks)`
is the layout output/shards.py's ShardRun wraps around either (LocalShards: a file per rank and a
merged view, output/local_shards.py; PartsShards: parts per rank and a top manifest); each rank
writes through its own destination (`layout.mine`).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from hookrun.config.schema import HookrunConfig

if TYPE_CHECKING:
    from hookrun.output.process import Ranks
    from hookrun.output.resume import Resume
    from hookrun.store.merge import View
    from hookrun.store.records import RunStore


class Destination(Protocol):
    """Where one process writes its run (see the module's docstring for the order of the calls)."""

    @property
    def result(self) -> Path | str:
        """What RunResult.path says: the file, or the URL."""

    def check_resume(self) -> None:
        """resume=true: the output is one this process can resume (not a many-rank run's whole)."""

    def check_place(self) -> None:
        """Before the lock: the place can be written (a file's folder made, a store that answers)."""

    def locked(self) -> AbstractContextManager:
        """One writer: held from before anything is created until the store is closed."""

    def check_free(self, overwrite: bool, dry_run: bool) -> None:
        """Before the model is built: nothing is overwritten unless `overwrite`."""

    def check_state(self, stateful: list) -> None:
        """Actions that keep a state over the run (top_examples), refused where it cannot be saved."""

    def check_still_free(self, overwrite: bool) -> None:
        """Under the lock, once the model is built, for a new run: still ours to write."""

    def open_resume(self, config_yaml: str) -> Resume | None:
        """The old run to continue (None: nothing there); ConfigError where it cannot be."""

    def resumed_from(self, resume: bool) -> Path | None:
        """What an interrupt before the first batch names as the run to resume."""

    def open_store(self, attrs: dict, resume: Resume | None, part_bytes: int, **h5_kwargs) -> RunStore:
        """The run's store (for a resume: where the old batches are replayed to)."""

    def adopt(self, store: RunStore) -> None:
        """A resume's old batches are in `store`: from now on a kill keeps them (a file takes the old one's place)."""

    def end(self, resume: Resume | None, replayed: bool) -> None:
        """After the store is closed: a resumed run takes the old one's place (where adopt has not)."""

    def size(self, store: RunStore) -> int:
        """Bytes written (the end-of-run log line)."""

    def shards(self, cfg: HookrunConfig, ranks: Ranks) -> ShardLayout:
        """The layout of a many-process run on this output."""


class ShardLayout(Protocol):
    """A many-process run's outputs (LocalShards, PartsShards), driven by output/shards.py's ShardRun."""

    merged: Path | str  # what RunResult.path says once rank 0 has combined the ranks
    mine: Destination  # this rank's own

    def rendezvous(self) -> tuple[str, Path]: ...

    def check_files(self) -> None: ...

    def begin(self) -> None: ...

    def rank_cfg(self) -> HookrunConfig: ...

    def combine(self, attrs: dict) -> View: ...

    def not_complete(self) -> str: ...
