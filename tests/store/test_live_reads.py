"""Reading a run's file while its run writes it. A flush rewrites object headers in place, so a reader
that opened the file before it can meet an address past the end it read first (`addr overflow`):
the file is intact, and hookrun said it was damaged ("run it again"). Now a read that HDF5 cannot
parse while another process holds the file's lock (its writer) is `ChangedWhileRead` (the file intact: open it again),
and `open_run` opens it again itself; with no other writer (none, a lock file a killed run left, or
this process's own lock) the same bytes are damaged, as before. The damage is made with plain h5py and file bytes."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from conftest import make_cfg
from h5_damage import damage_object_header
from lock_holder import lock_holder

import hookrun
from hookrun.analysis import opening
from hookrun.errors import ChangedWhileRead, ConfigError, HookrunError
from hookrun.store import reading
from hookrun.store.live import live_writer
from hookrun.store.paths import OutputLock, lock_path

RECORD = {"l": {"at": "layer2", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}


@pytest.fixture(scope="module")
def intact(tmp_path_factory, checkpoint):
    return hookrun.run(make_cfg(tmp_path_factory.mktemp("live"), checkpoint, RECORD)).path


@pytest.fixture
def unreadable(tmp_path, intact):
    """A copy of the run whose /captures group HDF5 cannot open (as a reader meets a header a flush moved)."""
    path = tmp_path / "captures.h5"
    path.write_bytes(intact.read_bytes())
    damage_object_header(path, "captures")
    return path


def counting(monkeypatch) -> list[int]:
    opened: list[int] = []
    source = reading.local_source
    monkeypatch.setattr(reading, "local_source", lambda *a: (opened.append(1), source(*a))[1])
    return opened


def test_a_file_its_writer_holds_is_opened_again_then_named_as_changed_not_damaged(monkeypatch, unreadable):
    opened = counting(monkeypatch)
    with lock_holder(unreadable) as pid:
        assert live_writer(unreadable) == str(pid)
        with pytest.raises(ChangedWhileRead) as info:
            hookrun.open_run(unreadable)
    message = str(info.value)
    assert f"{str(unreadable)!r} changed while it was read: a running hookrun (pid {pid}) is writing it" in message
    assert "the group /captures: bad object header version number" in message and "damaged" not in message
    assert "\n" not in message and len(opened) == opening.OPEN_TRIES


@pytest.mark.parametrize("lock", ["left by a killed run", "this process's"])
def test_without_another_writer_the_same_bytes_are_damaged_once(monkeypatch, unreadable, lock):
    """No other process writes: a lock file a killed run left (there, but no process holds it), or this
    process's own (a run that resumes the file reads it before it writes): the bytes are damaged."""
    opened = counting(monkeypatch)
    held = OutputLock(unreadable)
    if lock == "this process's":
        held.acquire()
    else:
        lock_path(unreadable).write_text("999999\n")
    try:
        assert live_writer(unreadable) is None
        with pytest.raises(HookrunError, match=r"the group /captures cannot be read: the file is damaged \(bad object "
                                               r"header") as info:
            hookrun.open_run(unreadable)
    finally:
        held.release()
    assert not isinstance(info.value, ChangedWhileRead) and len(opened) == 1


def test_a_flush_under_the_first_open_reads_the_file_at_the_second(monkeypatch, unreadable, intact):
    """The writer's flush ends between two opens (here: the intact bytes put back while open_run waits)."""
    opened = counting(monkeypatch)
    sleep = time.sleep

    def flush_ends(seconds: float) -> None:
        unreadable.write_bytes(intact.read_bytes())
        sleep(seconds)

    monkeypatch.setattr(opening.time, "sleep", flush_ends)
    with lock_holder(unreadable), hookrun.open_run(unreadable) as run:
        assert run.status == "complete" and [c.module for c in run.captures] == ["layer2"]
    assert len(opened) == 2


def test_a_lock_held_by_another_process_names_its_pid(tmp_path):
    path = tmp_path / "captures.h5"
    with lock_holder(path) as pid:
        assert live_writer(path) == str(pid)
        with pytest.raises(ConfigError, match=rf"another hookrun run \(pid {pid}\) is writing"):
            OutputLock(path).acquire()  # (the reader's probe left the writer's lock as it was)
    assert live_writer(path) is None  # the operating system dropped the killed writer's lock


def test_a_readers_probe_does_not_refuse_a_run_that_starts_beside_it(tmp_path):
    """live_writer probes the lock with a shared flock for an instant: a run that takes the lock at
    that instant waits for it (the holder names no running process) instead of being refused."""
    import fcntl
    import threading

    path = tmp_path / "captures.h5"
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    lock_path(path).write_text(f"{ended.pid}\n")  # a killed run's lock file
    probe = os.open(lock_path(path), os.O_RDONLY)
    fcntl.flock(probe, fcntl.LOCK_SH | fcntl.LOCK_NB)  # a reader's probe, at that instant
    threading.Timer(0.1, os.close, (probe,)).start()
    with OutputLock(path):
        assert lock_path(path).read_text() == f"{os.getpid()}\n"
