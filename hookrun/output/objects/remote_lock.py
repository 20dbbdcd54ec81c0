"""One writer per object-store run: a lock object under the run's URL, held as a renewed lease.

    with RemoteLock(RemoteFolder.open(url), "writer.lock"):   # ConfigError if another run holds it
        ...  # check, resume and write the run's parts and manifest

The lock is the object `<url>/writer.lock` (with many ranks, one per rank: `writer.rank-RRRRR.lock`),
a small JSON naming its holder (host, pid, start time) and when its lease ends. It is created with
a conditional PUT (S3's If-None-Match: *, so of two runs starting together exactly one gets it) and
renewed by a daemon thread every third of the lease, each renewal a conditional replace of the
object it wrote (If-Match: its ETag). A second run, or a `resume=true`, on a URL whose lock is live
is refused in one line naming the holder. A stale lock never blocks for ever: it is taken over
(a conditional replace of the stale object, so two runs cannot both take it) once its lease has
ended (`HOOKRUN_LOCK_LEASE` seconds, 60 by default, after its last renewal: its writer stopped
renewing), or at once where its holder ran on this host and that process is gone (a kill -9).
A store without conditional writes gets the same lease, written plainly and read back; so does a
takeover (or a renewal) whose conditional replace the store refuses although the object did not
change. SeaweedFS's 412 for an existing object names no condition, so s3fs cannot call it
FileExistsError: RemoteFolder.create_text does. A refusal names the holder and when its lease ends.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid

from hookrun.errors import ConfigError
from hookrun.output.objects.object_folder import RemoteFolder, precondition_failed, reason
from hookrun.store.lock_holder import alive
from hookrun.store.paths import WriterLock

log = logging.getLogger("hookrun")
LOCK = "writer.lock"
_HELD: set[str] = set()  # the tokens of the locks this process holds now


def lock_name(rank: int | None) -> str:
    return LOCK if rank is None else f"writer.rank-{rank:05d}.lock"


def lease_seconds() -> float:
    return float(os.environ.get("HOOKRUN_LOCK_LEASE", "60"))


class RemoteLock(WriterLock):
    def __init__(self, folder: RemoteFolder, name: str = LOCK, lease: float | None = None) -> None:
        self.folder, self.name = folder, name
        self.lease = lease_seconds() if lease is None else lease
        self.token = uuid.uuid4().hex
        self.started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        self._tag: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lost = False  # another writer replaced the lock while this run held it

    @property
    def where(self) -> str:
        return f"{self.folder.url}/{self.name}"

    def _body(self) -> str:
        return json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "started": self.started,
                           "expires": time.time() + self.lease, "token": self.token})

    # -- taking it -------------------------------------------------------------------------------
    def acquire(self) -> None:
        try:
            try:
                self._create()
            except FileExistsError:
                self._take_over()
            except NotImplementedError:
                self._plain()
        except ConfigError:
            raise
        except Exception as exc:
            raise ConfigError(f"output.path: the lock {self.where} cannot be written ({reason(exc)})") from None
        _HELD.add(self.token)
        self._thread = threading.Thread(target=self._renew, name="hookrun-store-lock", daemon=True)
        self._thread.start()

    def _create(self) -> None:
        self.folder.create_text(self.name, self._body())
        self._tag = self._own_tag()

    def _own_tag(self) -> str | None:
        try:
            return self.folder.tag(self.name)
        except Exception:
            return None

    def _take_over(self) -> None:
        """The lock exists: refuse while its holder is live, else replace it (conditionally; where
        the store refuses a conditional replace of an object that did not change, as SeaweedFS's
        412 may, the lease is written plainly and read back, as on a store without conditional writes)."""
        holder, tag = self._holder()
        why = stale(holder)
        if why is None:
            raise ConfigError(
                f"output.path: another hookrun run ({who(holder)}) is writing {self.folder.url} (it holds {self.where} "
                f"until {until(holder)}); wait for it to end, or choose another path (a lock whose writer died is "
                f"taken over once its lease ends, {self.lease:.0f} s after its last renewal)")
        try:
            self.folder.replace_text(self.name, self._body(), tag)
            self._tag = self._own_tag()
        except Exception as exc:
            now, now_tag = self._holder()
            if not precondition_failed(exc) or now.get("token") != holder.get("token") or now_tag != tag:
                self._refuse_taken(now, exc)
            log.info("%s: the store refused a conditional replace of an unchanged lock (%s); writing the lease "
                     "plainly", self.where, reason(exc))
            self.folder.write_text(self.name, self._body())
            self._tag = None  # renewed by plain writes, each read back
            if self._holder()[0].get("token") != self.token:
                self._refuse_taken(self._holder()[0], exc)
        log.warning("%s was held by host %s, pid %s (started %s), which %s: taken over", self.where,
                    holder.get("host", "?"), holder.get("pid", "?"), holder.get("started", "?"), why)

    def _refuse_taken(self, holder: dict, exc: BaseException) -> None:
        if holder.get("token") in (None, self.token) or "expires" not in holder or not holder.get("host"):
            raise ConfigError(f"output.path: the lock {self.where} cannot be written ({reason(exc)})") from None
        raise ConfigError(f"output.path: another hookrun run ({who(holder)}) took over the stale lock {self.where} "
                          f"first and holds it until {until(holder)}; wait for it to end, or choose another path") from None

    def _plain(self) -> None:
        """A store without conditional writes: a lease written plainly, then read back."""
        if self.folder.exists(self.name):
            holder, _ = self._holder()
            if stale(holder) is None:
                self._take_over()  # (refuses)
        self.folder.write_text(self.name, self._body())
        if self._holder()[0].get("token") != self.token:
            self._take_over()

    def _holder(self, tries: int = 5) -> tuple[dict, str | None]:
        """The lock's holder and the ETag of what was read; a lock replaced while it was read (its
        holder renewed it) is read again."""
        for attempt in range(tries):
            try:
                tag = self.folder.tag(self.name)
                holder = json.loads(self.folder.read_text(self.name))
                return (holder if isinstance(holder, dict) else {}), tag
            except FileNotFoundError:
                return {"expires": 0}, None
            except (ValueError, UnicodeDecodeError):  # not a lock hookrun wrote: treated as expired
                return {"expires": 0}, None
            except OSError:  # S3: PreconditionFailed, the object changed between its listing and its read
                if attempt == tries - 1:
                    raise
                time.sleep(0.05)
        raise AssertionError("unreachable")

    # -- holding it ------------------------------------------------------------------------------
    def _renew(self) -> None:
        while not self._stop.wait(self.lease / 3):
            try:
                self.folder.replace_text(self.name, self._body(), self._tag) if self._tag else \
                    self.folder.write_text(self.name, self._body())
                self._tag = self._own_tag()
            except Exception as exc:
                try:
                    holder, _ = self._holder()
                except Exception:  # the store is away: the run finds out itself
                    holder = {}
                if holder.get("token") not in (None, self.token):
                    self.lost = True
                    log.error("%s was taken over by %s: another run writes this URL now", self.where, who(holder))
                    return
                if holder.get("token") == self.token and self._tag and precondition_failed(exc):
                    self._tag = None  # ours still, yet the replace was refused: renew it plainly from now on
                    log.info("%s: the store refused a conditional replace of this run's own lock (%s); renewing it "
                             "plainly", self.where, reason(exc))
                    continue
                log.warning("could not renew %s (%s); retrying", self.where, reason(exc))

    def release(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=5)
        self._thread = None
        _HELD.discard(self.token)
        try:
            if self._holder()[0].get("token") == self.token:
                self.folder.remove(self.name)
        except Exception as exc:  # a lock left behind expires: it blocks nothing for long
            log.warning("could not remove %s (%s); it expires in %.0f s", self.where, reason(exc), self.lease)


def who(holder: dict) -> str:
    return f"host {holder.get('host', '?')}, pid {holder.get('pid', '?')}, started {holder.get('started', '?')}"


def until(holder: dict) -> str:
    """When a holder's lease ends, as a time of day (and how far off)."""
    try:
        expires = float(holder["expires"])
    except (KeyError, TypeError, ValueError):
        return "an unknown time (its lock names no lease end)"
    return f"{time.strftime('%Y-%m-%dT%H:%M:%S%z', time.localtime(expires))} ({expires - time.time():+.0f} s from now)"


def stale(holder: dict) -> str | None:
    """Why a lock's holder no longer writes ('its lease ended at ...', 'is gone'), None where it may."""
    try:
        expires = float(holder.get("expires", 0))
    except (TypeError, ValueError):
        expires = 0.0
    if expires < time.time():
        return f"stopped renewing it (its lease ended {time.time() - expires:.0f} s ago)"
    if holder.get("host") == socket.gethostname() and isinstance(holder.get("pid"), int):
        if holder["pid"] == os.getpid() and holder.get("token") not in _HELD:
            return "left it behind in this process (its store went away before it could be removed)"
        if not alive(holder["pid"]):
            return "is no longer running on this host"
    return None
