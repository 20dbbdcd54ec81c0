"""One rank of a data-parallel run: the checks across ranks, this rank's block, and the whole at the end.

    layout = open_destination(cfg).shards(cfg, ranks)   # LocalShards or PartsShards
    result = ShardRun(cfg, ranks, layout).run(body)     # body(cfg_of_this_rank, its destination, adjust)

ShardRun is the ranks strategy, a wrapper around either destination's layout (output/__init__.py):
the rendezvous, the checks, the heartbeats and rank 0's wait are here; which files or objects a
rank writes, and how rank 0 combines them, are the layout's. With a local file:

Before any batch every rank checks that all ranks have the same config, that no file would be
overwritten, and on resume that the world size is the one the files were written with. Each rank
writes captures.rank-NNNNN.h5 for its contiguous block of batches; when its shard ends (complete,
failed or interrupted) it says so in the shared store, and rank 0 waits for every rank, then
writes captures.h5, a view over the shards (hookrun.store.merge). A rank that was killed never
says so; rank 0 notices when it is stopped itself (torchrun stops every rank when one dies) and
marks the view incomplete, naming the shards; `resume=true` runs only the unfinished shards.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import torch.distributed as dist
import yaml

from hookrun.config.differing import differing
from hookrun.config.schema import HookrunConfig, to_yaml
from hookrun.errors import ConfigError, HookrunError, NotFoundError, RunError
from hookrun.output import LocalFile
from hookrun.output.process import Ranks, StopSignals, every_rank
from hookrun.output.ranks import gather, open_store
from hookrun.store.merge import View

if TYPE_CHECKING:
    from hookrun.output.interface import Destination, ShardLayout


def shard_batches(n_batches: int, world: int, rank: int) -> range:
    """The contiguous block of batches rank `rank` of `world` runs (where the batches do not divide
    evenly, the last ranks get one more: 5 batches over 2 ranks are 0-1 and 2-4). Whole batches, so every batch is the batch a one-process
    run has: the same samples together, the same numbers bit for bit."""
    if world > n_batches:
        raise every_rank(ConfigError(
            f"the run has {world} processes (--nproc_per_node x nodes, or tasks) but only {n_batches} "
            f"batch(es) of data.batch_size: each process needs at least one; run at most {n_batches} "
            f"processes, or more batches (data.limit, a smaller data.batch_size)"
        ))
    return range(rank * n_batches // world, (rank + 1) * n_batches // world)


class Result(Protocol):
    """What a rank's run gives back (runner/__init__.py's RunResult): rank 0 replaces path and samples."""

    status: str


R = TypeVar("R", bound=Result)


class Narrowed(Protocol):
    """What ShardRun.adjust narrows to this rank: the runner's Prepared (runner/prepare.py), which this
    package below the runner knows only by these fields."""

    settings: Any  # the loop's settings: kind (its share), batches, progress, label
    batches: range
    n_batches: int
    attrs: dict

log = logging.getLogger("hookrun")
GRACE_SECONDS = 10.0  # how long a stopped or failed rank 0 still waits for the others
POLL_SECONDS = 0.1
BEAT_SECONDS = 2.0  # each rank bumps its heartbeat counter in the store this often
SILENT_SECONDS = float(os.environ.get("HOOKRUN_RANK_TIMEOUT", "120"))  # a rank silent this long is dead


class ShardRun:
    def __init__(self, cfg: HookrunConfig, ranks: Ranks, layout: ShardLayout | None = None) -> None:
        self.cfg, self.r = cfg, ranks
        self.layout = layout if layout is not None else LocalFile(Path(cfg.output.path).expanduser()).shards(cfg, ranks)  # (default: a local file's)
        self.merged = self.layout.merged

    def run(self, body: Callable[[HookrunConfig, Destination, Callable], R]) -> R:
        """Check, run this rank's shard through `body`, and (rank 0) combine the ranks' outputs."""
        # the ranks' link: imported by a ranked run only, not on a one-process run's route
        from hookrun.output.rank_link import RankLink

        key, folder = self.layout.rendezvous()
        store = dist.PrefixStore(key, open_store(self.r, folder))
        self.link = RankLink(store, self.r, folder, key)  # a kind that merges the ranks' statistics (join_ranks)
        self.check_same_config(gather(store, self.r, "config", to_yaml(self.cfg)))
        self.check_all(store)
        self.layout.begin()
        cfg = self.layout.rank_cfg()
        prefix = RankPrefix(self.r.rank)
        log.addFilter(prefix)  # the ranks share the run folder's log file
        try:
            return self.run_and_merge(store, cfg, body)
        finally:
            log.removeFilter(prefix)

    def check_all(self, store: dist.Store) -> None:
        """check_files on every rank, then wait until every rank has checked: no rank writes before
        the others have looked (one would see another's new file as taken); a rank's refusal
        stops every rank."""
        try:
            self.check_files()
            problem = ""
        except ConfigError as exc:
            problem = str(exc)
        problems = gather(store, self.r, "checked", problem)
        first = next(((r, p) for r, p in enumerate(problems) if p), None)
        if first is not None:
            rank, text = first
            raise every_rank(ConfigError(text if text == problem else f"rank {rank}: {text}"))

    def check_files(self) -> None:
        """Nothing is overwritten unless asked; a resume keeps the number of processes (the layout's)."""
        self.layout.check_files()

    def run_and_merge(self, store: dist.Store, cfg: HookrunConfig,
                      body: Callable[[HookrunConfig, Destination, Callable], R]) -> R:
        status, refused, signalled = "failed", False, False
        beat = Heartbeat(store, self.r.rank)
        try:
            result = body(cfg, self.layout.mine, self.adjust)
            status, signalled = result.status, getattr(result, "signum", None) is not None  # (a signal in its last batch)
        except KeyboardInterrupt:
            status = "interrupted"
            raise
        except BaseException as exc:
            status = "interrupted" if getattr(exc, "signum", None) else "failed"
            refused = isinstance(exc, ConfigError | NotFoundError)  # (a bad config: no view to make, no error about one)
            raise
        finally:
            beat.stop()
            store.set(f"done/{self.r.rank}", status)
            if self.r.rank == 0 and status != "dry_run" and not refused:
                try:
                    view = self.merge(store, stopped=status != "complete" or signalled)  # stopped: wait GRACE_SECONDS
                except (HookrunError, OSError) as exc:
                    if status == "complete":
                        raise
                    log.error("could not write the merged view %s: %s", self.merged, exc)  # the run's own error follows
        if self.r.rank == 0 and status != "dry_run":
            if view.incomplete:
                raise RunError(f"{self.layout.not_complete()}: {', '.join(view.incomplete)}; run the same command with "
                               f"resume=true to finish them")
            return dataclasses.replace(result, path=self.merged, samples=view.samples)
        return result

    # -- before any batch ------------------------------------------------------------------------
    def check_same_config(self, configs: list[str]) -> None:
        mine = yaml.safe_load(configs[0])
        for rank, text in enumerate(configs):
            if text != configs[0]:
                keys = differing(mine, yaml.safe_load(text))
                raise every_rank(ConfigError(f"rank {rank} has a different config from rank 0 in {', '.join(keys) or 'its text'}; "
                                  f"every rank of a run must be given the same config (same command, same files)"))

    def adjust(self, p: Narrowed) -> None:
        """Narrow a prepared run to this rank's block of batches (prepare() applied data.limit), or
        to its share of the kind's own rows where its steps are not batches (a grid's cells)."""
        share = p.settings.kind.share(self.r.rank, self.r.world)
        p.settings.kind.join_ranks(getattr(self, "link", None))
        if share is None:
            block = shard_batches(p.n_batches, self.r.world, self.r.rank)
            p.settings.batches = p.batches[block.start : block.stop]
            share = f"batches {block.start}-{block.stop - 1}"
        # one bar, on rank 0, labelled with its own block; the other ranks log their ends as lines
        p.settings.progress = p.settings.progress and self.r.rank == 0
        p.settings.label = f"hookrun rank 0/{self.r.world}, {share}"
        p.attrs.update(rank=self.r.rank, world_size=self.r.world, launcher=self.r.launcher,
                       first_batch=p.batches.start, last_batch=p.batches.stop)

    # -- at the end (rank 0) ---------------------------------------------------------------------
    def merge(self, store: dist.Store, stopped: bool) -> View:
        statuses = self.wait(store, GRACE_SECONDS if stopped else None)
        waiting = [f"rank {r}" for r, s in enumerate(statuses) if s is None]
        if waiting:
            log.warning("%s did not finish; the view marks their shards incomplete", ", ".join(waiting))
        view = self.layout.combine({"config": to_yaml(self.cfg), "launcher": self.r.launcher})
        log.info("merged %d shard(s) into %s: %d samples, %s, in %.3f s", self.r.world, self.merged, view.samples,
                 view.status, view.seconds)
        return view

    def wait(self, store: dist.Store, limit: float | None) -> list[str | None]:
        """Each rank's final status, None for a rank that did not report (dead, or still running
        when rank 0 was stopped). A signal while waiting stops the wait."""
        deadline = None if limit is None else time.monotonic() + limit
        statuses: list[str | None] = [None] * self.r.world
        beats: dict[int, tuple[int, float]] = {}  # rank -> (its counter, when it last changed)
        dead: set[int] = set()
        last_log = time.monotonic()
        with StopSignals() as stop:
            while True:
                now = time.monotonic()
                for rank in range(self.r.world):
                    if statuses[rank] is None and store.check([f"done/{rank}"]):
                        statuses[rank] = store.get(f"done/{rank}").decode()
                    elif statuses[rank] is None and limit is not None and rank not in dead and gone(store, rank):
                        if store.check([f"done/{rank}"]):  # (it said so just before it ended)
                            statuses[rank] = store.get(f"done/{rank}").decode()
                        else:
                            dead.add(rank)  # its process on this machine has ended without saying: no use waiting
                    elif statuses[rank] is None and rank not in dead:
                        count = store.add(f"beat/{rank}", 0)
                        if beats.get(rank, (None,))[0] != count:
                            beats[rank] = (count, now)
                        elif now - beats[rank][1] > SILENT_SECONDS:
                            log.warning("rank %d has been silent for %.0f s: taken for dead", rank, now - beats[rank][1])
                            dead.add(rank)
                if all(s is not None or r in dead for r, s in enumerate(statuses)) or stop.requested():
                    return statuses
                if deadline is not None and time.monotonic() > deadline:
                    return statuses
                if time.monotonic() - last_log > 60:
                    log.info("waiting for %s", ", ".join(f"rank {r}" for r, s in enumerate(statuses) if s is None))
                    last_log = time.monotonic()
                time.sleep(POLL_SECONDS)


class RankPrefix(logging.Filter):
    """'rank 1: ' before each of hookrun's log messages."""

    def __init__(self, rank: int) -> None:
        super().__init__()
        self.prefix = f"rank {rank}: "

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = self.prefix + str(record.msg)
        return True


class Heartbeat:
    """A daemon thread that bumps this rank's counter in the store every BEAT_SECONDS, so rank 0
    can tell a rank that is slow from one that was killed (and never says it is done)."""

    def __init__(self, store: dist.Store, rank: int) -> None:
        self.store, self.key = store, f"beat/{rank}"
        self.stopped = threading.Event()
        store.set(f"pid/{rank}", process_mark())  # (rank 0's grace wait checks whether the process is there)
        self.thread = threading.Thread(target=self._beat, name="hookrun-heartbeat", daemon=True)
        self.thread.start()

    def _beat(self) -> None:
        while not self.stopped.wait(BEAT_SECONDS):
            try:
                self.store.add(self.key, 1)
            except RuntimeError:  # the store is gone (rank 0 ended): nobody is listening
                return

    def stop(self) -> None:
        self.stopped.set()


def process_mark(pid: int | None = None) -> str:
    """This process as another on the same machine can find it: the boot, the pid namespace, the pid
    and its start time; "" where /proc is not there (then gone() never says so)."""
    pid = os.getpid() if pid is None else pid
    try:
        return f"{_machine()}:{pid}:{_stat(pid)[19]}" if _machine() else ""
    except (OSError, IndexError):
        return ""


def gone(store: dist.Store, rank: int) -> bool:
    """Whether rank `rank`'s process has surely ended: it runs on this machine (its process_mark's
    boot and pid namespace are this one's) and its pid is no longer there, is a zombie, or is
    another process. A rank elsewhere, or one that never said, is never taken for gone."""
    mark = store.get(f"pid/{rank}").decode() if store.check([f"pid/{rank}"]) else ""
    if not mark or not _machine() or mark.rsplit(":", 2)[0] != _machine():
        return False
    pid, start = mark.rsplit(":", 2)[1:]
    try:
        fields = _stat(pid)
    except (OSError, IndexError):
        return True
    return fields[0] in ("Z", "X") or fields[19] != start


@functools.cache
def _machine() -> str:
    """This machine's boot and pid namespace, 'BOOT_ID:INODE' ("" without /proc): the same for a process's life."""
    try:
        return f"{Path('/proc/sys/kernel/random/boot_id').read_text().strip()}:{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return ""


def _stat(pid: int | str) -> list[str]:
    """/proc/PID/stat's fields after the command's name: [0] the state, [19] the start time."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
