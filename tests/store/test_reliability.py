"""Reliability: clean stops, resume bit for bit, kill -9 at any moment, a full disk, bad input."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
from conftest import ENV, HELPERS, make_cfg, run_cli

import hookrun
from hookrun.errors import ConfigError, HookrunError, RunError
from hookrun.output.process import Interrupted
from hookrun.store.live import settled

GRAD = {"mode": "grad", "loss": {"_target_": "hookrun.runner.losses.cross_entropy", "_partial_": True}}


def rich_hooks(stop_at=None, told=False):
    """Hooks that exercise every kind of row layout: aligned, every-Nth, limited, noisy."""
    hooks = {
        "fmap": {"at": "layer1.0", "type": "forward", "actions": [{"name": "record", "what": "output"}]},
        "sparse": {"at": "layer2", "type": "forward", "actions": [{"name": "record", "what": "output", "every": 2, "reduce": "mean"}]},
        "first": {"at": "fc", "type": "forward", "actions": [{"name": "record", "what": "output", "limit": 6}]},
        "noisy": {"at": "layer3", "type": "forward_pre", "actions": [{"name": "replace_input", "op": "noise", "std": 0.5, "seed": 3}, "record"]},
    }
    if stop_at is not None:
        hooks["stop"] = {"at": "conv1", "type": "forward", "actions": [{"_target_": "toy_models.signal_at", "_partial_": True, "step": stop_at}]}
    if told:
        hooks["stop"] = {"at": "conv1", "type": "forward", "actions": [{"_target_": "toy_models.signal_when_told", "_partial_": True}]}
    return hooks


def datasets_of(path: Path) -> dict[str, np.ndarray]:
    """Every dataset's values; the run's /checksums table as each capture's own rows of it (its
    [end_row, xxh3] per batch): which number a capture gets there depends on the order the writer
    first met it, which a resumed file's replay does not keep."""
    from hookrun.store.verify import table_of
    from hookrun.store.writer import TABLE

    out = {}

    def take(name: str, obj) -> None:
        if not isinstance(obj, h5py.Dataset) or "/" + name == TABLE:
            return
        out[name] = obj[()]
        if obj.attrs.get("digest", ""):
            out[name + " (checksums)"] = table_of(obj, obj.attrs["digest"])

    with h5py.File(path) as f:
        f.visititems(take)
    return out


def assert_same_captures(a: Path, b: Path) -> None:
    da, db = datasets_of(a), datasets_of(b)
    assert sorted(da) == sorted(db)
    for name in da:
        assert da[name].dtype == db[name].dtype, name
        np.testing.assert_array_equal(da[name], db[name], err_msg=name)


def test_sigint_finishes_the_batch_flushes_and_removes_hooks(tmp_path, checkpoint):
    from toy_models import LAST_MODEL

    cfg = make_cfg(tmp_path, "", {"b": {"at": "body", "type": "forward", "actions": ["record"]},
                                   "stop": {"at": "body", "type": "forward", "actions": [{"_target_": "toy_models.signal_at", "_partial_": True, "step": 1}]}})
    cfg["model"] = {"_target_": "toy_models.RememberedNet"}
    cfg["data"]["dataset"] = {"_target_": "toy_models.SignedRows"}
    before = signal.getsignal(signal.SIGINT)  # Python's default, or SIG_IGN where pytest runs in the background
    with pytest.raises(Interrupted, match="interrupted by SIGINT after 2 batches") as info:
        hookrun.run(cfg)
    assert info.value.exit_code == 130
    with h5py.File(tmp_path / "captures.h5") as f:
        assert f.attrs["status"] == "interrupted" and f.attrs["steps_complete"] == 2
        assert f["captures/b/body/output"].shape[0] == 8 and f["samples/index"].shape[0] == 8
    (model,) = LAST_MODEL
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules() if m is not model.head)
    assert signal.getsignal(signal.SIGINT) is before  # handlers restored


