"""Another process that holds a run file's lock, as a run writing it does (tests only).

    with lock_holder(Path("captures.h5")) as pid:   # a child process holds captures.h5.lock
        ...                                          # readers see a live writer, pid `pid`
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def lock_holder(path: Path) -> Iterator[int]:
    """A child process that takes `path`'s OutputLock (store/paths.py) and sleeps; killed at the end
    (the operating system drops its lock, as for a killed run)."""
    code = ("import time; from pathlib import Path; from hookrun.store.paths import OutputLock\n"
            f"OutputLock(Path({str(path)!r})).acquire(); print('held', flush=True); time.sleep(120)")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "held"
        yield child.pid
    finally:
        child.kill()
        child.wait()
