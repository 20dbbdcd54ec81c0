"""Clean stops: within the block, SIGINT or SIGTERM asks the loop to stop after the batch in flight.

    with StopSignals() as stop:
        for batch in ...:
            ...
            if stop.requested():
                break
    if stop.signum: raise Interrupted(stop.signum, path, steps)

A second signal acts as usual (KeyboardInterrupt for SIGINT, termination for SIGTERM). Handlers
are only installed from the main thread (Python's rule); elsewhere the block does nothing.
"""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path

from hookrun.errors import HookrunError

log = logging.getLogger("hookrun")
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(HookrunError):
    """The run stopped on a signal after a clean flush; exit status 128 + signal number."""

    def __init__(self, signum: int, path: Path, steps: int) -> None:
        name = signal.Signals(signum).name
        super().__init__(
            f"interrupted by {name} after {steps} batches; {path} is marked 'interrupted': "
            f"run the same command with resume=true (and the same hydra.run.dir) to go on"
        )
        self.signum = signum
        self.exit_code = 128 + signum


class StopSignals:
    def __init__(self) -> None:
        self.signum: int | None = None
        self._old: dict[int, object] = {}

    def requested(self) -> bool:
        return self.signum is not None

    def _handle(self, signum: int, frame: object) -> None:
        self.signum = signum
        log.warning("%s: finishing the batch in flight, then stopping (send it again to stop at once)",
                    signal.Signals(signum).name)
        signal.signal(signum, self._old.get(signum, signal.SIG_DFL))

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for s in SIGNALS:
                self._old[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for s, handler in self._old.items():
            signal.signal(s, handler)
        self._old.clear()