def test_resume_equals_an_uninterrupted_run_bit_for_bit(tmp_path, checkpoint):
    from toy_models import STOP_AT

    full = hookrun.run(make_cfg(tmp_path / "full", checkpoint, rich_hooks(told=True), **{"data.batch_size": 2})).path
    cfg = make_cfg(tmp_path / "part", checkpoint, rich_hooks(told=True), **{"data.batch_size": 2})
    STOP_AT[:] = [3]
    with pytest.raises(Interrupted):
        hookrun.run(cfg)
    with h5py.File(cfg["output"]["path"]) as f:
        assert f.attrs["status"] == "interrupted" and f["samples/index"].shape[0] == 8
    cfg["resume"] = True
    result = hookrun.run(cfg)
    assert result.status == "complete" and result.steps == 2  # batches 4 and 5 of 6
    with h5py.File(result.path) as f:
        assert f.attrs["status"] == "complete"
        assert f["captures/sparse/layer2/output.index"].shape[0] == 6  # every=2: batches 0, 2, 4
        assert f["captures/first/fc/output"].shape[0] == 6  # limit=6 held across the resume
    assert_same_captures(full, result.path)
    assert not Path(str(result.path) + ".resuming").exists()


def test_resume_of_a_complete_run_does_nothing(tmp_path, checkpoint):
    cfg = make_cfg(tmp_path, checkpoint, rich_hooks())
    first = hookrun.run(cfg).path
    before = first.read_bytes()
    cfg["resume"] = True
    assert hookrun.run(cfg).status == "complete"
    assert first.read_bytes() == before


def test_resume_refuses_a_different_config_naming_the_keys(tmp_path, checkpoint):
    cfg = make_cfg(tmp_path, checkpoint, rich_hooks(stop_at=1))
    with pytest.raises(Interrupted):
        hookrun.run(cfg)
    cfg.update(resume=True, seed=5, hooks=rich_hooks(stop_at=1) | {"extra": {"at": "fc", "type": "forward"}})
    cfg["data"]["batch_size"] = 3
    with pytest.raises(ConfigError, match=r"resume: the config differs .* in data.batch_size, hooks.extra.at, hooks.extra.type, seed;"):
        hookrun.run(cfg)


def test_resume_without_a_file_starts_from_the_beginning(tmp_path, checkpoint):
    result = hookrun.run(make_cfg(tmp_path, checkpoint, rich_hooks(), resume=True))
    assert result.status == "complete" and result.steps == 3


def can_mount_tmpfs(folder: Path) -> bool:
    folder.mkdir(exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(folder)], capture_output=True).returncode == 0


