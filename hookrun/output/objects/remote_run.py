"""The reader of the object-store scheme: the Run interface over a cache's manifest and parts.

    run = open_run("s3://bucket/cache/captures.h5", cache_dir="/scratch/cache")
    run.captures, run.status, run.config     # from the manifest: nothing is downloaded
    rows = run.loader("res/transformer.h.3/output", batch_size=4096)   # parts streamed, a few at a time
    run["transformer.h.3", "output"][:8]      # fetches every part, then reads a local view over them

The loader fetches parts ahead of use into a bounded cache (parts_loader.py). The summary
without statistics (`inspect --no-stats`) comes from the manifest alone; statistics (`stats`, the
default summary) fetch, read and remove one part at a time. What reads rows at random (indexing,
iter, to_xarray) first fetches every part (verified against the manifest) into `cache_dir` and
opens a local view over them: the same virtual-dataset view as a run of many ranks
(store/merge.py), so it needs room for the whole cache. A cache written by many ranks
(ranked.py) reads as one run: its parts rank by rank, which is batch order.

open_run (analysis/opening.py) wraps each scheme's source in that scheme's reader (store/paths.py):
a local capture file or run folder in a Run (analysis/run_reader.py), an object-store URL's
PartsSource in this RemoteRun.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import h5py
import numpy as np
import yaml

from hookrun.analysis.batching import BUFFER_BYTES
from hookrun.analysis.kind_readers import KindReader, kind_lines, readers_by_attrs
from hookrun.analysis.run_reader import Run
from hookrun.analysis.stats import block_stats, merge_stats
from hookrun.errors import ConfigError
from hookrun.output.objects.fetch import Parts
from hookrun.output.objects.parts_loader import PartsLoader
from hookrun.output.objects.source import PartsSource
from hookrun.store import RowKind, derive_dims
from hookrun.store.listing import CaptureInfo, list_captures

KINDLESS = KindReader("", present=lambda f: False)  # (a reader's defaults: `lines` left as none)


class RemoteRun(Run):
    """Run over a PartsSource: what it is from the manifest, rows from the parts."""

    source: PartsSource

    def __init__(self, source: PartsSource) -> None:
        self.parts = source.parts
        self._stats: dict[str, dict] | None = None
        super().__init__(source)

    def list_captures(self) -> list[CaptureInfo]:
        """From the manifest: nothing is downloaded."""
        captures = []
        for path, c in self.parts.manifest.captures.items():
            rows = sum(e.rows.get(path, 0) for e in self.parts.entries)
            shape = (rows, *c["shape"])
            nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(c["dtype"]).itemsize
            dims = tuple(c.get("dims") or derive_dims(RowKind(c["rows"]), tuple(c["shape"]), module=c["module"],
                                                      role=c["role"]))  # (a manifest written before its dims)
            captures.append(CaptureInfo(c["hook"], c["module"], c["role"], int(c["call"]), c["type"], shape,
                                        c["dtype"], c["rows"], path, nbytes, dims))
        return captures

    # -- what the manifest says ------------------------------------------------------------------
    @property
    def status(self) -> str:
        return self.parts.manifest.status

    @property
    def config(self) -> dict:
        text = self.parts.manifest.attrs.get("config")
        cfg = yaml.safe_load(text) if text else {}
        return cfg if isinstance(cfg, dict) else {}

    @property
    def attrs(self) -> dict:
        a = {k: v for k, v in self.parts.manifest.attrs.items() if k != "config"}
        entries = self.parts.entries
        if self.parts.ranks is not None:  # as the ranks' manifests say now, whatever the top one said
            a["incomplete_ranks"] = ", ".join(self.parts.ranks.incomplete)
        return {**a, "status": self.status, "steps_complete": sum(e.steps[1] - e.steps[0] for e in entries),
                "samples_complete": sum(e.samples for e in entries), "parts": len(entries)}

    def written_attrs(self) -> set[str]:
        return set(self.parts.manifest.attrs) | {"steps_complete", "samples_complete"}

    # -- rows: every part, local ---------------------------------------------------------------
    @property
    def file(self) -> h5py.File:
        """A local view over every part (each fetched and verified first)."""
        if not self.source.opened:
            file = self.source.file
            self.captures = list_captures(file)
        return self.source.file

    def kind_lines(self) -> list[str]:
        """The kind's lines from the parts once fetched; before (inspect --no-stats), a line saying where they are."""
        if self.source.opened:
            return kind_lines(self.source.file)
        return [f"  {r.kind:<9} its results are in the parts: inspect without --no-stats fetches them"
                for r in self._readers_with_lines()]

    def _readers_with_lines(self) -> list[KindReader]:
        """The run's kind readers whose summary lines read the file (a probe's table, an SAE's last step)."""
        return [r for r in self.kind_readers() if r.lines is not KINDLESS.lines]

    def kind_readers(self) -> list[KindReader]:
        """The reader of the kind the manifest names (a run older than the `kind` attribute: the
        readers whose rows the parts hold, once they are fetched; none before)."""
        return readers_by_attrs(self.attrs, lambda: self.source.file if self.source.opened else None)

    def part_files(self, problems: list[str] | None = None) -> Iterator[h5py.File]:
        """Every part in turn, fetched and verified, open (inspect --verify: their own checksums);
        with `problems`, a part that cannot be fetched or fails its MD5 is named there and skipped."""
        return self.source.part_files(problems)

    def loader(self, capture: str | tuple | list, batch_size: int = 4096, shuffle: bool = True, seed: int = 0,
               drop_last: bool = False, *, concat: bool = True, rank: int = 0, world_size: int = 1,
               buffer_bytes: int = BUFFER_BYTES, block_rows: int | None = None, dtype: Any = None,
               with_rows: bool = False, prefetch: int = 2) -> PartsLoader:
        """As Run.loader, over the parts: each is fetched ahead of use (`prefetch` parts ahead, into
        `cache_dir`, and removed once read); the part order and the rows of each window are
        shuffled (parts_loader.py)."""
        names = capture if isinstance(capture, list) else [capture]
        infos = [self.find(*(c if isinstance(c, tuple) else (c,))) for c in names]
        if concat and len(infos) > 1 and len({i.shape[2:] for i in infos}) > 1:
            raise ConfigError("loader: concat=True joins captures along their first feature axis, so the rest of "
                              "their row shapes must agree; these do not: "
                              + ", ".join(f"{i.label} {i.shape[1:]}" for i in infos) + " (pass concat=False)")
        return PartsLoader(self.parts, [i.path for i in infos], batch_size=batch_size, shuffle=shuffle, seed=seed,
                           drop_last=drop_last, concat=concat, rank=rank, world_size=world_size,
                           buffer_bytes=buffer_bytes, block_rows=block_rows, dtype=dtype, with_rows=with_rows,
                           prefetch=prefetch)

    def summary(self, stats: bool = True) -> str:
        """As Run.summary, from the manifest alone; with `stats`, each part is fetched, read and
        removed in turn (the cache holds one part at a time); a run of a kind with summary lines (probe, sae,
        similarity, evaluate) fetches its parts and reads them (was: no line of its results, with statistics too)."""
        if stats and self._readers_with_lines():
            self.file  # noqa: B018 (every part fetched: the kind's lines and the statistics read the local view)
        text = super().summary(stats)
        lines = [ln for ln in text.splitlines() if not ln.startswith("  shards ")]
        n = len(self.parts.entries)
        lines.insert(2, f"  parts     {n} part file(s), {sum(e.bytes for e in self.parts.entries) / 1e6:.1f} MB, "
                        f"listed in {self.path}/manifest.json")
        if self.parts.ranks is not None:
            state = self.parts.ranks
            lines.insert(3, f"  ranks     {len(state.manifests)}, parts under rank-*/, listed in manifest.rank-*.json"
                            + (f"; not complete: {', '.join(state.incomplete)}" if state.incomplete else ""))
        return "\n".join(lines)

    def stats(self, *key: str, call: int = 0) -> dict[str, float]:
        """As Run.stats, one part at a time (nothing is kept but the numbers)."""
        return self.capture_stats(self.find(*key, call=call))

    def capture_stats(self, info: CaptureInfo) -> dict[str, float]:
        if self.source.opened:  # every part is here already
            return super().capture_stats(info)
        if self._stats is None:
            self._stats = part_by_part_stats(self.parts)
        return self._stats.get(info.path, merge_stats([]))

    def close(self) -> None:
        self.source.close()

    def __repr__(self) -> str:
        return f"RemoteRun({str(self.path)!r}, status={self.status!r}, captures={len(self.captures)}, parts={len(self.parts.entries)})"


def part_by_part_stats(parts: Parts) -> dict[str, dict[str, float]]:
    """block_stats of every capture over every part, fetching one part at a time (and removing it)."""
    folder = parts.scratch("stats")
    per_capture: dict[str, list[dict]] = {}
    try:
        for k in range(len(parts.entries)):
            path = parts.fetch(k, folder)
            try:
                with h5py.File(path, "r", locking=False) as f:
                    for c in list_captures(f):
                        ds, rows = f[c.path], parts.entries[k].rows.get(c.path, c.shape[0])
                        values = ds if rows >= ds.shape[0] else ds[:rows]  # (record limit=N over many ranks)
                        per_capture.setdefault(c.path, []).append(block_stats(values))
            finally:
                parts.evict(k, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return {path: merge_stats(blocks) for path, blocks in per_capture.items()}

