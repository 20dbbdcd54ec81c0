"""The next batches on their way while the training step runs: a thread reads the cache's rows ahead
(HDF5 or object-store parts, the shuffle) and, with `device: cuda`, puts each batch in pinned host
memory and copies it to the GPU (non_blocking, on a stream of its own) before the step asks for it.

    batches = Prefetch(CacheRows(...), torch.device("cuda"), depth=2)
    x = next(batches)        # on the device, in the source's order; its copy is done before it is used
    batches.close()          # the thread ends; the source is closed

The order, the values and the count are the source's: `Prefetch` only moves the reading (and the
copy) off the step's thread, so a run equals SAETrainer fed the same rows. It starts its thread at
the first batch asked for, so `skip(n)` before that (a resumed run) skips the source's own batches;
an exception in the thread (a damaged cache) is raised by the `next` that would have had its batch.
On the CPU only the thread and a queue of `depth` batches run ahead. The CUDA-only lines are
`_to_device` and the three lines of `__next__` under `if event is not None`: a ring of `depth + 2`
pinned buffers, each reused only once the copy out of it has finished (its event), and the
consumer's stream waiting on the copy's event, the tensor marked as used there (record_stream).
No GPU is lent here: those lines are not measured (docs/benchmarks/sae-training.md).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

import torch

_END = object()


class _Failed:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class Prefetch:
    """An iterator over `source`'s batches, read `depth` ahead by a thread (see the module doc)."""

    def __init__(self, source: Iterator[torch.Tensor], device: torch.device | str = "cpu", depth: int = 2) -> None:
        self.source, self.device, self.depth = source, torch.device(device), max(1, int(depth))
        self.cuda = self.device.type == "cuda"
        self.batches = 0
        self._queue: queue.Queue = queue.Queue(maxsize=self.depth)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pinned: list[torch.Tensor | None] = [None] * (self.depth + 2)
        self._copied: list[Any] = [None] * (self.depth + 2)  # each pinned buffer's last copy event
        self._stream: Any = None

    def __iter__(self) -> Prefetch:
        return self

    def __next__(self) -> torch.Tensor:
        if self._thread is None:
            self._start()
        item, event = self._queue.get()
        if item is _END:
            self._queue.put((_END, None))  # (every later next ends too)
            raise StopIteration
        if isinstance(item, _Failed):
            self._queue.put((item, None))  # (and every later next)
            raise item.exc
        if event is not None:  # CUDA: the step's stream waits for the copy, and owns the tensor from now on
            stream = torch.cuda.current_stream(self.device)
            stream.wait_event(event)
            item.record_stream(stream)
        self.batches += 1
        return item

    def skip(self, n: int) -> None:
        """Drop the next n batches: the source's own, before the thread has started (a resumed run)."""
        if self._thread is None and hasattr(self.source, "skip"):
            self.source.skip(n)
            return
        for _ in range(n):
            next(self)

    def _start(self) -> None:
        if self.cuda:
            self._stream = torch.cuda.Stream(self.device)
        self._thread = threading.Thread(target=self._work, name="hookrun-sae-prefetch", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        try:
            for i, batch in enumerate(self.source):
                if self._stop.is_set():
                    return
                item = self._to_device(batch, i % len(self._pinned)) if self.cuda else (batch, None)
                if not self._put(item):
                    return
            self._put((_END, None))
        except BaseException as exc:  # raised by the consumer's next
            self._put((_Failed(exc), None))

    def _put(self, item: tuple[Any, Any]) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _to_device(self, batch: torch.Tensor, slot: int) -> tuple[torch.Tensor, Any]:
        """Pinned buffer `slot` (once its last copy is done) -> the device, non_blocking, on the side stream."""
        if self._copied[slot] is not None:
            self._copied[slot].synchronize()
        buf = self._pinned[slot]
        if buf is None or buf.shape != batch.shape or buf.dtype != batch.dtype:
            buf = self._pinned[slot] = torch.empty(batch.shape, dtype=batch.dtype, pin_memory=True)
        buf.copy_(batch)
        with torch.cuda.stream(self._stream):
            out = buf.to(self.device, non_blocking=True)
            event = self._copied[slot] = torch.cuda.Event()
            event.record(self._stream)
        return out, event

    def close(self) -> None:
        """End the thread (it stops at its next batch) and close the source."""
        self._stop.set()
        if self._thread is not None:
            while self._thread.is_alive():
                try:
                    self._queue.get(timeout=0.1)
                except queue.Empty:
                    pass
            self._thread = None
        if hasattr(self.source, "close"):
            self.source.close()
