"""Where a run is written: one object, made once in run() from output.path, that the runner asks.

    dest = open_destination(cfg)                 # LocalFile or StoreParts, from output.path
    dest.check_place()                           # before the lock: a place the run can write
    with dest.locked():                          # one writer
        resume = dest.open_resume(config_yaml)   # a Resume (output/resume.py), or None
        store = dest.open_store(attrs, resume, part_bytes, **h5_kwargs)   # a RunStore (store/records.py)
        ...
        dest.end(resume, replayed)

Two classes satisfy Destination: LocalFile (one HDF5 file: output/local_file.py) and StoreParts
(HDF5 parts in an object store: output/objects/destination.py). With many ranks, `dest.shards(cfg, ranks)`
is the layout output/shards.py's ShardRun wraps around either (LocalShards: a file per rank and a
merged view; PartsShards: parts per rank and a top manifest); each rank writes through its own
destination (`layout.mine`). Nothing above this module asks whether a path is a URL.

The moment a run is accepted (its lock held, every check passed, its output open), run() calls
`accepted()`; whoever waits on it listens with `on_accepted` (the CLI keeps Hydra's record of a run,
`.hydra/` and `hookrun.log`, until then: cli/run_record.py), so a run refused for any reason (the file
exists, another writer holds it, a bad config) writes nothing into its run folder. A dry run, and a
resume of a complete file, are never accepted: they write nothing either.

    with on_accepted(lambda: print("the output is this run's now")):
        hookrun.run(cfg)      # calls it once, just after the output opens; a refused run never does
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from hookrun.config.schema import HookrunConfig
from hookrun.errors import ConfigError
from hookrun.store.schemes import local_path, scheme_of

if TYPE_CHECKING:  # the destinations themselves are imported by their scheme (store/schemes.py), when used
    from hookrun.output.local_file import LocalFile
    from hookrun.output.objects.destination import StoreParts
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


def open_destination(cfg: HookrunConfig, ranks: Ranks | None = None) -> LocalFile | StoreParts:
    """output.path, resolved once: an object-store URL (with output.staging) or a local file. With
    many ranks an error is every rank's alike."""
    try:
        return scheme_of(cfg.output.path).open_destination(cfg)  # (store/schemes.py: by the path's scheme)
    except ConfigError as exc:
        if ranks is None or not ranks.many:
            raise exc from None
        from hookrun.output.ranks import every_rank

        raise every_rank(exc) from None


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
    """Within: `listener()` is called when a run is accepted (runner/run.py: execute)."""
    _LISTENERS.append(listener)
    try:
        yield
    finally:
        _LISTENERS.remove(listener)


def accepted() -> None:
    """The run's output is open: tell whoever waits (the CLI's run record)."""
    for listener in list(_LISTENERS):
        listener()
