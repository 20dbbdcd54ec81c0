"""The writer thread: takes step records off the loop's thread through a bounded queue.

    with BackgroundWriter(store, max_pending=2) as writer:
        writer.put(record)   # blocks while `max_pending` records wait: memory stays bounded

One thread owns the HDF5 file (h5py serialises its calls but releases the GIL while it writes, so
the write overlaps the next forward pass). An error in the thread surfaces at the next put/close.

Host transfer: move a step's device snapshots into reused host buffers without stalling.

    transfer = HostTransfer(torch.device("cuda"))
    ticket = transfer.submit(captures)   # copies queued on a side stream, returns at once
    ...                                   # (writer thread) ticket.wait(); write; ticket.release()

On CUDA each snapshot is copied with `non_blocking=True` on a side stream into a pinned host
buffer taken from a pool keyed by (shape, dtype); an event recorded after the copies is what the
writer waits on, and the writer hands the buffers back once they are on disk. The number of
buffers is bounded by the writer queue, so memory stays flat. On the CPU the snapshot already is
the host copy and nothing happens, unless `always_pool=True` (used by the tests to run the same
pooling logic without a GPU).

Checksums of stored rows (DigestLog, below): each append of a capture's rows (one batch), on this
thread, adds one row to the run's /checksums table: the capture's number (`ds.attrs["digest"] ==
"/checksums:3"`), its row count after the batch and the xxh3-64 digest of those rows' bytes as stored
(about 15 GB/s: docs/benchmarks.md), written at each flush. A reader recomputes it from the rows
alone, so a damaged block is named, never read as data (store/verify.py: resume, `inspect --verify`).
Each `<role>.index` and every /samples dataset are digested too, read back as stored (add_rows).
"""

from __future__ import annotations

import queue
import threading
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import h5py
import numpy as np
import torch
import xxhash

from hookrun.errors import HookrunError, RunError
from hookrun.store import DIGEST_CHUNK, capped
from hookrun.store.records import Capture, RunStore, StepRecord

_STOP = object()


def write_error(exc: Exception, store: RunStore, step: int) -> RunError:
    from hookrun.error_words import (
        write_reason,  # (an error's words: loaded only when a write fails)
    )

    reason = write_reason(exc)
    return RunError(f"writing {store.path} failed at batch {step}: {reason}; the file keeps every batch "
                    f"flushed before it ({getattr(store, 'kept_steps', store.steps)} batches)")


