"""A report or picture writer killed by SIGKILL leaves its hidden `.NAME.PID.tmp` beside the output (never a
cut-off file at the final name); the next write into that folder removes such leftovers whose process is gone
and which nobody touched for a minute, and nothing else. Before: nothing ever removed them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from hookrun.store import whole_file
from hookrun.store.whole_file import write_whole

ROOT = Path(__file__).resolve().parents[2]
KILLED = """
import sys, time
from pathlib import Path
from hookrun.store.whole_file import write_whole
def write(tmp):
    tmp.write_text("<html>half")
    print("writing", flush=True)
    time.sleep(60)
write_whole(Path(sys.argv[1]), write)
"""


def killed_writer(path: Path) -> int:
    """A process killed (SIGKILL) while write_whole wrote `path`: its PID."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", KILLED, str(path)], stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline().strip() == "writing"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    return proc.pid


def age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_the_next_write_removes_a_killed_writers_leftover_and_nothing_else(tmp_path):
    pid = killed_writer(tmp_path / "report.html")
    leftover = tmp_path / f".report.html.{pid}.tmp"
    assert leftover.read_text() == "<html>half" and not (tmp_path / "report.html").exists()
    fresh_pid = killed_writer(tmp_path / "fig.png")  # killed just now: another machine's writer may look like it
    fresh = tmp_path / f".fig.png.{fresh_pid}.tmp"
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        alive = tmp_path / f".other.png.{live.pid}.tmp"  # a writer still running
        alive.write_text("x")
        mine = [tmp_path / ".notes.tmp", tmp_path / ".draft.v2.tmp", tmp_path / "a.123.tmp"]  # not hookrun's pattern
        for p in mine:
            p.write_text("user")
        folder = tmp_path / f".sae.{pid}.tmp"  # a folder (sae.out's hidden one): not a file write_whole leaves
        folder.mkdir()
        for p in (leftover, alive, *mine, folder):
            age(p, 3600)

        write_whole(tmp_path / "index.html", lambda tmp: tmp.write_text("whole"))

        assert not leftover.exists()  # the killed writer's, an hour old: removed
        assert fresh.exists() and alive.exists() and folder.is_dir()
        assert all(p.read_text() == "user" for p in mine)
        assert (tmp_path / "index.html").read_text() == "whole"
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
            [fresh.name, alive.name, folder.name, "index.html", *(p.name for p in mine)])
    finally:
        live.kill()
        live.wait()


def test_a_leftover_is_removed_once_stale(tmp_path, monkeypatch):
    pid = killed_writer(tmp_path / "fig.png")
    leftover = tmp_path / f".fig.png.{pid}.tmp"
    monkeypatch.setattr(whole_file, "STALE_SECONDS", 0.0)
    assert whole_file.remove_leftovers(tmp_path) == [leftover] and not leftover.exists()
    assert whole_file.remove_leftovers(tmp_path / "missing") == []


def test_the_sae_writer_removes_a_killed_writers_hidden_folder_of_its_own_name_once_stale(tmp_path):
    """sae.out is written as a hidden folder `.OUT.PID.tmp` and moved in; a SIGKILL mid-write left that
    folder for ever (the leftover removal took files only). save_sae now removes a stale one of its own
    name whose process is gone; a fresh one, a live writer's and another name's stay."""
    from hookrun.runner.kinds.sae.engine import save_sae

    pid = killed_writer(tmp_path / "x")  # a PID that is no process now
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        stale, other, alive, fresh = (tmp_path / f".sae.{pid}.tmp", tmp_path / f".notes.{pid}.tmp",
                                      tmp_path / f".sae.{live.pid}.tmp", tmp_path / f".sae.{pid + 1 if pid + 1 != live.pid else pid + 2}.tmp")
        for folder in (stale, other, alive, fresh):
            folder.mkdir()
            (folder / "sae_weights.safetensors").write_bytes(b"half")
        for folder in (stale, other, alive):
            age(folder, 3600)

        class Saved:  # writes what SAELens' save_inference_model writes: the folder's two files
            def save_inference_model(self, path):
                Path(path).mkdir()
                (Path(path) / "sae_weights.safetensors").write_bytes(b"weights")
                (Path(path) / "cfg.json").write_text("{}")

        save_sae(Saved(), tmp_path / "sae")
        assert not stale.exists() and other.is_dir() and alive.is_dir()
        assert fresh.is_dir()  # touched within the minute: a writer elsewhere may still be at it
        assert (tmp_path / "sae/sae_weights.safetensors").read_bytes() == b"weights"
    finally:
        live.kill()
        live.wait()
