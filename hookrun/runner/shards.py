"""One rank of a data-parallel run: its shard file, the checks across ranks, and the merged view.

    result = ShardRun(cfg, detect()).run(body)   # body(cfg_of_this_rank, adjust) runs the shard

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
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.distributed as dist
import yaml

from hookrun.config.diff import differing
from hookrun.config.schema import HookrunConfig, to_yaml
from hookrun.errors import ConfigError, HookrunError, RunError
from hookrun.runner.ranks import (
    Ranks,
    every_rank,
    gather,
    open_store,
    rank_device,
    shard_batches,
    shard_path,
)
from hookrun.runner.signals import StopSignals
from hookrun.store.merge import View, build_view, shard_status
from hookrun.store.reading import LocalSource

log = logging.getLogger("hookrun")
GRACE_SECONDS = 10.0  # how long a stopped or failed rank 0 still waits for the others
POLL_SECONDS = 0.1
BEAT_SECONDS = 2.0  # each rank bumps its heartbeat counter in the store this often
SILENT_SECONDS = float(os.environ.get("HOOKRUN_RANK_TIMEOUT", "120"))  # a rank silent this long is dead


class ShardRun:
    def __init__(self, cfg: HookrunConfig, ranks: Ranks) -> None:
        self.cfg, self.r = cfg, ranks
        self.merged = Path(cfg.output.path).expanduser()
        self.shards = [shard_path(self.merged, i) for i in range(ranks.world)]
        self.mine = self.shards[ranks.rank]

    def run(self, body: Callable[[HookrunConfig, Callable], Any]) -> Any:
        """Check, run this rank's shard through `body`, and (rank 0) write the merged view."""
        key, folder = self.rendezvous()
        store = dist.PrefixStore(key, open_store(self.r, folder))
        self.check_same_config(gather(store, self.r, "config", to_yaml(self.cfg)))
        self.check_all(store)
        cfg = self.rank_cfg()
        prefix = RankPrefix(self.r.rank)
        log.addFilter(prefix)  # the ranks share the run folder's log file
        try:
            return self.run_and_merge(store, cfg, body)
        finally:
            log.removeFilter(prefix)

    def rendezvous(self) -> tuple[str, Path]:
        """The key prefix of this output in the ranks' store (the jobs of a multirun under torchrun
        share one store), and the folder of its FileStore (submitit, srun)."""
        return f"{self.merged.resolve()}/", self.merged.parent

    def rank_cfg(self) -> HookrunConfig:
        """This rank's config: its own device and shard file."""
        if self.cfg.resume and shard_status(self.mine) == "unreadable":  # killed before its first flush
            log.warning("resume: %s holds no readable batch (killed before its first flush); running its shard "
                        "from the start (the old file is kept as %s.unreadable)", self.mine, self.mine.name)
            os.replace(self.mine, self.mine.with_name(self.mine.name + ".unreadable"))
        return dataclasses.replace(
            self.cfg, device=rank_device(self.cfg.device, self.r.local_rank),
            output=dataclasses.replace(self.cfg.output, path=str(self.mine)),
        )

    def check_all(self, store: Any) -> None:
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

    def run_and_merge(self, store: Any, cfg: HookrunConfig, body: Callable[[HookrunConfig, Callable], Any]) -> Any:
        status = "failed"
        beat = Heartbeat(store, self.r.rank)
        try:
            result = body(cfg, self.adjust)
            status = result.status
        except KeyboardInterrupt:
            status = "interrupted"
            raise
        except BaseException as exc:
            status = "interrupted" if getattr(exc, "signum", None) else "failed"
            raise
        finally:
            beat.stop()
            store.set(f"done/{self.r.rank}", status)
            if self.r.rank == 0 and status != "dry_run":
                try:
                    view = self.merge(store, stopped=status != "complete")
                except (HookrunError, OSError) as exc:
                    if status == "complete":
                        raise
                    log.error("could not write the merged view %s: %s", self.merged, exc)  # the run's own error follows
        if self.r.rank == 0 and status != "dry_run":
            if view.incomplete:
                raise RunError(f"{self.not_complete()}: {', '.join(view.incomplete)}; run the same command with "
                               f"resume=true to finish them")
            return dataclasses.replace(result, path=self.merged, samples=view.samples)
        return result

    def not_complete(self) -> str:
        return f"{self.merged} is a view over {self.r.world} shards and these are not complete"

    # -- before any batch ------------------------------------------------------------------------
    def check_same_config(self, configs: list[str]) -> None:
        mine = yaml.safe_load(configs[0])
        for rank, text in enumerate(configs):
            if text != configs[0]:
                keys = differing(mine, yaml.safe_load(text))
                raise every_rank(ConfigError(f"rank {rank} has a different config from rank 0 in {', '.join(keys) or 'its text'}; "
                                  f"every rank of a run must be given the same config (same command, same files)"))

    def check_files(self) -> None:
        """Nothing is overwritten unless asked; a resume keeps the world size of the files."""
        cfg = self.cfg
        pattern = re.compile(re.escape(self.merged.stem) + r"\.rank-(\d{5})" + re.escape(self.merged.suffix) + "$")
        found = sorted(int(m.group(1)) for p in self.merged.parent.glob("*") if (m := pattern.match(p.name)))
        if cfg.resume:
            worlds = {written_world(self.shards[i]) for i in found if i < self.r.world} - {None}
            if self.merged.is_file() and not found:
                worlds.add(written_world(self.merged) or 1)
            if any(i >= self.r.world for i in found) or worlds - {self.r.world}:
                was = max(worlds | {max(found, default=-1) + 1})
                raise every_rank(ConfigError(
                    f"resume: {self.merged.parent} was written by {was} process(es) and this run has "
                    f"{self.r.world}; resume with {was} (torchrun --nproc_per_node, or tasks), or start a new run"
                ))
            return
        if cfg.output.overwrite:
            return
        taken = ([self.merged] if self.merged.exists() else []) + [self.shards[i] for i in found if i < self.r.world]
        if taken:
            raise every_rank(ConfigError(f"output.path: {', '.join(str(p) for p in taken[:3])} exist(s); set "
                                         f"output.overwrite=true, resume=true, or choose another path"))

    def adjust(self, p: Any) -> None:
        """Narrow a prepared run to this rank's block of batches (prepare() applied data.limit)."""
        block = shard_batches(p.n_batches, self.r.world, self.r.rank)
        p.settings.batches = p.batches[block.start : block.stop]
        # one bar, on rank 0, labelled with its own block; the other ranks log their ends as lines
        p.settings.progress = p.settings.progress and self.r.rank == 0
        p.settings.label = f"hookrun rank 0/{self.r.world}, batches {block.start}-{block.stop - 1}"
        p.attrs.update(rank=self.r.rank, world_size=self.r.world, launcher=self.r.launcher,
                       first_batch=p.batches.start, last_batch=p.batches.stop)

    # -- at the end (rank 0) ---------------------------------------------------------------------
    def merge(self, store: Any, stopped: bool) -> View:
        statuses = self.wait(store, GRACE_SECONDS if stopped else None)
        waiting = [f"rank {r}" for r, s in enumerate(statuses) if s is None]
        if waiting:
            log.warning("%s did not finish; the view marks their shards incomplete", ", ".join(waiting))
        view = self.combine({"config": to_yaml(self.cfg), "launcher": self.r.launcher})
        log.info("merged %d shard(s) into %s: %d samples, %s, in %.3f s", self.r.world, self.merged, view.samples,
                 view.status, view.seconds)
        return view

    def combine(self, attrs: dict) -> View:
        """The shards as one run: the merged view over the shard files."""
        return build_view(self.merged, self.shards, attrs)

    def wait(self, store: Any, limit: float | None) -> list[str | None]:
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

    def __init__(self, store: Any, rank: int) -> None:
        self.store, self.key = store, f"beat/{rank}"
        self.stopped = threading.Event()
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


def check_not_a_view(path: Path) -> None:
    """A one-process resume of a merged view would read a view as a run: refuse it, saying why."""
    world = written_world(path) if path.is_file() else None
    if world is not None and world > 1:
        raise ConfigError(f"resume: {path} is the merged view of a {world}-process run; resume it with the same "
                          f"launcher and {world} processes (torchrun --nproc_per_node={world}, or {world} tasks)")


def written_world(path: Path) -> int | None:
    """The world size a shard or view was written with (None: unreadable or not a ranked file)."""
    try:
        with LocalSource(path, wait=False, rows=False) as source:
            value = source.file.attrs.get("world_size")
            return int(value) if value is not None else None
    except HookrunError:
        return None


