"""The file object an HDF5 store is written through, so that a kill -9 at any moment leaves the
file under its name as one whole flush: what HDF5 rewrites in place goes to disk all at once.

    raw = HeldWrites(Path("captures.h5"))
    f = h5py.File(raw, "w")                    # h5py's fileobj driver
    raw.hold(filling_chunks(datasets))         # before f.flush()
    f.flush()                                  # new space: to disk; the last flush's bytes: held
    raw.release()                              # the held writes, applied whole by a helper process

A flush is many writes, in HDF5's order, some into the metadata the last flush left (object headers, B-tree nodes, the
superblock's end of file). Those are held in memory while HDF5 writes and then sent in one message to a small helper
process, which applies a message only once it has all of it. A kill -9 of the writer before the message is complete
leaves the last flush's file, one after it the next flush's, once the helper has written it: the helper holds an
exclusive flock on the file for its life (its writer's, and after a kill until the pipe holds no whole message more),
so plain h5py (HDF5's file locking) refuses the file while a message may be half written, and hookrun's readers wait
for it where no run is writing the file (store/live.py's `settled`): either way the file under its name is read with
lengths equal to its counts. (Only the helper's own death in the microseconds it writes, by a kill of the whole
process group or a power cut, could tear a flush; on Windows the writes are applied in this process.) Held: a few KiB
per capture per flush; written through: new space, and the uncompressed chunks being filled (h5store's `filling_chunks`).
"""

from __future__ import annotations

import contextlib
import io
import os
import select
import signal
import struct
import subprocess
import sys
import threading
from pathlib import Path

# the helper: reads messages [u64 length][records] from stdin; a record is [i64 offset][i64 n][n bytes] (n = -1:
# truncate the file to `offset`); a message is applied only when whole, then acknowledged
_HELPER = """
import os, select, signal, struct, sys
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
fd, parent = int(sys.argv[1]), os.getppid()  # (and the file's description its writer locked, open here till the end)
def say(b):  # (the writer killed: no one to answer, but the messages it sent are still applied)
    try: os.write(1, b)
    except OSError: pass
def read(n):  # None: the end of input, or the writer gone and nothing more in the pipe (a forked
    out = b""  # DataLoader worker may hold the pipe open, so no end of file comes)
    while len(out) < n:
        if not select.select([0], [], [], 0.05)[0]:
            if os.getppid() != parent: return None
            continue
        part = os.read(0, n - len(out))
        if not part:
            return None
        out += part
    return out
say(b"r")
while True:
    head = read(8)
    n = struct.unpack("<Q", head)[0] if head else 2**64 - 1
    body = read(n) if n != 2**64 - 1 else None  # (2**64 - 1: the end, close()'s word)
    if body is None:
        break
    at = 0
    while at < n:
        off, size = struct.unpack_from("<qq", body, at)
        at += 16
        if size < 0:
            os.ftruncate(fd, off)
            continue
        view = memoryview(body)[at:at + size]
        at += size
        while len(view):
            done = os.pwrite(fd, view, off)
            view, off = view[done:], off + done
    say(b"k")
os._exit(0)  # every write is done (pwrite) and acknowledged: no interpreter teardown to wait for
"""


END = 2**64 - 1  # the message length that tells the helper to end
WRITING: set[tuple[int, int]] = set()  # (device, inode) of the files this process writes: its own helpers' locks


def _locked(fd: int) -> int:
    """A new description of `fd`'s file (a flock belongs to a description) locked exclusively, for the helper to
    inherit and hold till its last message; -1 without /proc or flock (macOS): best effort."""
    lock = -1
    with contextlib.suppress(ImportError, OSError):
        import fcntl
        lock = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY)
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return lock
    if lock >= 0:
        os.close(lock)
    return -1


