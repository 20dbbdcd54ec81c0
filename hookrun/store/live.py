"""A run file that another process may be writing now: its writer, a read that a flush changed under
the reader, and a killed run's last flush, waited for before reading (store/paths.py holds the writer's
side: the lock file and the hidden creation).

    live_writer(Path("captures.h5"))   # the pid of the run writing it now, or None
    settled(Path("captures.h5"))       # before reading: a killed run's flush helper has let go of the file
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from hookrun.errors import ChangedWhileRead
from hookrun.store.held import WRITING
from hookrun.store.lock_holder import read_pid
from hookrun.store.paths import flushing_path, lock_path, try_lock

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None


def live_writer(output: Path) -> str | None:
    """The pid of another process writing `output` now (it holds the lock file beside it; "" where the
    file names none), or None where none does: no lock file, one a killed run left unlocked, or this
    process's own lock (a run reading the file it resumes, before it writes a batch)."""
    try:
        fd = os.open(lock_path(Path(output)), os.O_RDONLY)
    except OSError:
        return None
    try:
        if fcntl is None:  # (Windows: a reader cannot tell without taking the writer's lock)
            return None
        if try_lock(fd, shared=True):  # (no writer: let go at once)
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        pid = read_pid(fd)  # held: the writer runs
        return None if pid == str(os.getpid()) else pid
    finally:
        os.close(fd)


def changed_while_read(path: Path | str, reason: str) -> ChangedWhileRead | None:
    """The error for a read of `path` that HDF5 could not parse (`reason`) because its writer is
    running: a flush rewrote headers under the reader, which mixed metadata from before and after it
    (an address past the end it read first). None where no writer runs: the file is damaged."""
    pid = live_writer(Path(path))
    if pid is None:
        return None
    return ChangedWhileRead(f"{str(path)!r} changed while it was read: a running hookrun{f' (pid {pid})' if pid else ''} "
                            f"is writing it and flushed meanwhile ({reason}); the file is intact: open it again, "
                            f"or read it once the run ends")


def settled(path: Path, seconds: float = 10.0) -> None:
    """Until a killed run's flush helper (store/held.py) has written the last message it was sent and
    let go of `path` (it holds an exclusive flock on the file while its writer lives, then until its
    pipe is empty): then the file is one whole flush. A live run's file (its writer holds the lock
    beside it) is read at once, best effort; no file, or a file system without flock: at once; a
    helper still there after `seconds`: on."""
    if fcntl is None or live_writer(path) is not None:
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        if (os.fstat(fd).st_dev, os.fstat(fd).st_ino) in WRITING:  # this process writes it: its own helper
            return
        deadline = time.monotonic() + seconds
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    return
                time.sleep(0.001)
            except OSError:  # (no flock on this file system)
                return
    finally:
        os.close(fd)  # (the shared lock goes with it)


def wait_for_flush(path: Path, seconds: float = 2.0) -> bool:
    """True once `path` is back from a running flush (a live run's file steps aside for a few
    milliseconds while HDF5 writes); False where it does not come back (killed in a flush) or
    was never aside."""
    deadline = time.monotonic() + seconds
    while flushing_path(path).exists() and time.monotonic() < deadline:
        if path.exists():
            return True
        time.sleep(0.01)
    return path.exists()
