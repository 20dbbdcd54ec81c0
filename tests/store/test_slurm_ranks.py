"""Ranks under Slurm: the tasks of an `srun` step, and what a job sends back to Hydra's submitit launchers.

The srun test starts two processes by hand with the variables an srun step gives each task (as a
real `srun -n2` on one node does; checked with Slurm 22.05), rank 1 seconds after rank 0, and
compares the merged file with the one-process run of the same command (rank_runs.ARGS).
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import pytest
from rank_runs import ARGS, ENV, captures

from hookrun.errors import ConfigError, RunError
from hookrun.output.process import Interrupted, StoreAway, every_rank


def test_hookrun_errors_come_back_whole_from_a_launchers_worker():
    """submitit pickles the job's exception and Hydra re-raises it in the sweep's process: a SIGTERM'd
    (scancel'd) job came back as `TypeError: Interrupted.__init__() missing 2 required positional
    arguments`, exit 2, instead of the interrupted line and exit 143."""
    sent = [Interrupted(signal.SIGTERM, Path("/run/captures.rank-00000.h5"), 31),
            Interrupted(signal.SIGINT, None, 0, resumed_from=Path("/run/captures.h5")),
            StoreAway("the object store stayed away"), every_rank(ConfigError("data.limit=0: give 1 or more")),
            RunError("a batch failed")]
    for exc in sent:
        back = pickle.loads(pickle.dumps(exc))
        assert type(back) is type(exc) and str(back) == str(exc) and back.args == exc.args
        assert back.exit_code == exc.exit_code and back.__dict__ == exc.__dict__
    assert pickle.loads(pickle.dumps(sent[0])).exit_code == 143 and sent[0].signum == signal.SIGTERM
    assert pickle.loads(pickle.dumps(sent[3])).every_rank is True


def no_launcher() -> dict[str, str]:
    """This environment without any launcher's variables (the tests may run inside a Slurm job)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SUBMITIT_", "TORCHELASTIC_"))
            and k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "HOOKRUN_STARTED")}


def slurm_task(rank: int, job: str) -> dict[str, str]:
    """The variables `srun -n2` gives task `rank` on one node (none of torchrun's or submitit's)."""
    return {**no_launcher(), **ENV, "SLURM_JOB_ID": job, "SLURM_STEP_ID": "0", "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank),
            "SLURM_NTASKS": "2", "SLURM_STEP_NUM_TASKS": "2"}


@pytest.mark.slow
def test_srun_tasks_that_start_seconds_apart_share_one_run_folder(tmp_path, single):
    """Without hydra.run.dir each task names its folder outputs/DATE/TIME by its own clock: rank 1,
    started 2 s after rank 0, made a second folder, and both ranks waited 15 minutes for each other
    in their own FileStore. Now the step's ranks take rank 0's time, as torchrun's do."""
    job = f"{os.getpid()}{int(time.time())}"
    procs = []
    for rank in range(2):
        procs.append(subprocess.Popen([sys.executable, "-m", "hookrun", *ARGS], cwd=tmp_path, env=slurm_task(rank, job),
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        time.sleep(2.5 if rank == 0 else 0)
    try:
        outs = [p.communicate(timeout=150) for p in procs]
    finally:
        for p in procs:
            p.kill()
    folders = sorted(p.relative_to(tmp_path) for p in tmp_path.glob("outputs/*/*"))
    assert len(folders) == 1, folders
    assert [p.returncode for p in procs] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
    merged, one = captures(tmp_path / folders[0] / "captures.h5"), captures(single)
    assert sorted(merged) == sorted(one)
    for name in one:
        for x, y in zip(merged[name], one[name], strict=True):
            assert x.dtype == y.dtype and x.shape == y.shape, name
            assert (x == y).all(), name
    assert not list(tmp_path.glob(".hookrun-ranks-*"))  # the start's store file leaves the working folder


@pytest.mark.slow
def test_a_requeued_job_does_not_read_the_killed_launchs_store(tmp_path, single):
    """A requeued Slurm job keeps its id and numbers its steps from 0 again. Launch 1: rank 1 is
    stopped by SIGTERM (it reports `interrupted`), rank 0 is SIGKILLed (the FileStore in the run
    folder is never removed). The requeue (SLURM_RESTART_COUNT=1) resumes: rank 0 read rank 1's old
    `interrupted` at once, wrote an incomplete view while rank 1 was still running, and the run
    ended with every shard complete under a view that says `incomplete`."""
    job = f"{os.getpid()}{int(time.time())}"

    def launch(restart: str, extra: dict[str, dict[str, str]]) -> list[subprocess.Popen]:
        procs = []
        for rank in range(2):
            env = {**slurm_task(rank, job), "RANK": str(rank), **extra[str(rank)]}  # RANK: rank_helpers' switches
            if restart:
                env["SLURM_RESTART_COUNT"] = restart
            procs.append(subprocess.Popen([sys.executable, "-m", "hookrun", *ARGS, "hydra.run.dir=run", "resume=true"],
                                          cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        return procs

    first = launch("", {"0": {"HOOKRUN_TEST_KILL": "0:2"}, "1": {"HOOKRUN_TEST_WAIT_STOP": "1:4"}})  # (never complete)
    deadline = time.monotonic() + 120
    while not (tmp_path / "run" / "captures.rank-00001.h5").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)
    first[1].send_signal(signal.SIGTERM)
    outs = [p.communicate(timeout=120) for p in first]
    assert [p.returncode for p in first] == [-9, 143], outs[1][1][-2000:]
    second = launch("1", {"0": {}, "1": {"HOOKRUN_TEST_SLEEP": "1:5:4"}})
    outs = [p.communicate(timeout=150) for p in second]
    assert [p.returncode for p in second] == [0, 0], outs[0][1][-2000:]
    with h5py.File(tmp_path / "run" / "captures.h5") as f:
        assert f.attrs["status"] == "complete", dict(f.attrs)
    merged, one = captures(tmp_path / "run" / "captures.h5"), captures(single)
    for name in one:
        for x, y in zip(merged[name], one[name], strict=True):
            assert x.shape == y.shape and (x == y).all(), name


@pytest.mark.slow
def test_a_stopped_sweep_job_names_the_sweeps_folder_to_resume_with(tmp_path, single):
    """A SIGTERMed job of a sweep said "(and the same hydra.run.dir)": a sweep's job folder is found
    again by hydra.sweep.dir (the same command with hydra.run.dir and resume=true starts a new sweep)."""
    env = {**ENV, "HOOKRUN_TEST_WAIT_STOP": "0:2"}  # its last batch lasts until the SIGTERM
    proc = subprocess.Popen([sys.executable, "-m", "hookrun", "-m", *ARGS, "hydra.sweep.dir=sweep"], cwd=tmp_path,
                            env={**no_launcher(), **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (tmp_path / "sweep" / "0" / "captures.h5").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-2000:]
    assert "is marked 'interrupted': run the same command with resume=true (and the same hydra.sweep.dir) to go on" in err
    again = subprocess.run([sys.executable, "-m", "hookrun", "-m", *ARGS, "hydra.sweep.dir=sweep", "resume=true"],
                           cwd=tmp_path, env={**no_launcher(), **ENV}, capture_output=True, text=True, timeout=150)
    assert again.returncode == 0, again.stderr[-2000:]
    merged, one = captures(tmp_path / "sweep" / "0" / "captures.h5"), captures(single)
    for name in one:
        for x, y in zip(merged[name], one[name], strict=True):
            assert x.shape == y.shape and (x == y).all(), name


@pytest.mark.slow
def test_srun_tasks_in_a_folder_they_cannot_write_still_run_into_hydra_run_dir(tmp_path, single):
    """The start-time agreement keeps a file in the working folder; where that folder cannot be
    written (no outputs/DATE/TIME could be made there either) a run given hydra.run.dir goes on."""
    readonly = Path("/sys")
    try:  # (root writes where permissions say no: try it)
        (readonly / f".hookrun-probe-{os.getpid()}").touch()
    except OSError:
        pass
    else:
        (readonly / f".hookrun-probe-{os.getpid()}").unlink()
        pytest.skip("no folder here that cannot be written")
    job = f"{os.getpid()}{int(time.time())}"
    procs = [subprocess.Popen([sys.executable, "-m", "hookrun", *ARGS, f"hydra.run.dir={tmp_path / 'run'}"], cwd=readonly,
                              env=slurm_task(rank, job), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in range(2)]
    outs = [p.communicate(timeout=150) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][1][-2000:]
    merged, one = captures(tmp_path / "run" / "captures.h5"), captures(single)
    for name in one:
        for x, y in zip(merged[name], one[name], strict=True):
            assert x.shape == y.shape and (x == y).all(), name
