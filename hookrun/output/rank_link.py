"""A kind's channel between the ranks at the end of their shards: each rank but 0 hands its statistics
(a file in the shared run folder) to rank 0, which merges them into the one-process result.

    link = RankLink(store, ranks, folder, key)      # ShardRun hands it to the kind (RunKind.join_ranks)
    RankLink.require(link, world, "probe", rank)    # prepare_run: many ranks need a link (one ConfigError line);
                                                    # every rank sees rank 0's mark in the folder (see_folder),
                                                    # rank 0 says it will gather (want: its shard is not done)
    link.hand_over("probe", save, should_stop)      # ranks 1..N-1: if wanted, save(tmp), renamed to path(), sent
    link.gather("probe", merge, should_stop)        # rank 0: merge(path) of each rank in rank order, path removed
    link.rejoin("probe", rebuild, save, should_stop)   # a resumed rank whose shard was complete: rebuilt, handed over
    link.discard("probe")                           # rank 0, in close(): what a failed run's ranks left

Used by kinds whose result needs every row of the data (probe, similarity): ShardRun splits the batches
into contiguous blocks, so rank order is batch order. A kind keeps only its save (its statistics to a
path) and its merge (them from a path). rank 0 waits for each rank while the rank's heartbeat
moves (ShardRun's Heartbeat bumps `beat/RANK`); a rank that ended without sending, or fell silent, is
one RunError line. The files live in `folder`: the run folder (a local output's; output.staging for an
object-store output, output/objects/destination.py), which every rank must see (a shared file system,
as for submitit's FileStore): checked before any batch (`see_folder`: every rank reads a mark rank
0 wrote there, or every rank stops in one ConfigError line); a part rank 0 cannot find at the end is
one RunError line.

Resume (`resume=true`) with many ranks: rank 0 gathers whenever it runs, so its prepare_run says so
(`want`), and a rank hands over only once rank 0 wants its part and has not ended (`wanted`; a resumed
rank 0 whose shard was complete has its result written and never wants). Every hand-over rebuilds the
part from the rank's rows (a part left on disk by a killed launch is replaced, never trusted), also
where the rank's shard is complete (RunKind.rejoin, called by runner/__init__.py instead of "nothing to do").
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.distributed as dist

from hookrun.error_words import refused_write, write_reason
from hookrun.errors import ConfigError, HookrunError, RunError
from hookrun.output.process import Ranks, every_rank

log = logging.getLogger("hookrun")
POLL_SECONDS = 0.05
SILENT_SECONDS = float(os.environ.get("HOOKRUN_RANK_TIMEOUT", "120"))  # (as ShardRun's wait)


class RankLink:
    def __init__(self, store: dist.Store, ranks: Ranks, folder: Path, key: str) -> None:
        self.store, self.r, self.folder = store, ranks, Path(folder)
        self.tag = hashlib.sha1(key.encode()).hexdigest()[:12]  # one output's files, whatever the job
        self.rank, self.world = ranks.rank, ranks.world

    @staticmethod
    def require(link: Any, world: int, kind: str, rank: int | None = None,
                should_stop: Callable[[], bool] = lambda: False) -> None:
        """A handing-over kind's prepare_run, before any batch: many ranks need the link. `kind` names the
        run's kind ("probe"); given this process's `rank`, every rank shows it sees the folder the rows
        are handed over in, and rank 0 says it will gather (`see_folder`)."""
        if world > 1 and link is None:
            raise ConfigError(f"{kind} over {world} ranks: no channel between the ranks; run it as one process")
        if world > 1 and rank is not None:
            link.see_folder(kind, should_stop)

    def see_folder(self, name: str, should_stop: Callable[[], bool] = lambda: False) -> None:
        """Before any batch: the hand-over folder is one folder every rank sees. Rank 0 writes a mark of
        this launch there and says it gathers (`want`, the mark's token); ranks 1..N-1 look for the mark
        and answer; rank 0 waits for every answer (a rank that ended instead gives none). A rank that
        does not see it stops every rank, before their batches, in one ConfigError line."""
        if self.rank == 0:
            token = secrets.token_hex(8)
            self.folder.mkdir(parents=True, exist_ok=True)
            self.mark(name, token).write_text(token)
            self.want(name, token)
            for r in range(1, self.world):
                key, done = f"kind/{name}/sees/{r}", f"done/{r}"
                self.wait_for(r, lambda key=key, done=done: self.store.check([key]) or self.store.check([done]),
                              should_stop, f"{name}: stopped while waiting for the other ranks to start",
                              f"{name}: rank {r} has been silent for {{:.0f}} s before its batches: taken for dead")
                problem = self.store.get(key).decode() if self.store.check([key]) else ""
                if problem:
                    raise every_rank(ConfigError(problem))
        elif self.wanted(name, should_stop):
            token = self.store.get(f"kind/{name}/want").decode()
            mark, problem = self.mark(name, token), ""
            for _ in range(20):  # (a second for a shared file system to show a new file)
                if _reads(mark) == token:
                    break
                time.sleep(POLL_SECONDS)
            else:
                problem = (f"{name}: rank {self.rank} does not see {mark}, which rank 0 wrote before any batch: the "
                           f"ranks hand their rows over in {self.folder} (output.staging for an object-store output), "
                           f"which must be one folder every rank sees (a shared file system)")
            self.store.set(f"kind/{name}/sees/{self.rank}", problem)
            if problem:
                raise every_rank(ConfigError(problem))

    def mark(self, name: str, token: str) -> Path:
        """Rank 0's mark of one launch (a new name each launch: no file system has it cached as absent)."""
        return self.folder / f".hookrun-{name}-{self.tag}.mark-{token}"

    def want(self, name: str, token: str = "") -> None:
        """Rank 0, before its batches: it will gather every rank's part of `name` (see `wanted`)."""
        self.store.set(f"kind/{name}/want", token or "1")

    def wanted(self, name: str, should_stop: Callable[[], bool] = lambda: False) -> bool:
        """Ranks 1..N-1: whether rank 0 gathers `name`, waiting until it says so (True) or has ended (False:
        a resumed rank 0 whose shard was complete, its result written; or one that failed, whose close has
        already discarded the parts)."""
        want, done = f"kind/{name}/want", "done/0"
        self.wait_for(0, lambda: self.store.check([want]) or self.store.check([done]), should_stop,
                      f"{name}: stopped while waiting for rank 0", f"{name}: rank 0 has been silent for {{:.0f}} s "
                      f"before gathering the ranks' rows: taken for dead")
        if not self.store.check([done]):
            return True
        log.info("%s: rank 0 has ended (%s; a resumed rank 0's result was written before): nothing to hand over",
                 name, self.store.get(done).decode())
        return False

    def hand_over(self, name: str, save: Callable[[Path], None], should_stop: Callable[[], bool] = lambda: False) -> bool:
        """Ranks 1..N-1, once rank 0 wants it (`wanted`): `save(tmp)` writes this rank's part of `name` under
        a temporary name, renamed to `path(name, rank)` once whole, then sent to rank 0. False (nothing
        written) where rank 0 ended without gathering."""
        if not self.wanted(name, should_stop):
            return False
        path = self.path(name, self.rank)
        tmp = path.with_name(path.name + ".tmp")
        for old in (tmp, path):  # what a killed launch left (a folder is not replaced by rename)
            shutil.rmtree(old) if old.is_dir() else old.unlink(missing_ok=True)
        try:
            save(tmp)
        except BaseException as exc:  # (a cut-off part is never left: rank 0 would find it later)
            shutil.rmtree(tmp, ignore_errors=True) if tmp.is_dir() else tmp.unlink(missing_ok=True)
            if isinstance(exc, HookrunError) or not refused_write(exc):
                raise
            raise RunError(f"{name}: writing rank {self.rank}'s part for rank 0 to {tmp} failed: {write_reason(exc)}; "
                           f"free some space in {self.folder} and run again with resume=true") from None
        tmp.replace(path)
        self.send(name, str(path))
        return True

    def rejoin(self, name: str, rebuild: Callable[[], None], save: Callable[[Path], None],
               should_stop: Callable[[], bool] = lambda: False) -> bool:
        """Ranks 1..N-1 whose shard was complete, resumed (RunKind.rejoin): where rank 0 still gathers `name`,
        `rebuild()` this rank's part from its kept batches and hand it over. False where rank 0 has ended."""
        if not self.wanted(name, should_stop):
            return False
        rebuild()
        return self.hand_over(name, save, should_stop)

    def wait_for(self, rank: int, ready: Callable[[], bool], should_stop: Callable[[], bool], stopped: str,
                 silent: str) -> None:
        """Poll `ready()` while rank `rank`'s heartbeat moves: RunError(`stopped`) on a stop, RunError
        (`silent`, formatted with the seconds) once the rank has been silent for SILENT_SECONDS."""
        beat: tuple[int, float] | None = None
        while not ready():
            now, count = time.monotonic(), self.store.add(f"beat/{rank}", 0)
            if beat is None or beat[0] != count:
                beat = (count, now)
            elif now - beat[1] > SILENT_SECONDS:
                raise RunError(silent.format(now - beat[1]))
            if should_stop():
                raise RunError(stopped)
            time.sleep(POLL_SECONDS)

    def gather(self, name: str, merge: Callable[[Path], None], should_stop: Callable[[], bool] = lambda: False) -> int:
        """Rank 0, once every other rank has sent its part of `name`: `merge(path)` for each, in rank order,
        each file (or folder) removed once merged. Returns the parts merged (N-1)."""
        paths = self.receive(name, should_stop)
        for r, p in enumerate(paths, start=1):
            path = Path(p)
            if not path.exists():  # written on another machine, in a folder this one does not share
                raise RunError(f"{name}: rank {r} handed over {path}, which rank 0 does not see: the ranks hand their "
                               f"rows over in the run folder (output.staging for an object-store output), which must "
                               f"be one folder every rank sees (a shared file system)")
            merge(path)
            shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
        return len(paths)

    def path(self, name: str, rank: int) -> Path:
        """The file rank `rank` hands to rank 0 for `name` (in the run folder every rank sees)."""
        return self.folder / f".hookrun-{name}-{self.tag}.rank-{rank:05d}"

    def discard(self, name: str) -> None:
        """Rank 0, at the end (also of a failed run): remove what the other ranks left for `name`, and the
        marks (this launch's and a killed one's)."""
        for mark in self.folder.glob(f".hookrun-{name}-{self.tag}.mark-*"):
            mark.unlink(missing_ok=True)
        for r in range(1, self.world):
            for p in (self.path(name, r), self.path(name, r).with_name(self.path(name, r).name + ".tmp")):
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)

    def send(self, name: str, payload: str) -> None:
        """This rank's part of `name` is ready (`payload`: what rank 0 needs to read it)."""
        self.store.set(f"kind/{name}/{self.rank}", payload)

    def receive(self, name: str, should_stop=lambda: False) -> list[str]:
        """Rank 0: the payloads of ranks 1..N-1 for `name`, in rank order, waiting for each (wait_for)."""
        out = []
        for r in range(1, self.world):
            key = f"kind/{name}/{r}"

            def ready(r: int = r, key: str = key) -> bool:
                if self.store.check([key]):
                    return True
                if self.store.check([f"done/{r}"]) and not self.store.check([key]):
                    status = self.store.get(f"done/{r}").decode()
                    raise RunError(f"{name}: rank {r} ended ({status}) without handing over its rows; the result "
                                   f"needs every rank's: run the same command again")
                return False

            self.wait_for(r, ready, should_stop, f"{name}: stopped while waiting for the other ranks' rows",
                          f"{name}: rank {r} has been silent for {{:.0f}} s without handing over its rows: "
                          f"taken for dead")
            out.append(self.store.get(key).decode())
        return out


def _reads(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None