class BackgroundWriter:
    def __init__(self, store: RunStore, max_pending: int = 2) -> None:
        self.store = store
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, max_pending))
        self._error: BaseException | None = None
        self._abort = False  # a second signal: skip what waits in the queue
        self._stop_sent = False
        self._done = threading.Event()  # set by the thread as it ends (drain: not Thread.join)
        self._thread = threading.Thread(target=self._work, name="hookrun-writer", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        try:
            self._loop()
        finally:
            self._done.set()

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            try:
                if self._error is None and not self._abort:
                    if item.ticket is not None:
                        item.ticket.wait()  # the device-to-host copies of this step are done
                    self.store.write(item)
            except HookrunError as exc:  # surfaces on the loop's thread
                self._error = exc
            except Exception as exc:  # h5py raises OSError or RuntimeError for a failed write
                self._error = write_error(exc, self.store, item.step)
                self._error.__cause__ = exc
            finally:
                if item.ticket is not None:
                    item.ticket.release()  # host buffers go back to the pool

    def put(self, record: StepRecord) -> None:
        self.raise_error()
        self._queue.put(record)

    def raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    def drain(self) -> None:
        """Wait until every queued record is written, then raise any writer error. A
        KeyboardInterrupt meanwhile (a second Ctrl-C) drops the records still queued, but the one
        being written is finished and the thread has ended before it is raised again: the store
        is never closed under a running writer, so its counts are those of the rows it holds.
        (The wait is on an event the thread sets, not Thread.join: on Python 3.11 a join that a
        KeyboardInterrupt interrupts marks the thread as ended while it still writes.)"""
        interrupted: BaseException | None = None
        while not self._done.is_set():
            try:
                if not self._stop_sent:
                    self._queue.put(_STOP)
                    self._stop_sent = True
                self._done.wait()
            except KeyboardInterrupt as exc:
                self._abort, interrupted = True, exc
        if interrupted is not None:
            raise interrupted
        self.raise_error()

    def __enter__(self) -> BackgroundWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.drain()
        else:  # still write what the loop finished before the error; keep the first error
            self._abort = self._abort or issubclass(exc_type, KeyboardInterrupt)  # stopping at once
            try:
                self.drain()
            except BaseException:
                pass


class _Ready:
    """The event of a transfer that needs no waiting (CPU)."""

    def synchronize(self) -> None:
        pass


@dataclass
class Ticket:
    """One step's transfer: wait() before reading the captures, release() after writing them."""

    event: object = field(default_factory=_Ready)
    buffers: list[torch.Tensor] = field(default_factory=list)
    give_back: Callable[[list[torch.Tensor]], None] | None = None

    def wait(self) -> None:
        self.event.synchronize()

    def release(self) -> None:
        if self.give_back is not None and self.buffers:
            self.give_back(self.buffers)
            self.buffers = []


class HostTransfer:
    def __init__(self, device: torch.device, always_pool: bool = False) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.pooling = self.cuda or always_pool
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self._free: dict[tuple, list[torch.Tensor]] = defaultdict(list)
        self._lock = threading.Lock()
        self.allocated = 0  # buffers ever made (the pool's size)

    def submit(self, captures: list[Capture]) -> Ticket:
        if not self.pooling or not captures:
            return Ticket()
        buffers: list[torch.Tensor] = []
        if self.cuda:
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self.stream):
                for cap in captures:
                    # ragged rows, and values a kind computed on the host (attribution's), need no copy
                    if not cap.ragged and cap.value.is_cuda:
                        self._move(cap, buffers)
                event = torch.cuda.Event()
                event.record(self.stream)
            return Ticket(event, buffers, self._give_back)
        for cap in captures:
            if not cap.ragged:
                self._move(cap, buffers)
        return Ticket(_Ready(), buffers, self._give_back)

    def _move(self, cap: Capture, buffers: list[torch.Tensor]) -> None:
        src = cap.value
        buf = self._take(tuple(src.shape), src.dtype)
        buf.copy_(src, non_blocking=self.cuda)
        if self.cuda:
            src.record_stream(self.stream)  # the caching allocator keeps src until the copy is done
        cap.value = buf
        buffers.append(buf)

    def _take(self, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        with self._lock:
            free = self._free[(shape, dtype)]
            if free:
                return free.pop()
            self.allocated += 1
        return torch.empty(shape, dtype=dtype, pin_memory=self.cuda)

    def _give_back(self, buffers: list[torch.Tensor]) -> None:
        with self._lock:
            for buf in buffers:
                self._free[(tuple(buf.shape), buf.dtype)].append(buf)


# -- the checksums of stored rows ------------------------------------------------------------------
TABLE = "/checksums"


class DigestLog:
    """The run's /checksums table as a store writes it: rows kept in memory between flushes, one
    HDF5 append per flush (a table per capture held a chunk cache each: 600 captures grew memory
    past the load test's bound)."""

    def __init__(self, file: h5py.File, steps: int | None = None) -> None:
        self.file, self.steps = file, steps  # steps: the run's batches, where known (no chunk holds more rows)
        self.pending: list[tuple[int, int, int]] = []  # (dataset's number, rows after the batch, xxh3)
        self.table: h5py.Dataset | None = None
        self.ids: dict[str, int] = {}  # datasets numbered by id_of (the sample table's)
        self.next_id = 0

    def new_id(self, ds: h5py.Dataset) -> int:
        """The next number in the table, named in the dataset's `digest` attribute."""
        k, self.next_id = self.next_id, self.next_id + 1
        ds.attrs["digest"] = f"{TABLE}:{k}"
        return k

    def id_of(self, ds: h5py.Dataset) -> int:
        """The dataset's number, given at its first call."""
        if ds.name not in self.ids:
            self.ids[ds.name] = self.new_id(ds)
        return self.ids[ds.name]

    def add(self, k: int, rows_after: int, value: int) -> None:
        self.pending.append((k, rows_after, value))

    def add_rows(self, ds: h5py.Dataset, start: int) -> None:
        """The digest of `ds`'s rows from `start` to its end (what a batch appended; a new dataset's
        backfill too), read back as stored; nothing where no row was appended."""
        if ds.shape[0] > start:
            self.add(self.id_of(ds), ds.shape[0], digest_stored(ds, ds[start:]))

    def mark(self) -> tuple[int, int]:
        return len(self.pending), self.next_id

    def write(self) -> None:
        """The digests of the batches since the last flush, appended to the table."""
        if not self.pending:
            return
        if self.table is None:
            rows = capped(DIGEST_CHUNK, self.steps * len(self.pending) if self.steps else None)  # the first batch's x steps
            self.table = self.file.create_dataset(TABLE, (0, 3), "uint64", maxshape=(None, 3), chunks=(rows, 3),
                                                  rdcc_nbytes=64 << 10, rdcc_w0=1.0)
        rows = np.array(self.pending, dtype=np.uint64)
        n = self.table.shape[0]
        self.table.resize(n + len(rows), axis=0)
        self.table[n:] = rows
        self.pending.clear()


def digest(rows: np.ndarray) -> int:
    """The xxh3-64 digest of rows as they are stored (C order, the dataset's dtype)."""
    flat = np.ascontiguousarray(rows).reshape(-1).view(np.uint8)  # also for a dim of size 0
    return xxhash.xxh3_64_intdigest(flat)


def digest_ragged(rows: list[np.ndarray]) -> int:
    """The xxh3-64 digest of variable-length rows (each flattened, in the dataset's base dtype):
    their lengths (int64), then their values, so rows moved between samples do not match."""
    h = xxhash.xxh3_64(np.array([r.size for r in rows], dtype=np.int64).tobytes())
    for r in rows:
        h.update(np.ascontiguousarray(r).reshape(-1).view(np.uint8))
    return h.intdigest()


def digest_stored(ds: h5py.Dataset, rows: np.ndarray) -> int:
    """The digest of rows read from `ds` (or as they are written to it): fixed-size rows as they are,
    variable-length ones by digest_ragged (texts as their UTF-8 bytes)."""
    base = h5py.check_vlen_dtype(ds.dtype)
    if base is None:
        return digest(rows)
    if base in (str, bytes):
        return digest_ragged([np.frombuffer(v.encode() if isinstance(v, str) else bytes(v), np.uint8)
                              for v in rows.reshape(-1)])
    return digest_ragged(list(rows))
