"""Many ranks on a local file, and a one-process resume beside their files: loaded only then.

    layout = LocalFile(Path("captures.h5")).shards(cfg, ranks)   # LocalShards: what output/shards.py's ShardRun drives

Each rank writes its own `captures.rank-NNNNN.h5` and rank 0 writes `captures.h5`, a view over them
(store/merge.py). A resume keeps the world size the files were written with.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hookrun.config.schema import HookrunConfig, replaced
from hookrun.errors import ConfigError, HookrunError
from hookrun.output.process import every_rank
from hookrun.output.ranks import rank_device, shard_path

if TYPE_CHECKING:
    from hookrun.output.process import Ranks
    from hookrun.store.merge import View

log = logging.getLogger("hookrun")


class LocalShards:
    """Many ranks on a local file: a shard file per rank, and rank 0's merged view."""

    def __init__(self, cfg: HookrunConfig, ranks: Ranks, dest: Any) -> None:
        """`dest`: output.path's LocalFile (output/__init__.py, which imports this module)."""
        self.cfg, self.r = cfg, ranks
        self.merged = dest.path
        self.shards = [shard_path(self.merged, i) for i in range(ranks.world)]
        self.mine = type(dest)(self.shards[ranks.rank], shard=True)

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


def check_one_process(path: Path) -> None:
    """A one-process resume of `path`: not a merged view, and no many-process run's shards beside it."""
    check_not_a_view(path)
    found = shard_ranks(path)
    if found:  # a many-process run's shards: one process would ignore them and start again beside them
        worlds = {written_world(shard_path(path, i)) for i in found} - {None}
        raise other_world(path.parent, max(worlds | {found[-1] + 1}), 1)


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
