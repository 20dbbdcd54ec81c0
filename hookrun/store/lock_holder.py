"""Who holds a lock file (store/paths.py's `<file>.lock`): the pid its holder wrote in it, and whether
that process runs. OutputLock asks here only where another process holds the lock (its refusal names
the holder); the readers' live_writer (store/live.py) to name the run that writes a file now.

    holder = read_pid(fd)          # '12345', or '' where the file names none
    writer_alive(holder)           # False: no such process (a reader's probe, or a writer before its pid)
    alive(12345)                   # the same for a pid as a number (the leftovers, locks and scratch of other modules)
"""

from __future__ import annotations

import os

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None


def alive(pid: int) -> bool:
    """Whether `pid` is a process on this machine: another user's counts (it may not be signalled), and
    0 and negatives, which name process groups, are never taken for a dead one; True where it cannot be
    asked without harm (Windows: os.kill would end it)."""
    if pid <= 0 or fcntl is None:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):  # (PermissionError: another user's, it runs)
        return True
    return True


def writer_alive(pid: str) -> bool:
    """Whether `pid` names a running process ("": none named)."""
    return pid.isdigit() and alive(int(pid))


def read_pid(fd: int) -> str:
    try:
        return os.pread(fd, 32, 0).decode().strip()
    except (OSError, UnicodeDecodeError):
        return ""
