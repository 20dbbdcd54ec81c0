"""The writer thread: takes step records off the loop's thread through a bounded queue.

    with BackgroundWriter(store, max_pending=2) as writer:
        writer.put(record)   # blocks while `max_pending` records wait: memory stays bounded

One thread owns the HDF5 file (h5py serialises its calls but releases the GIL while it writes, so
the write overlaps the next forward pass). An error in the thread surfaces at the next put/close.
"""

from __future__ import annotations

import errno
import queue
import threading

from hookrun.errors import HookrunError, RunError
from hookrun.store.records import RunStore, StepRecord

_STOP = object()


def write_error(exc: Exception, store: RunStore, step: int) -> RunError:
    text = str(exc)
    if getattr(exc, "errno", None) == errno.ENOSPC or "errno = 28" in text or "No space left" in text:
        reason = "no space left on the device"
    else:
        reason = f"{type(exc).__name__}: {text.splitlines()[0][:200] if text else ''}"
    return RunError(f"writing {store.path} failed at batch {step}: {reason}; the file keeps every batch "
                    f"flushed before it ({store.steps} batches)")


class BackgroundWriter:
    def __init__(self, store: RunStore, max_pending: int = 2) -> None:
        self.store = store
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, max_pending))
        self._error: BaseException | None = None
        self._abort = False  # a second signal: skip what waits in the queue
        self._stop_sent = False
        self._thread = threading.Thread(target=self._work, name="hookrun-writer", daemon=True)
        self._thread.start()

    def _work(self) -> None:
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
        is never closed under a running writer."""
        interrupted: BaseException | None = None
        while self._thread.is_alive():
            try:
                if not self._stop_sent:
                    self._queue.put(_STOP)
                    self._stop_sent = True
                self._thread.join()
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