def test_full_disk_fails_cleanly_keeping_what_was_flushed(tmp_path, checkpoint):
    small = tmp_path / "small"
    if not can_mount_tmpfs(small):
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        hooks = {"fmap": {"at": "layer1", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}
        over = {"data.dataset.n": 600, "output.flush_every": 1, "output.path": str(small / "c.h5")}
        with pytest.raises(RunError, match="no space left on the device") as info:
            hookrun.run(make_cfg(tmp_path, checkpoint, hooks, **over))
        assert "the file keeps every batch" in str(info.value)
        ref = hookrun.run(make_cfg(tmp_path, checkpoint, hooks, **{**over, "output.path": str(tmp_path / "ref.h5")})).path
        with h5py.File(small / "c.h5") as f, h5py.File(ref) as r:
            assert f.attrs["status"] == "failed"
            n = f["samples/index"].shape[0]
            assert n > 0 and n % 4 == 0
            np.testing.assert_array_equal(f["captures/fmap/layer1/output"][:n], r["captures/fmap/layer1/output"][:n])
    finally:
        subprocess.run(["umount", str(small)], capture_output=True)


KILL_ARGS = [
    "model=custom", "model._target_=my_pkg.Net", "data=custom", "data.dataset._target_=my_pkg.MyData",
    "+data.dataset.n=200", "+data.dataset.size=8", "data.batch_size=4", "progress=false",
    "hooks={f: {at: features.0, type: forward, actions: [{name: record, what: output}]}, "
    "e: {at: features.2, type: forward, actions: [{name: record, what: output, every: 3, reduce: mean}]}, "
    "h: {at: head, type: forward, actions: [{name: record, what: output, limit: 30}]}, "
    "s: {at: head, type: forward, actions: [{_target_: toy_models.sleep_action, _partial_: true, seconds: 0.02}]}}",
]


def fork_runs(tmp_path: Path, runs: list[dict], args: list[str] = KILL_ARGS, side_by_side: int = 0) -> list[dict]:
    """Runs of `python -m hookrun ARGS` forked from one warm process (tests/helpers/fork_runs.py);
    `side_by_side`: that many at once (runs without a kill, whose timing does not matter)."""
    import json

    plan = {"args": args, "runs": runs, "side_by_side": side_by_side}
    proc = subprocess.run([sys.executable, str(HELPERS / "fork_runs.py")], input=json.dumps(plan),
                          cwd=tmp_path, env={**os.environ, **ENV}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.splitlines()[-1])


def assert_a_prefix_of(path: Path, ref: Path) -> None:
    """An unfinished file: opens with plain h5py (and h5ls); the batches its counts name are whole,
    aligned with /samples/index and equal to the uninterrupted run's; every length equals its count.
    (A kill inside a flush leaves captures.h5.flushing, whose `previous_flush` batches are whole.)"""
    if shutil.which("h5ls"):  # Debian's hdf5-tools, where installed
        assert subprocess.run(["h5ls", "-r", str(path)], capture_output=True).returncode == 0
    with h5py.File(path) as f, h5py.File(ref) as r:
        n = int(f.attrs["samples_complete"])
        if path.suffix == ".flushing":  # killed inside a flush: the flush before it is whole
            n = int(f.attrs["previous_flush"][1])
        else:  # every length agrees with the counts
            assert n == f["samples/index"].shape[0] == f["samples/step"].shape[0] <= r["samples/index"].shape[0]
            assert f.attrs["steps_complete"] == n // 4
        assert n % 4 == 0
        np.testing.assert_array_equal(f["samples/index"][:n], np.arange(n))
        np.testing.assert_array_equal(f["samples/step"][:n], np.arange(n) // 4)
        for name in ("captures/f/features.0/output", "captures/h/head/output"):
            if n:
                assert f[name].shape[0] >= min(n, 30 if "head" in name else n)
                np.testing.assert_array_equal(f[name][:n], r[name][:n])


@pytest.mark.slow
def test_kill_9_at_30_moments_leaves_readable_files_that_resume(tmp_path):
    """SIGKILL at 30 moments of a run's life: 5 in its first half second (Hydra, the model), 25
    spread over the life of its file from the moment it appears (the first 2 seconds, before the
    first timed flush, included); each run is then resumed to the end."""
    moments = [{"dir": f"kill_{i}", "kill_after": 0.1 * i} for i in range(5)]  # Hydra, the model
    moments += [{"dir": f"kill_share_{i}", "kill_after_share": 0.04 * i} for i in range(25)]  # from the file's creation on
    results = fork_runs(tmp_path, [{"dir": "ref"}, *moments])
    assert results[0]["code"] == 0, results[0]
    ref = tmp_path / "ref/captures.h5"
    killed_with_a_file = 0
    for res in results[1:]:
        path = tmp_path / res["dir"] / "captures.h5"
        if not path.exists() and path.with_name("captures.h5.flushing").exists():
            path = path.with_name("captures.h5.flushing")
        if not path.exists():
            continue
        try:
            with h5py.File(path) as f:
                complete = f.attrs["status"] == "complete" and path.suffix != ".flushing"
            if complete:  # killed after the file was closed: it must then hold the whole run
                assert_same_captures(ref, path)
            else:
                killed_with_a_file += 1
                assert_a_prefix_of(path, ref)
        except Exception as exc:
            raise AssertionError(f"killed at {res['kill_after']:.2f} s (the reference's file appeared at "
                                 f"{results[0]['file_at']:.2f} s): {type(exc).__name__}: {exc}") from exc
    assert killed_with_a_file >= 15, results  # (the others before the file appeared, or after it was closed)
    # the resumes run 6 at a time: most of a run's life is its hook's sleep, which they share
    resumed = fork_runs(tmp_path, [{"dir": res["dir"], "extra": ["resume=true"]} for res in results[1:]], side_by_side=6)
    assert [res["dir"] for res in resumed] == [res["dir"] for res in results[1:]]
    for res in resumed:
        assert res["code"] == 0, res
        assert_same_captures(ref, tmp_path / res["dir"] / "captures.h5")


def group_ends(group: int, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.slow
@pytest.mark.parametrize("signum, code, workers", [(signal.SIGTERM, 143, 0), (signal.SIGINT, 130, 0), (signal.SIGINT, 130, 2)])
def test_signals_from_outside_exit_with_128_plus_signal(tmp_path, signum, code, workers):
    """With DataLoader workers the signal goes to the whole process group, as Ctrl-C in a terminal does."""
    args = ["model=custom", "model._target_=my_pkg.Net", "data=custom", "data.dataset._target_=my_pkg.MyData",
            "+data.dataset.n=400", "data.batch_size=4", f"data.num_workers={workers}", "output.flush_every=1",
            "progress=false", "hydra.run.dir=run",
            "hooks={f: {at: features, type: forward, actions: [record, {_target_: toy_models.sleep_action, _partial_: true, seconds: 0.05}]}}"]
    proc = subprocess.Popen([sys.executable, "-m", "hookrun", *args], cwd=tmp_path, env={**os.environ, **ENV},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    path = tmp_path / "run" / "captures.h5"
    deadline = time.time() + 120
    while time.time() < deadline:
        time.sleep(0.2)
        if path.exists():
            try:
                with h5py.File(path, "r", locking=False) as f:
                    if f.attrs.get("steps_complete", 0) >= 2:
                        break
            except Exception:  # noqa: BLE001 (read between two of the writer's writes: KeyError too, not only OSError)
                pass
    if workers:
        os.killpg(proc.pid, signum)
    else:
        proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err[-2000:]
    assert "resume=true" in err and "Traceback" not in err
    if workers:
        assert group_ends(proc.pid), "DataLoader workers outlived the interrupted run"
    with h5py.File(path) as f:
        assert f.attrs["status"] == "interrupted"
        assert f["samples/index"].shape[0] == f.attrs["samples_complete"] == 4 * f.attrs["steps_complete"]
    resumed = run_cli(*args, "resume=true", cwd=tmp_path, env=ENV)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    with h5py.File(path) as f:
        assert f.attrs["status"] == "complete" and f["samples/index"].shape[0] == 400


@pytest.mark.parametrize("path", ["ABSOLUTE", "../same.h5", "../../same.h5"])
def test_an_output_path_outside_the_jobs_folder_in_a_multirun_is_refused(tmp_path, path):
    """../same.h5 passed (only an absolute path was refused): each job replaced the last one's file, and
    inspect credited every job with the last one's data."""
    path = str(tmp_path / "same.h5") if path == "ABSOLUTE" else path
    proc = run_cli("-m", "seed=0,1", "data.limit=1", f"output.path={path}", f"hydra.sweep.dir={tmp_path / 'sw'}",
                   "hooks={l: {at: fc, type: forward, actions: [record]}}", cwd=tmp_path)
    assert proc.returncode == 2
    assert "every job of a multirun would write the same file" in proc.stderr
    assert not list(tmp_path.rglob("same.h5"))


def test_an_output_path_with_the_job_number_leaves_the_jobs_folder_one_file_each(tmp_path):
    proc = run_cli("-m", "seed=0,1", "data.limit=1", "output.path=../job_${hydra:job.num}.h5",
                   f"hydra.sweep.dir={tmp_path / 'sw'}", "hooks={l: {at: fc, type: forward, actions: [record]}}",
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert sorted(p.name for p in (tmp_path / "sw").glob("job_*.h5")) == ["job_0.h5", "job_1.h5"]
    sweep = hookrun.open_sweep(tmp_path / "sw")  # (the sweep's readers found no file: "no file" for each job)
    for job in sweep.jobs:
        assert job.file == (tmp_path / "sw" / f"job_{job.num}.h5").resolve()
        with h5py.File(job.file) as f:
            assert f.attrs["status"] == "complete" and f"seed: {job.overrides['seed']}" in f.attrs["config"]


def test_every_error_is_a_hookrun_error(tmp_path, checkpoint):
    """Spot checks of item 5's list not covered elsewhere."""
    bad = [
        # a number that is no number: refused before any batch (it failed at batch 0 in torch before)
        ({"hooks": {"x": {"at": "fc", "type": "forward", "actions": [{"name": "modify_output", "op": "scale", "factor": "big"}]}}},
         r"^hooks\.x\.actions\.0: factor='big' is not a number; give e.g. factor: 0\.5$"),
        # clamp's bounds the wrong way round: every value would become max
        ({"hooks": {"x": {"at": "fc", "type": "forward", "actions": [{"name": "modify_output", "op": "clamp", "min": 1, "max": -1}]}}},
         r"op clamp: min=1 is above max=-1; give min <= max"),
        # a negative spread: torch.randn * -1 is noise all the same, so std=-1 ran as std=1
        ({"hooks": {"x": {"at": "fc", "type": "forward", "actions": [{"name": "modify_output", "op": "noise", "std": -1}]}}},
         r"op noise: std=-1 is a standard deviation; give a number >= 0"),
        # well-typed, but not the module's width: at the batch, both widths named (was PyTorch's RuntimeError)
        ({"hooks": {"x": {"at": "fc", "type": "forward", "actions": [{"name": "modify_output", "op": "add", "value": [1.0, 2.0]}]}}},
         r"op add at fc: value has 2 entries but dim 1 of the output \(4, 10\) has 10; give 10 entries"),
    ]
    for over, message in bad:
        cfg = make_cfg(tmp_path, checkpoint, **over)
        with pytest.raises(HookrunError, match=message):
            hookrun.run(cfg)


@pytest.mark.skipif(os.name != "posix", reason="fork and SIGKILL")
def test_a_resumed_run_killed_again_keeps_the_batches_it_added(tmp_path, checkpoint):
    """The resumed file replaced the old one only at the end of the run: a resume killed with SIGKILL left
    its batches in captures.h5.resuming, and the next resume started again from the first file's."""
    from toy_models import STOP_AT

    full = hookrun.run(make_cfg(tmp_path / "full", checkpoint, rich_hooks(told=True), **{"data.batch_size": 2})).path
    cfg = make_cfg(tmp_path / "part", checkpoint, rich_hooks(told=True), **{"data.batch_size": 2, "output.flush_every": 1})
    STOP_AT[:] = [1]
    with pytest.raises(Interrupted):
        hookrun.run(cfg)
    path = Path(cfg["output"]["path"])
    with h5py.File(path) as f:
        assert f.attrs["steps_complete"] == 2
    cfg["resume"] = True
    pid = os.fork()
    if pid == 0:  # the resume, killed with SIGKILL in its last batch (signal_when_told's SIGINT made a SIGKILL)
        try:
            kill = os.kill
            os.kill = lambda p, s: kill(p, signal.SIGKILL)
            STOP_AT[:] = [5]
            hookrun.run(cfg)
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    assert not Path(str(path) + ".resuming").exists()
    settled(path)  # the killed writer's flush helper holds the file's lock until it has applied its last message
    with h5py.File(path) as f:  # (the writer thread flushes each batch; at least one of batches 2 to 4 is on disk)
        kept = int(f.attrs["steps_complete"])
        assert f.attrs["status"] == "running" and kept > 2 and f["samples/index"].shape[0] == 2 * kept
    result = hookrun.run(cfg)
    assert result.status == "complete" and result.steps == 6 - kept
    assert_same_captures(full, result.path)
