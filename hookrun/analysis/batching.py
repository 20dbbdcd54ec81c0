"""What both cache loaders share: their settings and checks, the epoch, the rank's rows, the window
size, how a batch becomes tensors, and the window buffers a shuffled pass reads into again.

    class RowLoader(RowBatches):           # analysis/loader.py: one HDF5 file (or a merged view)
    class PartsLoader(RowBatches):         # output/objects/parts_loader.py: the parts of an object store

A subclass sets `rows` (the rows every capture holds) and calls `split()`; it yields `batch(...)`.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from hookrun.errors import ConfigError, parse_bytes

BLOCK_BYTES = 1 << 20  # a block when the dataset is not chunked (a merged view, a part)
BUFFER_BYTES = 128 << 20  # one window; two are held at a time


class RowBatches(torch.utils.data.IterableDataset):
    """Batches of rows of aligned captures, as torch tensors; set_epoch(e) before each epoch."""

    def __init__(self, datasets: list[str], *, batch_size: int, shuffle: bool, seed: int, drop_last: bool, concat: bool,
                 rank: int, world_size: int, block_rows: int | None, dtype: torch.dtype | None, with_rows: bool) -> None:
        if not datasets:
            raise ConfigError("loader: name at least one capture")
        if batch_size < 1:
            raise ConfigError(f"loader: batch_size must be at least 1, got {batch_size}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ConfigError(f"loader: rank must be in 0..world_size-1, got rank={rank} world_size={world_size}")
        if block_rows is not None and block_rows < 1:
            raise ConfigError(f"loader: block_rows must be at least 1, got {block_rows}")
        self.datasets = list(datasets)
        self.batch_size, self.shuffle, self.seed, self.drop_last = batch_size, shuffle, seed, drop_last
        self.concat, self.rank, self.world_size, self.dtype, self.with_rows = concat, rank, world_size, dtype, with_rows
        self.epoch = 0
        self.rows = self.lo = self.hi = self.window_rows = 0
        self._spares: list[list[np.ndarray]] = []  # shuffled: the last pass's window buffers

    def split(self, rows: int, row_bytes: int, buffer_bytes: int) -> None:
        """This rank's share of `rows` (sizes within one row), and windows of whole batches; `buffer_bytes`
        as every size key takes it (bytes, or 64MB, 1GiB: errors.parse_bytes), anything else one line."""
        buffer_bytes = parse_bytes(buffer_bytes, "loader: buffer_bytes")
        self.rows = rows
        self.window_rows = max(1, buffer_bytes // max(1, row_bytes * self.batch_size)) * self.batch_size
        self.lo, self.hi = self.rank * rows // self.world_size, (self.rank + 1) * rows // self.world_size

    def set_epoch(self, epoch: int) -> None:
        """The order of epoch `epoch` (as DistributedSampler.set_epoch): same seed and epoch, same order."""
        self.epoch = epoch

    def __len__(self) -> int:
        n = self.hi - self.lo
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_spares": []}  # a DataLoader worker gets the settings, not the buffers

    def take_spares(self) -> list[list[np.ndarray]]:
        """The window buffers of the last shuffled pass, for this pass (one beside it gets none)."""
        spares, self._spares = self._spares, []
        return spares

    def keep_spares(self, spares: list[list[np.ndarray]]) -> None:
        """Called once no read is in flight: the next pass reads into these (two at most)."""
        self._spares = spares[:2]

    def served(self, spares: list[list[np.ndarray]], arrays: list[np.ndarray]) -> None:
        """A shuffled window is served: its batches were copies (gathers), so its buffers are free."""
        if self.shuffle:
            spares.append([a if a.base is None else a.base for a in arrays])

    def batches(self, arrays: list[np.ndarray], rows: np.ndarray, perm: np.ndarray | None, n: int) -> object:
        """The window's n rows batch by batch: views in order, one gather each (np.take) shuffled."""
        for start in range(0, n, self.batch_size):
            if self.drop_last and n - start < self.batch_size:
                return
            pick = slice(start, start + self.batch_size) if perm is None else perm[start : start + self.batch_size]
            parts = [a[pick] if perm is None else np.take(a, pick, axis=0) for a in arrays]
            yield self.batch(parts, rows[pick] if self.with_rows else None)

    def batch(self, parts: list[np.ndarray], rows: np.ndarray | None) -> object:
        tensors = [torch.from_numpy(np.ascontiguousarray(p)) for p in parts]
        if self.dtype is not None:
            tensors = [t.to(self.dtype) for t in tensors]
        x = (torch.cat(tensors, dim=1) if len(tensors) > 1 else tensors[0]) if self.concat else tuple(tensors)
        return (x, torch.from_numpy(np.ascontiguousarray(rows))) if self.with_rows else x
