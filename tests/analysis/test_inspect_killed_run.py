"""`python -m hookrun.inspect` of a killed run's file said `status running` (the file's attribute) for a
process that was long dead, while the report, plot and `--verify` tell a killed run by its lock, which
no process holds (docs/format.md: a killed process's lock is dropped by the operating system). Now it
says `stopped: no process holds it (killed?)`, and `running` while a process holds the lock.
References: a real run SIGKILLed mid-way (its exit status), and a lock held by a plain flock process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import h5py
from conftest import HELPERS, ROOT

ENV = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{HELPERS}", "OMP_NUM_THREADS": "1"}
HOOKS = ("hooks={r: {at: head, type: forward, actions: [{name: record, what: output}]},"
         " kill: {at: head, type: forward, actions: [{_target_: rank_helpers.kill_when_told, _partial_: true}]}}")


def inspect(path) -> str:
    proc = subprocess.run([sys.executable, "-m", "hookrun.inspect", "--no-stats", str(path)], capture_output=True,
                          text=True, env=ENV, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()[1]


def test_inspect_says_a_killed_run_stopped_and_a_held_one_running(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "hookrun", "model=custom", "model._target_=my_pkg.Net", "+model.width=4",
                           "data=custom", "data.dataset._target_=my_pkg.MyData", "+data.dataset.n=12", "data.batch_size=2",
                           "device=cpu", "progress=false", "output.flush_every=1", HOOKS, "hydra.run.dir=run"],
                          cwd=tmp_path, capture_output=True, text=True, env={**ENV, "HOOKRUN_TEST_KILL": "0:3"}, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    path = tmp_path / "run" / "captures.h5"
    with h5py.File(path, "r") as f:
        assert f.attrs["status"] == "running"
        samples = int(f.attrs["samples_complete"])
    assert inspect(path) == f"  status    stopped: no process holds it (killed?)   (3 batches, {samples} samples)"
    holder = subprocess.Popen([sys.executable, "-c", (  # a live writer as docs/format.md describes it: flock, its pid
        "import fcntl, os, sys, time\nfd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\nfcntl.flock(fd, fcntl.LOCK_EX)\n"
        "os.write(fd, f'{os.getpid()}\\n'.encode())\nprint('held', flush=True)\ntime.sleep(600)"), f"{path}.lock"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert inspect(path) == f"  status    running   (3 batches, {samples} samples)"
    finally:
        holder.kill()
        holder.wait()
