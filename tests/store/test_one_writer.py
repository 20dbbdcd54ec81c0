"""One writer per file: a second run is refused while another writes or builds its model, and the
file gets its name only once it opens. References: plain h5py and the file's own bytes."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import h5py
import pytest
from toy_runs import toy_cfg

import hookrun
from hookrun.errors import ConfigError
from hookrun.store.paths import OutputLock, lock_path


@pytest.mark.parametrize("over", [{"output.overwrite": True}, {"resume": True}])
def test_a_second_writer_is_refused_and_touches_nothing(tmp_path, over):
    cfg = toy_cfg(tmp_path)
    path = hookrun.run(cfg).path
    before = path.read_bytes()
    with OutputLock(path):  # another run holds the file
        with pytest.raises(ConfigError, match=r"another hookrun run \(pid \d+\) is writing .*captures.h5"):
            hookrun.run(toy_cfg(tmp_path, **over))
        assert path.read_bytes() == before
        assert not Path(str(path) + ".resuming").exists()
    assert not lock_path(path).exists()  # removed by its holder
    assert hookrun.run(toy_cfg(tmp_path, **{"output.overwrite": True})).status == "complete"
    assert not lock_path(path).exists()


def test_a_full_disk_at_the_lock_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    """The lock file opened but its pid could not be written (ENOSPC): an OSError traceback (Hydra's
    "Error executing job"), while the open's own failure was one line."""
    import errno

    from hookrun.store import paths

    def full(fd, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(paths.os, "write", full)
    with pytest.raises(ConfigError, match=rf"^output.path: cannot write the lock file '.*captures.h5.lock': {os.strerror(errno.ENOSPC)}$"):
        hookrun.run(toy_cfg(tmp_path))
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []  # no lock file left (nor held: the next run takes it)
    assert hookrun.run(toy_cfg(tmp_path)).status == "complete"


def run_in_thread(cfg: dict) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def go() -> None:
        try:
            out["result"] = hookrun.run(cfg)
        except BaseException as exc:  # noqa: BLE001
            out["error"] = exc

    thread = threading.Thread(target=go)
    thread.start()
    return thread, out


def test_a_run_starting_while_another_builds_its_model_is_refused(tmp_path):
    from toy_models import BUILDING

    BUILDING.clear()
    thread, first = run_in_thread(toy_cfg(tmp_path, "toy_models.SlowToBuild"))
    assert BUILDING.wait(60)
    with pytest.raises(ConfigError, match="another hookrun run"):
        hookrun.run(toy_cfg(tmp_path, **{"output.overwrite": True}))
    thread.join(60)
    assert first["result"].status == "complete"
    with h5py.File(first["result"].path) as f:
        assert f.attrs["status"] == "complete" and "SlowToBuild" in f.attrs["model_class"]


def test_a_file_that_appears_while_the_model_builds_is_not_replaced(tmp_path):
    from toy_models import BUILDING

    BUILDING.clear()
    thread, first = run_in_thread(toy_cfg(tmp_path, "toy_models.SlowToBuild"))
    assert BUILDING.wait(60)
    (tmp_path / "captures.h5").write_bytes(b"someone else's results")
    thread.join(60)
    assert isinstance(first.get("error"), ConfigError) and "exists" in str(first["error"])
    assert (tmp_path / "captures.h5").read_bytes() == b"someone else's results"


def test_the_file_appears_only_once_it_opens(tmp_path):
    seen = []
    real_replace = os.replace

    def replace(src, dst):  # the moment the file gets its name, it opens with plain h5py
        if str(dst).endswith("captures.h5") and str(src).endswith(".creating"):  # (not a flush's return)
            with h5py.File(src, "r", locking=False) as f:  # (this process's flush helper may hold the file's flock)
                seen.append((f.attrs["status"], f.attrs["steps_complete"], "samples/index" in f))
        return real_replace(src, dst)

    os.replace = replace
    try:
        hookrun.run(toy_cfg(tmp_path))
    finally:
        os.replace = real_replace
    assert seen == [("running", 0, True)]
    assert [p.name for p in tmp_path.iterdir()] == ["captures.h5"]


@pytest.mark.slow
def test_a_second_cli_run_with_overwrite_is_refused_while_the_first_writes(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    from conftest import ENV, run_cli

    args = ["model=custom", "model._target_=my_pkg.Net", "data=custom", "data.dataset._target_=my_pkg.MyData",
            "+data.dataset.n=8000", "+data.dataset.size=8", "data.batch_size=4", "progress=false", "hydra.run.dir=run",
            "hooks={f: {at: features.0, type: forward, actions: [record, {_target_: toy_models.sleep_action, _partial_: true, seconds: 0.1}]}}"]
    first = subprocess.Popen([sys.executable, "-m", "hookrun", *args], cwd=tmp_path, env={**os.environ, **ENV},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    path = tmp_path / "run" / "captures.h5"
    deadline = time.monotonic() + 120
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    second = run_cli(*args, "output.overwrite=true", cwd=tmp_path, env=ENV)
    assert second.returncode == 2 and "Traceback" not in second.stderr
    assert "another hookrun run (pid" in second.stderr and "is writing" in second.stderr
    first.send_signal(signal.SIGINT)  # the first run was never disturbed: it stops cleanly
    _, err = first.communicate(timeout=300)
    assert first.returncode == 130, err[-2000:]
    with h5py.File(path) as f:
        n = f["samples/index"].shape[0]
        assert f.attrs["status"] == "interrupted" and n > 0
        assert f["captures/f/features.0/output"].shape[0] == f.attrs["samples_complete"] == n
