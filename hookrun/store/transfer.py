"""Host transfer: move a step's device snapshots into reused host buffers without stalling.

    transfer = HostTransfer(torch.device("cuda"))
    ticket = transfer.submit(captures)   # copies queued on a side stream, returns at once
    ...                                   # (writer thread) ticket.wait(); write; ticket.release()

On CUDA each snapshot is copied with `non_blocking=True` on a side stream into a pinned host
buffer taken from a pool keyed by (shape, dtype); an event recorded after the copies is what the
writer waits on, and the writer hands the buffers back once they are on disk. The number of
buffers is bounded by the writer queue, so memory stays flat. On the CPU the snapshot already is
the host copy and nothing happens, unless `always_pool=True` (used by the tests to run the same
pooling logic without a GPU).
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from hookrun.store.records import Capture


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
