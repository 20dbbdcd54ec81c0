"""Training on a cache: a capture's rows in shuffled batches of torch tensors, without loading the file.

    rows = open_run("captures.h5").loader(("blocks.3", "output"), batch_size=4096, seed=0)
    for epoch in range(3): rows.set_epoch(epoch); [train_step(x) for x in rows]

How it shuffles (exact: every row once per epoch). The rows are cut into blocks of about one HDF5
chunk (`block_rows`, 1 MiB by default); the blocks are put in a random order that depends on
(seed, epoch) only, and that block sequence is the epoch's stream of rows. The stream is cut into
windows of `buffer_bytes` (a multiple of `batch_size` rows): each window is read with one
contiguous read per block (chunk-aligned, so the disk sees ~1 MiB reads) on a reader thread, while
the window before it is served: its rows are permuted (seed, epoch, rank, window) and handed out
batch by batch. Memory: two windows plus one batch per process (per DataLoader worker); shuffled, the
batches are copies, so the two window buffers are read into again, and kept for the next epoch. A
batch mixes rows of about buffer_bytes / 1 MiB random blocks of
the whole file; with the whole file in one window the shuffle is a uniform permutation.
`shuffle=False` reads the windows in file order with one read each.

Splits: rank r of `world_size` takes the r-th contiguous part of the epoch's stream (sizes differ by
at most one row), and DataLoader worker w of n takes windows w, w+n, ... of its rank's part. A
window's batches do not depend on the number of workers, only the order the DataLoader hands them
out. A merged view (HDF5 virtual datasets over several files) is read like any dataset, after
checking that every source file is there: HDF5 reads a missing source as zeros, without an error.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import h5py
import numpy as np
import torch

from hookrun.analysis.batching import BLOCK_BYTES, BUFFER_BYTES, RowBatches
from hookrun.errors import ConfigError
from hookrun.store.view_sources import check_sources

IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024


class RowLoader(RowBatches):
    """Batches of rows of one or more aligned capture datasets of an HDF5 file, as torch tensors.

    Made by Run.loader; iterate it directly, or hand it to torch.utils.data.DataLoader(rows,
    batch_size=None, num_workers=N). Call set_epoch(e) before each epoch for a new order.
    """

    def __init__(self, path: str | os.PathLike, datasets: list[str], *, batch_size: int = 4096, shuffle: bool = True,
                 seed: int = 0, drop_last: bool = False, concat: bool = True, rank: int = 0, world_size: int = 1,
                 buffer_bytes: int = BUFFER_BYTES, block_rows: int | None = None, dtype: torch.dtype | None = None,
                 with_rows: bool = False) -> None:
        super().__init__(datasets, batch_size=batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last, concat=concat,
                         rank=rank, world_size=world_size, block_rows=block_rows, dtype=dtype, with_rows=with_rows)
        self.path = str(path)
        with h5py.File(self.path, "r", locking=False) as f:
            dss = [f[name] for name in self.datasets]
            rows = _common_rows(f, dss)
            for ds in dss:
                if ds.is_virtual:
                    check_sources(f, Path(self.path), [ds])
            row_bytes = sum(int(np.prod(ds.shape[1:], dtype=np.int64)) * ds.dtype.itemsize for ds in dss)
            chunks = dss[0].chunks
            if concat and len(dss) > 1:
                _check_concat(dss)
        self.block_rows = block_rows or (chunks[0] if chunks else max(1, BLOCK_BYTES // max(1, row_bytes)))
        self.split(rows, row_bytes, buffer_bytes)

    def block_order(self) -> np.ndarray:
        """The blocks of the file in this epoch's order (the same on every rank)."""
        n_blocks = math.ceil(self.rows / self.block_rows)
        if not self.shuffle:
            return np.arange(n_blocks)
        return np.random.default_rng([self.seed, self.epoch]).permutation(n_blocks)

    def __iter__(self) -> Iterator:
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        order = self.block_order()
        sizes = np.minimum(self.block_rows, self.rows - order * self.block_rows)
        ends = np.cumsum(sizes)
        n = self.hi - self.lo
        usable = n - n % self.batch_size if self.drop_last else n
        mine = list(range(0, usable, self.window_rows))[worker::workers]
        spares = self.take_spares()
        # os.close bound now: an iterator still open at interpreter exit is closed when the module's `os` is None
        fd, close = os.open(self.path, os.O_RDONLY), os.close
        try:
            with h5py.File(self.path, "r", locking=False, rdcc_nbytes=0) as f, ThreadPoolExecutor(1) as reader:
                dss = [_Source(f[name], fd) for name in self.datasets]
                yield from self._serve(reader, dss, order, sizes, ends, mine, usable, spares)
        finally:
            close(fd)
        self.keep_spares(spares)  # no read is in flight now: the next epoch reads into them

    def _serve(self, reader: ThreadPoolExecutor, dss: list, order: np.ndarray, sizes: np.ndarray, ends: np.ndarray,
               mine: list[int], usable: int, spares: list[list[np.ndarray]]) -> Iterator:
        """Serves window k while window k+1 is read. Shuffled, each batch is a copy (a gather), so a
        served window's buffers are read into again (`spares`): no new 128 MiB to fault in and zero."""
        spare = lambda: spares.pop() if spares else None  # noqa: E731
        pending = reader.submit(self._window, dss, order, sizes, ends, mine[0], usable, spare()) if mine else None
        for k in range(len(mine)):
            arrays, rows, perm = pending.result()
            if k + 1 < len(mine):  # the next window is read while this one is served
                pending = reader.submit(self._window, dss, order, sizes, ends, mine[k + 1], usable, spare())
            yield from self.batches(arrays, rows, perm, len(rows))
            self.served(spares, arrays)

    def _window(self, dss: list[_Source], order: np.ndarray, sizes: np.ndarray, ends: np.ndarray, w: int,
                usable: int, spare: list[np.ndarray] | None = None) -> tuple[list[np.ndarray], np.ndarray, np.ndarray | None]:
        """Window `w` of this rank's part: its arrays, their rows' numbers in the file, the permutation.
        `spare`: buffers to read into (a served window's: no new 128 MiB to fault in and zero)."""
        a, b = self.lo + w, self.lo + min(w + self.window_rows, usable)
        segs = _segments(order, sizes, ends, self.block_rows, a, b)
        rows = np.concatenate([np.arange(s, e) for s, e in segs])
        perm = np.random.default_rng([self.seed, self.epoch, self.rank, w]).permutation(b - a) if self.shuffle else None
        return [ds.read(segs, b - a, buf) for ds, buf in zip(dss, spare or [None] * len(dss), strict=True)], rows, perm


