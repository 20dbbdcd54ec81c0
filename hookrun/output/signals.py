"""Clean stops: within the block, SIGINT or SIGTERM asks the loop to stop after the batch in flight.

    with StopSignals() as stop:
        for batch in ...:
            ...
            if stop.requested():
                break
    if stop.signum: raise Interrupted(stop.signum, path, steps)

A second signal stops at once: it raises KeyboardInterrupt (SIGTERM too), and the caller closes
the file after the writer thread has ended. Within `stop.shielded()` (closing the file) a signal
only says to wait. Handlers are only installed from the main thread (Python's rule); elsewhere
the block does nothing.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hookrun.errors import HookrunError

log = logging.getLogger("hookrun")
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(HookrunError):
    """The run stopped on a signal; exit status 128 + signal number. `path` is None where it stopped
    before the output file was created (nothing was written); `unit` is what the kind calls a step."""

    def __init__(self, signum: int, path: Path | None, steps: int, resumed_from: Path | None = None,
                 unit: str = "batches") -> None:
        name = signal.Signals(signum).name
        if path is not None:
            text = (f"interrupted by {name} after {steps} {unit}; {path} is marked 'interrupted': "
                    f"run the same command with resume=true (and the same {_folder_key()}) to go on")
        elif resumed_from is not None:
            text = f"interrupted by {name} before the run began; {resumed_from} is as it was (resume=true goes on from it)"
        else:
            text = f"interrupted by {name} before the output file was created; nothing was written"
        super().__init__(text)
        self.signum = signum
        self.exit_code = 128 + signum


def _folder_key() -> str:
    """The key that names the run's folder again: a job of a sweep (any launcher) is found by its sweep's."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        return "hydra.sweep.dir" if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN \
            else "hydra.run.dir"
    except Exception:  # (no Hydra run: hookrun.run from Python)
        return "hydra.run.dir"


class StoreAway(Interrupted):
    """The object store stayed away past the upload retries: the run stopped `interrupted`, its
    parts kept in the staging folder; exit status 143, as for SIGTERM (a stop from outside)."""

    def __init__(self, message: str) -> None:
        HookrunError.__init__(self, message)
        self.signum = signal.SIGTERM
        self.exit_code = 128 + signal.SIGTERM


class _Stopped(KeyboardInterrupt):
    """SIGTERM before the loop, raised as Ctrl-C is (with the signal's number)."""

    def __init__(self, signum: int) -> None:
        super().__init__()
        self.signum = signum


@contextmanager
def setup_stops() -> Iterator[None]:
    """Before the loop, SIGTERM stops as Ctrl-C does: KeyboardInterrupt carrying `signum`, so the lock
    is released and the run says why it ended (Python's default for SIGTERM ends the process at once,
    with no word and the lock left behind). A handler someone else installed is left alone."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def handle(signum: int, frame: object) -> None:
        raise _Stopped(signum)

    signal.signal(signal.SIGTERM, handle)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def stopped_by(exc: KeyboardInterrupt) -> int:
    """The signal behind a KeyboardInterrupt: SIGTERM where `setup_stops` raised it, else SIGINT."""
    return getattr(exc, "signum", signal.SIGINT)


class StopSignals:
    def __init__(self) -> None:
        self.signum: int | None = None
        self.now = False  # a second signal came: stop at once
        self._old: dict[int, object] = {}
        self._shielded = False

    def requested(self) -> bool:
        return self.signum is not None

    def _handle(self, signum: int, frame: object) -> None:
        name = signal.Signals(signum).name
        if self._shielded:
            log.warning("%s: closing the file; it takes a moment", name)
            self.signum = self.signum or signum
            return
        if self.signum is None:
            self.signum = signum
            log.warning("%s: finishing the batch in flight, then stopping (send it again to stop at once)", name)
            return
        self.now = True
        log.warning("%s: stopping at once", name)
        raise KeyboardInterrupt

    @contextmanager
    def shielded(self) -> Iterator[None]:
        """Signals only wait within the block (the file is being closed)."""
        was, self._shielded = self._shielded, True
        try:
            yield
        finally:
            self._shielded = was

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for s in SIGNALS:
                self._old[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for s, handler in self._old.items():
            signal.signal(s, handler)
        self._old.clear()


def after_close(exc: KeyboardInterrupt, dest: object, resume: bool) -> dict:
    """A Ctrl-C / SIGTERM outside the run's batches (setup_stops' KeyboardInterrupt): before the file was
    created, Interrupted saying nothing was written; once the run closed it (`dest.closed`, set by
    execute), what the file is: a complete one stays complete (warned; RunResult's steps, samples, signum),
    any other is named as kept."""
    signum = stopped_by(exc)
    status, steps, samples, unit = getattr(dest, "closed", None) or (None, 0, 0, "batches")
    if status is None:
        raise Interrupted(signum, None, 0, resumed_from=dest.resumed_from(resume)) from None
    if status != "complete":
        raise Interrupted(signum, dest.result, steps, unit=unit) from None
    log.warning("%s after the run ended: %s is complete", signal.Signals(signum).name, dest.result)
    return {"steps": steps, "samples": samples, "signum": signum}
