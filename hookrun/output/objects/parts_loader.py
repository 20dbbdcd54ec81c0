"""Training on a cache in an object store: shuffled batches of rows, its parts fetched ahead of use.

    rows = open_run("s3://bucket/cache/captures.h5").loader("res/transformer.h.3/output", batch_size=4096)
    for epoch in range(3): rows.set_epoch(epoch); [train_step(x) for x in rows]

How it shuffles (exact: every row once per epoch). The parts are put in a random order that
depends on (seed, epoch) only; within each part the rows are cut into blocks of about 1 MiB
(`block_rows`) put in a random order of their own (seed, epoch, part). That is the epoch's stream
of rows. Rank r of `world_size` takes the r-th contiguous piece of the stream (sizes within one
row). The stream is cut into windows of `buffer_bytes` rows (a multiple of `batch_size`), which run
across part boundaries; each window's rows are permuted (seed, epoch, rank, worker, window) and
handed out batch by batch. A batch thus mixes rows of ~buffer_bytes / 1 MiB random blocks of one
part (two where a window spans a boundary): with parts much larger than the window, a smaller
`output.part_bytes` or a larger `buffer_bytes` mixes more. `shuffle=False` reads in run order.

Fetching: the parts this process needs are downloaded in stream order on a thread, `prefetch`
parts ahead of the one being read, into `cache_dir`, each checked against the manifest's size and
MD5; a part is deleted once read, so the cache holds `prefetch + 1` parts at most per process.
With DataLoader workers, worker w of n takes the rank's part-pieces w, w+n, ... (a part is fetched
by one worker only), each into its own folder.
"""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import h5py
import numpy as np
import torch

from hookrun.analysis.batching import BLOCK_BYTES, BUFFER_BYTES, RowBatches
from hookrun.analysis.loader import _segments, _Source
from hookrun.errors import ConfigError
from hookrun.output.objects.fetch import Parts


