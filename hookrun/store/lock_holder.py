"""Who holds a lock file (store/paths.py's `<file>.lock`): the pid its holder wrote in it, and whether
that process runs. OutputLock asks here only where another process holds the lock (its refusal names
the holder); the readers' live_writer (store/live.py) to name the run that writes a file now.

    holder = read_pid(fd)          # '12345', or '' where the file names none
    writer_alive(holder)           # False: no such process (a reader's probe, or a writer before its pid)
"""

from __future__ import annotations

import os

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None


def writer_alive(pid: str) -> bool:
    """Whether `pid` names a running process ("": none named)."""
    if not pid.isdigit():
        return False
    if fcntl is None:  # (Windows: os.kill would end it)
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except OSError:  # (another user's: it runs)
        pass
    return True


def read_pid(fd: int) -> str:
    try:
        return os.pread(fd, 32, 0).decode().strip()
    except (OSError, UnicodeDecodeError):
        return ""
