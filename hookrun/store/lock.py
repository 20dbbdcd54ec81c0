"""One writer per output file: an exclusive lock file beside it, held for the whole run.

    with OutputLock(Path("outputs/run/captures.h5")):   # ConfigError if another run holds it
        ...  # check, create, resume and replace captures.h5 (and captures.h5.resuming)

The lock is `<file>.lock`, locked with flock(2) before anything is created or truncated, and
removed when the run ends; the operating system drops the lock of a killed process, so a stale
lock file never blocks the next run. A run that is refused touches nothing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol, runtime_checkable

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None
    import msvcrt

from hookrun.errors import ConfigError


@runtime_checkable
class WriterLock(Protocol):
    """One writer per output, whatever the output is: `acquire` refuses in one ConfigError line naming
    the holder, `release` lets the next run in; used as a context manager around the whole run.

    | lock                         | where                      | a killed holder                        |
    |------------------------------|----------------------------|----------------------------------------|
    | OutputLock (this module)     | `<file>.lock`, flock(2)    | the OS drops its lock                  |
    | RemoteLock (remote_lock.py)  | `<url>/writer.lock` object | taken over when its lease has ended    |

    A destination (hookrun/output/) holds one, or both for an object-store run (the URL's lock and
    the staging folder's)."""

    def acquire(self) -> None: ...

    def release(self) -> None: ...

    def __enter__(self) -> WriterLock: ...

    def __exit__(self, *exc: object) -> None: ...


def lock_path(output: Path) -> Path:
    """The lock file of an output file: `captures.h5` -> `captures.h5.lock`, beside it."""
    return output.with_name(output.name + ".lock")


class OutputLock:
    def __init__(self, output: Path) -> None:
        self.output = output
        self.path = lock_path(output)
        self._fd: int | None = None

    def acquire(self) -> None:
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise ConfigError(f"output.path: cannot create the lock file {str(self.path)!r}: {exc.strerror}") from None
            if not _try_lock(fd):
                holder = _read_pid(fd)
                os.close(fd)
                raise ConfigError(
                    f"output.path: another hookrun run{f' (pid {holder})' if holder else ''} is writing "
                    f"{str(self.output)!r} (it holds {self.path.name}); wait for it to end, or choose another path"
                ) from None
            # the previous holder removes the lock file as it ends: lock the file that is there now
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()}\n".encode())
                self._fd = fd
                return
            os.close(fd)

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)  # while still holding it: a waiting run then retries on a new file
        except OSError:  # (Windows keeps an open file) a leftover lock file blocks nothing
            pass
        finally:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> OutputLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _try_lock(fd: int) -> bool:
    """An exclusive, non-blocking lock on the open file `fd`: False where another process holds it."""
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        else:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
    except OSError:  # BlockingIOError (EWOULDBLOCK), or EACCES on Windows
        return False
    return True


def _read_pid(fd: int) -> str:
    try:
        return os.pread(fd, 32, 0).decode().strip()
    except (OSError, UnicodeDecodeError):
        return ""