class Applier:
    """The helper process that applies a flush's held writes whole (in-process on Windows)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.pending = False  # a message sent, its answer not yet read
        self.ready = False  # the helper said it has started (its first byte; the file's lock is held from before it)
        self.proc, lock = None, _locked(fd) if os.name == "posix" else -1  # (before it starts: a kill finds it held)
        try:
            if os.name == "posix":
                self.proc = subprocess.Popen([sys.executable, "-S", "-c", _HELPER, str(fd)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                             pass_fds=(fd, lock) if lock >= 0 else (fd,), start_new_session=True)
        finally:
            if lock >= 0:
                os.close(lock)  # (the helper's copy holds it; a DataLoader worker forked later has none)

    def apply(self, message: bytes) -> None:
        """Hand one message to the helper. Its answer is awaited at the next apply, read or close
        (wait): the helper writes while this process goes on with the next batch, and a kill in
        between leaves the message applied, since the helper has all of it."""
        if self.proc is None:
            _apply(self.fd, message)
            return
        self.wait()
        if not self.ready:  # (a helper that died as it started is one OSError here, not a message into a closed pipe)
            self.ready = self.proc.stdout.read(1) == b"r"
            if not self.ready:
                raise OSError(f"the flush helper did not start (exit {self.proc.poll()})")
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM}) if threading.current_thread() is threading.main_thread() else None
        try:  # never half a message from here: a KeyboardInterrupt would leave the helper waiting
            self.proc.stdin.write(struct.pack("<Q", len(message)) + message)
            self.proc.stdin.flush()
            self.pending = True
        finally:
            if old is not None:
                signal.pthread_sigmask(signal.SIG_SETMASK, old)

    def wait(self) -> None:
        """Until the helper has written the last message."""
        if self.pending:
            self.pending = False
            if self.proc.stdout.read(1) != b"k":
                raise OSError(f"the flush helper stopped (exit {self.proc.poll()}): the file's last flush may be incomplete")

    def close(self) -> None:
        """Tell the helper to end (in words: a process forked from this one, a DataLoader worker,
        holds the pipe's write end too, so closing it here sends no EOF) and wait for it."""
        if self.proc is not None and self.proc.poll() is None:
            self.wait()
            with contextlib.suppress(OSError):  # (the helper is gone already)
                self.proc.stdin.write(struct.pack("<Q", END))
                self.proc.stdin.flush()
                self.proc.stdin.close()
            if select.select([self.proc.stdout], [], [], 60)[0]:  # its stdout's end of file: it has ended
                self.proc.stdout.read()  # (a blocking wait, not subprocess's polling sleeps: 3 ms a run)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:  # (every message was acknowledged above: nothing is lost)
                self.proc.kill()
                self.proc.wait()
            self.proc.stdout.close()


def _apply(fd: int, message: bytes) -> None:
    at = 0
    while at < len(message):
        off, size = struct.unpack_from("<qq", message, at)
        at += 16
        if size < 0:
            os.ftruncate(fd, off)
        else:
            _pwrite(fd, memoryview(message)[at:at + size], off)
            at += size


class HeldWrites(io.RawIOBase):
    """The file object HDF5 writes the store through (h5py's `fileobj` driver). While `holding`, writes into the
    part of the file the last flush's metadata may point at (below `stable`, the file's size when that flush ended)
    are kept in memory, and writes past it go to disk at once; `release` then puts the held bytes in place, a few
    KiB of metadata and the chunks being filled, in one short burst of pwrite calls. HDF5 itself writes a flush as
    many in-place writes, in its own order, over milliseconds."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o666)
        self.applier = Applier(self.fd)
        self.inode = (os.fstat(self.fd).st_dev, os.fstat(self.fd).st_ino)
        WRITING.add(self.inode)
        self.pos = 0
        self.stable: int | None = None  # while holding: the size of the file as of the last flush
        self.held: list[tuple[int, bytes | None, int]] = []  # (offset, bytes, 0) or (-1, None, truncate size)
        self.flushed_size = 0  # where the last flush's file ended: its metadata points below
        self.filling: list[tuple[int, int]] = []  # byte ranges written through while holding
        self.dropped, self.error = False, None  # a write failed (error): what HDF5 writes from then on goes nowhere

    # -- io.RawIOBase, as h5py's driver calls it -----------------------------------------------
    def readable(self) -> bool:
        return True

    writable = seekable = readable

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self.pos = offset + (self._size() if whence == os.SEEK_END else self.pos if whence == os.SEEK_CUR else 0)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readinto(self, buf) -> int:
        self.applier.wait()  # what the helper still writes must be on disk before it is read
        n = os.preadv(self.fd, [buf], self.pos)
        view = memoryview(buf).cast("B")
        for off, data, size in self.held:  # what HDF5 wrote but the disk does not hold yet
            if data is None:
                if size < self.pos + n:
                    n = max(0, size - self.pos)
                continue
            lo, hi = max(off, self.pos), min(off + len(data), self.pos + len(view))
            if lo < hi:
                view[lo - self.pos:hi - self.pos] = data[lo - off:hi - off]
                n = max(n, hi - self.pos)
        self.pos += n
        return n

    def write(self, buf) -> int:
        view = memoryview(buf).cast("B")
        n, at = len(view), self.pos
        if self.dropped:  # (a failed flush: the file keeps the last whole one)
            return n
        if self.stable is not None and at < self.stable and not self._filling(at, n):  # bytes the last flush may point at
            cut = min(n, self.stable - at)
            self.held.append((at, bytes(view[:cut]), 0))
            view, at = view[cut:], at + cut
        try:
            _pwrite(self.fd, view, at)
        except OSError as exc:  # (HDF5 is told it was written: an error inside its flush breaks its caches for good)
            self.error = exc
            self.drop()
        self.pos += n
        return n

    def _filling(self, at: int, n: int) -> bool:
        """Whether [at, at + n) lies in a chunk being filled: rewriting it leaves the rows it held
        at the last flush as they were, so it goes to disk at once."""
        return any(lo <= at and at + n <= hi for lo, hi in self.filling)

    def truncate(self, size: int | None = None) -> int:
        size = self.pos if size is None else size
        if self.dropped:
            return size
        if self.stable is not None and size < self.stable:
            self.held.append((-1, None, size))
        else:
            os.ftruncate(self.fd, size)
        return size

    def flush(self) -> None:
        pass  # unbuffered: every write is in the page cache at once

    def close(self) -> None:
        if not self.closed:
            self.applier.close()
            WRITING.discard(self.inode)
            os.close(self.fd)
        super().close()

    # -- holding -----------------------------------------------------------------------------
    def hold(self, filling: list[tuple[int, int]] = ()) -> None:
        """From now on, keep writes below the file's size as of the last release in memory, but
        those inside `filling`: the byte ranges of uncompressed chunks being filled (rewritten
        whole at each flush, with the rows the last flush wrote unchanged)."""
        self.stable, self.filling = self.flushed_size, list(filling)

    def drop(self) -> None:
        """A failed write (a full disk): the flush's held writes dropped, not half applied; later writes go nowhere."""
        self.held, self.stable, self.dropped = [], None, True

    def release(self) -> None:
        """Put the held writes in place, in the order HDF5 made them, all or none: they go to a
        helper process in one message, and it writes them only once the whole message is in, so a
        kill -9 of this process at any moment leaves the file of one flush or of the next."""
        held, self.held, self.stable = self.held, [], None
        if held:
            message = b"".join(struct.pack("<qq", size, -1) if data is None else struct.pack("<qq", off, len(data)) + data
                               for off, data, size in held)
            self.applier.apply(message)
            if any(data is None for _, data, _ in held):  # a truncation: the size is the helper's to set
                self.applier.wait()
        self.flushed_size = max(os.fstat(self.fd).st_size, max((o + len(d) for o, d, _ in held if d is not None), default=0))

    def _size(self) -> int:
        size = os.fstat(self.fd).st_size
        for off, data, n in self.held:
            size = n if data is None else max(size, off + len(data))
        return size


def _pwrite(fd: int, data, offset: int) -> None:
    view = memoryview(data)
    while len(view):
        done = os.pwrite(fd, view, offset)
        view, offset = view[done:], offset + done