class PartsLoader(RowBatches):
    """Batches of rows of one or more aligned captures of a cache in an object store (see above)."""

    def __init__(self, parts: Parts, datasets: list[str], *, batch_size: int = 4096, shuffle: bool = True,
                 seed: int = 0, drop_last: bool = False, concat: bool = True, rank: int = 0, world_size: int = 1,
                 buffer_bytes: int = BUFFER_BYTES, block_rows: int | None = None, dtype: torch.dtype | None = None,
                 with_rows: bool = False, prefetch: int = 2) -> None:
        super().__init__(datasets, batch_size=batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last, concat=concat,
                         rank=rank, world_size=world_size, block_rows=block_rows, dtype=dtype, with_rows=with_rows)
        if prefetch < 0:
            raise ConfigError(f"loader: prefetch must be 0 or more, got {prefetch}")
        self.parts, self.prefetch = parts, prefetch
        per_part = [[e.rows.get(d, 0) for d in self.datasets] for e in parts.entries]
        for e, rows in zip(parts.entries, per_part, strict=True):
            if len(set(rows)) > 1:
                raise ConfigError(f"loader: captures read together need the same rows; in {e.name} they differ: "
                                  + ", ".join(f"{d} has {n}" for d, n in zip(self.datasets, rows, strict=True)))
        self.part_rows = np.array([r[0] for r in per_part], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.part_rows)])  # each part's first row in the run
        schema = [parts.manifest.captures[d] for d in self.datasets]
        row_bytes = sum(int(np.prod(c["shape"], dtype=np.int64)) * np.dtype(c["dtype"]).itemsize for c in schema)
        self.block_rows = block_rows or max(1, BLOCK_BYTES // max(1, row_bytes))
        self.split(int(self.offsets[-1]), row_bytes, buffer_bytes)

    def part_order(self) -> np.ndarray:
        n = len(self.part_rows)
        return np.random.default_rng([self.seed, self.epoch]).permutation(n) if self.shuffle else np.arange(n)

    def block_order(self, k: int) -> np.ndarray:
        n = math.ceil(int(self.part_rows[k]) / self.block_rows)
        return np.random.default_rng([self.seed, self.epoch, int(k)]).permutation(n) if self.shuffle else np.arange(n)

    def pieces(self) -> list[tuple[int, int, int]]:
        """(part, first, stop) in the part's own stream order: this rank's share of the epoch."""
        out, at = [], 0
        for k in self.part_order().tolist():
            n = int(self.part_rows[k])
            a, b = max(self.lo, at), min(self.hi, at + n)
            if a < b:
                out.append((k, a - at, b - at))
            at += n
        return out

    def __iter__(self) -> Iterator:
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        mine = self.pieces()[worker::workers]
        folder = self.parts.scratch(f"stream-r{self.rank}-w{worker}")  # its own: another loader never evicts from it
        spares = self.take_spares()
        rmtree = shutil.rmtree  # (bound now: an iterator still open at interpreter exit ends when `shutil` is None)
        try:
            with ThreadPoolExecutor(1, thread_name_prefix="hookrun-fetch") as fetcher:
                yield from self._serve(mine, folder, fetcher, worker, workers, spares)
        finally:
            rmtree(folder, ignore_errors=True)
        self.keep_spares(spares)

    def _serve(self, mine: list[tuple[int, int, int]], folder: Path, fetcher: ThreadPoolExecutor, worker: int,
               workers: int, spares: list[list[np.ndarray]]) -> Iterator:
        fetching: dict[int, Future] = {}

        def ahead(i: int) -> None:
            for j in range(i, min(len(mine), i + self.prefetch + 1)):
                if j not in fetching:
                    fetching[j] = fetcher.submit(self.parts.fetch, mine[j][0], folder)

        window, filled, w, close = None, 0, 0, os.close  # (os.close bound now, as rmtree in __iter__)
        for i, (k, a, b) in enumerate(mine):
            ahead(i)
            path = fetching.pop(i).result()  # a missing or damaged part raises here, naming it
            order = self.block_order(k)
            sizes = np.minimum(self.block_rows, int(self.part_rows[k]) - order * self.block_rows)
            ends = np.cumsum(sizes)
            fd = os.open(path, os.O_RDONLY)
            try:
                with h5py.File(path, "r", locking=False, rdcc_nbytes=0) as f:
                    sources = [_Source(f[d], fd) for d in self.datasets]
                    while a < b:
                        if window is None:
                            window = self._new_window(sources, spares)
                        take = min(b - a, self.window_rows - filled)
                        segs = _segments(order, sizes, ends, self.block_rows, a, a + take)
                        for buf, src in zip(window[0], sources, strict=True):
                            buf[filled : filled + take] = src.read(segs, take)
                        window[1][filled : filled + take] = self.offsets[k] + np.concatenate([np.arange(s, e) for s, e in segs])
                        filled, a = filled + take, a + take
                        if filled == self.window_rows:
                            yield from self._batches(window, filled, w, worker, workers, spares)
                            window, filled, w = None, 0, w + 1
            finally:
                close(fd)
                self.parts.evict(k, folder)
        if filled:
            yield from self._batches(window, filled, w, worker, workers, spares)

    def _new_window(self, sources: list[_Source], spares: list[list[np.ndarray]]) -> tuple[list[np.ndarray], np.ndarray]:
        arrays = spares.pop() if spares else [np.empty((self.window_rows, *s.ds.shape[1:]), dtype=s.ds.dtype) for s in sources]
        return arrays, np.empty(self.window_rows, dtype=np.int64)

    def _batches(self, window: tuple[list[np.ndarray], np.ndarray], n: int, w: int, worker: int, workers: int,
                 spares: list[list[np.ndarray]]) -> Iterator:
        arrays, rows = [a[:n] for a in window[0]], window[1][:n]
        perm = (np.random.default_rng([self.seed, self.epoch, self.rank, workers, worker, w]).permutation(n)
                if self.shuffle else None)
        yield from self.batches(arrays, rows, perm, n)
        self.served(spares, window[0])
