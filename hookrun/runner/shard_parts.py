"""One rank of a data-parallel run whose output is an object store: its parts, and the top manifest.

    result = PartsShardRun(cfg, detect()).run(body)   # body(cfg_of_this_rank, adjust) runs the shard

As ShardRun (runner/shards.py) for a local file, with the object store in place of the shard files
and the merged view: before any batch every rank checks the config and the store
(store/ranked.py: reachable, not taken, the same number of processes on resume), and waits until
all have; rank 0 writes the top manifest (running). Each rank writes its contiguous block of
batches as parts under `rank-RRRRR/` with its own manifest, exactly as one process writes a run
(store/parts.py, staged in `<output.staging>/<name>.rank-RRRRR.parts`); when every rank has ended,
rank 0 writes the top manifest again, complete or naming the ranks that are not. `resume=true`
resumes each rank from its own manifest and staging folder: a complete rank does nothing.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from hookrun.config.schema import HookrunConfig, to_yaml
from hookrun.errors import ConfigError
from hookrun.runner.ranks import Ranks, every_rank, rank_device
from hookrun.runner.shards import ShardRun
from hookrun.store.merge import View
from hookrun.store.parts import Output
from hookrun.store.ranked import begin_ranks, check_ranked_output, finish_ranks


class PartsShardRun(ShardRun):
    def __init__(self, cfg: HookrunConfig, ranks: Ranks) -> None:  # (no shard files: ShardRun's paths are local)
        self.cfg, self.r = cfg, ranks
        try:
            self.out = Output.of(cfg.output.path, cfg.output.staging)
        except ConfigError as exc:
            raise every_rank(exc) from None
        self.merged = self.out.url  # what RunResult.path says: the URL

    def output(self) -> Output:
        """This rank's output: its part names, manifest and staging folder."""
        return dataclasses.replace(self.out, rank=self.r.rank)

    def rendezvous(self) -> tuple[str, Path]:
        return f"{self.out.url}/", self.out.staging  # (the staging folder: the run folder by default)

    def check_files(self) -> None:
        check_ranked_output(self.out.url, self.r.world, self.cfg.output.overwrite, self.cfg.resume)

    def check_all(self, store: Any) -> None:
        super().check_all(store)
        if self.r.rank == 0 and not self.cfg.dry_run:
            begin_ranks(self.out.url, self.r.world, self.run_attrs(), self.cfg.resume)

    def rank_cfg(self) -> HookrunConfig:
        return dataclasses.replace(self.cfg, device=rank_device(self.cfg.device, self.r.local_rank))

    def adjust(self, p: Any) -> None:
        super().adjust(p)
        p.out = self.output()

    def run_attrs(self) -> dict:
        return {"config": to_yaml(self.cfg), "launcher": self.r.launcher, "world_size": self.r.world}

    def combine(self, attrs: dict) -> View:
        started = time.perf_counter()
        state = finish_ranks(self.out.url, self.r.world, {**attrs, **self.run_attrs()})
        return View(self.out.url, state.status, state.incomplete, state.samples, time.perf_counter() - started)

    def not_complete(self) -> str:
        return f"{self.out.url} holds the parts of {self.r.world} ranks and these are not complete"