def _segments(order: np.ndarray, sizes: np.ndarray, ends: np.ndarray, block: int, a: int, b: int) -> list[tuple[int, int]]:
    """The file row ranges that hold stream rows [a, b), in stream order, adjacent ranges merged."""
    starts = ends - sizes
    segs: list[list[int]] = []
    for i in range(int(np.searchsorted(ends, a, "right")), int(np.searchsorted(starts, b, "left"))):
        first = int(order[i]) * block
        s, e = first + max(0, a - int(starts[i])), first + min(int(sizes[i]), b - int(starts[i]))
        if segs and segs[-1][1] == s:
            segs[-1][1] = e
        else:
            segs.append([s, e])
    return [(s, e) for s, e in segs]


class _Source:
    """Reads a window of rows of one dataset (the batches are then gathered from it). An uncompressed
    chunked dataset (what hookrun writes) is read with one pread per chunk straight into the buffer,
    as fast as one large read; HDF5's own read of one chunk at a time costs 2-5x that. (Scattering
    each row to its permuted place with preadv, to save the gather, is slower: 1 KiB iovecs.)
    Anything else (compressed, a merged view) is read through h5py."""

    def __init__(self, ds: h5py.Dataset, fd: int) -> None:
        self.ds, self.fd = ds, fd
        self.row_bytes = int(np.prod(ds.shape[1:], dtype=np.int64)) * ds.dtype.itemsize
        self.chunk = ds.chunks[0] if ds.chunks else 0
        self.offsets: np.ndarray | None = None  # file offset of each chunk, -1 where none is stored
        plain = (not ds.is_virtual and ds.chunks is not None and tuple(ds.chunks[1:]) == ds.shape[1:] and ds.dtype.isnative
                 and ds.id.get_create_plist().get_nfilters() == 0 and hasattr(ds.id, "chunk_iter") and self.row_bytes > 0
                 and hasattr(os, "preadv"))
        if plain:
            self.offsets = np.full(math.ceil(ds.shape[0] / self.chunk), -1, dtype=np.int64)

            def note(info: object) -> None:
                if info.filter_mask == 0:
                    self.offsets[info.chunk_offset[0] // self.chunk] = info.byte_offset

            ds.id.chunk_iter(note)

    def read(self, segs: list[tuple[int, int]], n: int, buf: np.ndarray | None = None) -> np.ndarray:
        """The rows of the file ranges `segs`, one after the other (into `buf` if it has room)."""
        if buf is not None and len(buf) >= n:
            out = buf[:n]
        else:
            out = np.empty((n, *self.ds.shape[1:]), dtype=self.ds.dtype)
        pieces = self._pieces(segs) if self.offsets is not None else None
        if pieces is None:
            at = 0
            for s, e in segs:
                self.ds.read_direct(out, np.s_[s:e], np.s_[at : at + e - s])
                at += e - s
        else:
            flat, rb = memoryview(out.reshape(-1).view(np.uint8)), self.row_bytes
            for offset, at, rows in pieces:
                self._preadv([flat[at * rb : (at + rows) * rb]], offset, rows * rb)
        return out

    def _preadv(self, views: list[memoryview], offset: int, size: int) -> None:
        if os.preadv(self.fd, views, offset) != size:
            raise OSError(f"{self.ds.file.filename}: short read in {self.ds.name} (is the file being truncated?)")

    def _pieces(self, segs: list[tuple[int, int]]) -> list[tuple[int, int, int]] | None:
        """(file offset, first stream row, rows) of each chunk-sized piece; None if a chunk is not stored."""
        c, rb, pieces, at = self.chunk, self.row_bytes, [], 0
        for s, e in segs:
            for first in range(s - s % c, e, c):
                offset = int(self.offsets[first // c])
                if offset < 0:
                    return None
                lo, hi = max(s, first), min(e, first + c)
                pieces.append((offset + (lo - first) * rb, at + lo - s, hi - lo))
            at += e - s
        return pieces


def _common_rows(f: h5py.File, dss: list[h5py.Dataset]) -> int:
    """The rows every dataset holds, the same for all: captures read together must align row by row."""
    counts = {ds.name: ds.shape[0] for ds in dss}
    if len(set(counts.values())) > 1:
        raise ConfigError("loader: captures read together need the same rows; these differ: "
                          + ", ".join(f"{k} has {v}" for k, v in counts.items()))
    indexed = [ds for ds in dss if ds.attrs.get("index")]
    if len(dss) > 1 and indexed:
        first = _index(dss[0])
        for ds in dss[1:]:
            if not np.array_equal(first, _index(ds)):
                raise ConfigError(f"loader: {dss[0].name} and {ds.name} have the same number of rows but not the "
                                  "same samples (one skipped batches); read them one at a time")
    return next(iter(counts.values()))


def _index(ds: h5py.Dataset) -> np.ndarray | None:
    return ds.parent[ds.attrs["index"]][:] if ds.attrs.get("index") else None


def _check_concat(dss: list[h5py.Dataset]) -> None:
    shapes = {ds.name: ds.shape[1:] for ds in dss}
    if any(len(s) == 0 for s in shapes.values()) or len({(s[1:]) for s in shapes.values()}) > 1:
        raise ConfigError("loader: concat=True joins captures along their first feature axis, so the rest of their "
                          "row shapes must agree; these do not: " + ", ".join(f"{k} {v}" for k, v in shapes.items())
                          + " (pass concat=False to get one tensor per capture)")
