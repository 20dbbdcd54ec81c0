"""Many processes: shards of whole batches, the merged virtual-dataset view, faults and bad input.

The end-to-end tests run the real CLI under torchrun and under Hydra's submitit_local launcher and
compare the merged file with a one-process run of the same command, capture by capture, bit for bit.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
from conftest import ROOT
from rank_runs import ARGS, ENV, TORCHRUN, captures, cli

import hookrun
from hookrun.config import load as load_config
from hookrun.errors import ConfigError, HookrunError, NotFoundError, RunError
from hookrun.output.process import Ranks, detect
from hookrun.output.ranks import shard_path
from hookrun.output.shards import ShardRun, differing, shard_batches
from hookrun.store.live import settled
from hookrun.store.merge import build_view


# -- units ------------------------------------------------------------------------------------------
def test_shards_are_contiguous_whole_batches_covering_every_batch_once():
    for n in range(1, 30):
        for world in range(1, n + 1):
            blocks = [shard_batches(n, world, r) for r in range(world)]
            assert [b for block in blocks for b in block] == list(range(n))
            assert max(map(len, blocks)) - min(map(len, blocks)) <= 1 and min(map(len, blocks)) >= 1


def test_more_processes_than_batches_is_one_clear_line():
    with pytest.raises(ConfigError, match=r"the run has 4 processes .* only 3 batch\(es\) .* run at most 3 processes"):
        shard_batches(3, 4, 0)


def test_rank_comes_from_torchrun_submitit_or_srun():
    assert detect({}) == Ranks()
    assert detect({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "TORCHELASTIC_RUN_ID": "x"}).rank == 1
    r = detect({"SUBMITIT_LOCAL_JOB_ID": "7", "SUBMITIT_LOCAL_NTASKS": "2", "SUBMITIT_LOCAL_GLOBALID": "1", "SUBMITIT_LOCAL_LOCALID": "1"})
    assert (r.rank, r.world, r.launcher) == (1, 2, "submitit")
    r = detect({"SLURM_PROCID": "5", "SLURM_STEP_NUM_TASKS": "8", "SLURM_LOCALID": "1", "SLURM_JOB_ID": "9"})
    assert (r.rank, r.world, r.local_rank, r.launcher) == (5, 8, 1, "slurm")
    assert not detect({"SLURM_PROCID": "0", "SLURM_JOB_ID": "9"}).many  # a batch script, not an srun step
    assert shard_path(Path("a/captures.h5"), 3) == Path("a/captures.rank-00003.h5")


def test_ranks_with_different_configs_are_refused_naming_the_keys(tmp_path):
    run = ShardRun(load_config({"model": {"_target_": "my_pkg.Net"}, "data": {"dataset": {"_target_": "my_pkg.MyData"}},
                                            "output": {"path": str(tmp_path / "c.h5")}}), Ranks(0, 2, 0, "torchrun", "t"))
    with pytest.raises(ConfigError, match=r"rank 1 has a different config from rank 0 in data.batch_size, seed;"):
        run.check_same_config(["seed: 0\ndata:\n  batch_size: 4\n", "seed: 1\ndata:\n  batch_size: 5\n"])
    assert differing({"a": {"b": 1}}, {"a": {"b": 1}}) == []


def test_dataparallel_and_compiled_models_keep_their_module_names(tmp_path):
    import torch

    import my_pkg

    x = torch.stack([my_pkg.MyData(n=4)[i][0] for i in range(4)])
    torch.manual_seed(0)  # the run's seed, before the model is built
    expected = my_pkg.Net(width=4).features[0](x).detach().numpy()
    for target in ("rank_helpers.compiled_net", "rank_helpers.data_parallel_net"):
        cfg = {"model": {"_target_": target}, "data": {"dataset": {"_target_": "my_pkg.MyData", "n": 4}, "batch_size": 4},
               "device": "cpu", "progress": False, "output": {"path": str(tmp_path / f"{target}.h5")},
               "hooks": {"f": {"at": "features.0", "type": "forward", "actions": ["record"]}}}
        hookrun.run(cfg)  # `at: features.0`, not module.features.0 / _orig_mod.features.0
        with h5py.File(tmp_path / f"{target}.h5") as f:
            np.testing.assert_array_equal(f["captures/f/features.0/input"][:], x.numpy())
            np.testing.assert_allclose(f["captures/f/features.0/output"][:], expected, rtol=1e-6, atol=1e-6)


# -- end to end -------------------------------------------------------------------------------------
def assert_same(merged: Path, single: Path) -> None:
    a, b = captures(merged), captures(single)
    assert sorted(a) == sorted(b)
    for name in a:
        for x, y in zip(a[name], b[name], strict=True):
            assert x.dtype == y.dtype and x.shape == y.shape, name
            np.testing.assert_array_equal(x, y, err_msg=name)


def stats_of(a: np.ndarray) -> dict:
    a = a.astype(np.float64)
    return {"mean": a.mean(), "std": a.std(), "min": a.min(), "max": a.max(), "zeros": float((a == 0).mean())}


def patch_from(source: Path, out: Path) -> np.ndarray:
    """A one-process run whose features.0 output is patched from `source`, with its head recorded."""
    cfg = {"model": {"_target_": "my_pkg.Net", "width": 4}, "device": "cpu", "progress": False, "seed": 1,
           "data": {"dataset": {"_target_": "my_pkg.MyData", "n": 22}, "batch_size": 8},
           "output": {"path": str(out)},
           "hooks": {"p": {"at": "features.0", "type": "forward",
                           "actions": [{"name": "modify_output", "op": "patch", "source": str(source), "hook": "fmap"}]},
                     "h": {"at": "head", "type": "forward", "actions": [{"name": "record", "what": "output"}]}}}
    hookrun.run(cfg)
    with h5py.File(out) as f:
        return f["captures/h/head/output"][:]


@pytest.mark.slow
def test_torchrun_two_ranks_equal_one_process_and_the_view_survives_a_move(tmp_path, single, capsys):
    proc = cli(*ARGS, cwd=tmp_path, launcher=TORCHRUN)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = [p.parent for p in tmp_path.glob("outputs/*/*/captures.h5")]  # one folder for both ranks
    assert sorted(p.name for p in run_dir.glob("*.h5")) == ["captures.h5", "captures.rank-00000.h5", "captures.rank-00001.h5"]
    merged = run_dir / "captures.h5"
    with h5py.File(merged) as f:
        assert f.attrs["status"] == "complete" and f.attrs["world_size"] == 2
        np.testing.assert_array_equal(f["samples/index"][:], np.arange(22))
        assert f["captures/fmap/features.0/output"].is_virtual
        assert list(f["captures/pg/head.weight/grad"].attrs["shard_rows"]) == [3, 3]  # per-step rows, by rank
        with h5py.File(single) as one:  # the run's own notes, as the one process wrote them (they were left out)
            assert [f.attrs[k] for k in ("hooks_not_fired", "hooks_skipped")] == \
                [one.attrs[k] for k in ("hooks_not_fired", "hooks_skipped")]
    assert_same(merged, single)
    with hookrun.open_run(run_dir) as run:  # hookrun's reader, as on a one-process file
        assert run.status == "complete" and run["fmap", "features.0", "output"].shape == (22, 4, 32, 32)
        with h5py.File(single) as f:
            np.testing.assert_array_equal(run.index("pg", "head.weight", "grad"), np.arange(6))
            want = stats_of(f["captures/fmap/features.0/output"][:])
            got = run.stats("fmap/features.0/output")
            assert {k: got[k] for k in want} == pytest.approx(want)
    patched = [patch_from(source, tmp_path / f"patched-{i}.h5") for i, source in enumerate((merged, single))]
    np.testing.assert_array_equal(*patched)  # op: patch reads the view's rows like the one-process file's
    moved = tmp_path / "elsewhere"
    shutil.move(run_dir, moved)
    assert_same(moved / "captures.h5", single)  # relative source names: the folder moves as a whole
    (moved / "captures.rank-00001.h5").rename(moved / "gone.h5")
    with pytest.raises(HookrunError, match=r"view over 2 shard files and 1 of them are missing .* captures.rank-00001.h5"):
        hookrun.open_run(moved)
    from hookrun.cli.inspect_command import main as inspect_main

    capsys.readouterr()  # `python -m hookrun.inspect`'s main, in this process (exit_process runs it alike)
    code, err = inspect_main([str(moved / "captures.h5")]), capsys.readouterr().err
    assert code != 0 and "missing" in err and "Traceback" not in err


@pytest.mark.slow
def test_submitit_local_two_tasks_equal_one_process(tmp_path, single):
    proc = cli(*ARGS, "hydra/launcher=submitit_local", "hydra.launcher.tasks_per_node=2", cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (merged,) = tmp_path.glob("outputs/multirun/*/*/0/captures.h5")
    assert len(list(merged.parent.glob("captures.rank-*.h5"))) == 2
    assert_same(merged, single)


@pytest.mark.slow
def test_a_killed_rank_then_resume_gives_the_same_file(tmp_path, single):
    proc = cli(*ARGS, "hydra.run.dir=run", cwd=tmp_path, launcher=TORCHRUN, env={"HOOKRUN_TEST_KILL": "1:5"})
    assert proc.returncode != 0
    run_dir = tmp_path / "run"
    settled(run_dir / "captures.rank-00001.h5")  # (the killed rank's flush helper lets go of its file)
    with h5py.File(run_dir / "captures.rank-00001.h5") as f:  # SIGKILL in its third batch: never 'complete'
        assert f.attrs["status"] == "running" and f.attrs["steps_complete"] == 2
    with h5py.File(run_dir / "captures.h5") as f:  # rank 0 was stopped by torchrun and wrote the view
        assert f.attrs["status"] == "incomplete"
        assert "captures.rank-00001.h5 (running, 2 batches)" in f.attrs["incomplete_shards"]
    rank0 = (run_dir / "captures.rank-00000.h5").stat().st_mtime_ns
    done0 = h5py.File(run_dir / "captures.rank-00000.h5").attrs["status"]
    proc = cli(*ARGS, "hydra.run.dir=run", "resume=true", cwd=tmp_path, launcher=TORCHRUN)
    assert proc.returncode == 0, proc.stderr[-3000:]
    if done0 == "complete":  # a complete shard is never touched
        assert (run_dir / "captures.rank-00000.h5").stat().st_mtime_ns == rank0
    with h5py.File(run_dir / "captures.h5") as f:
        assert f.attrs["status"] == "complete" and f.attrs["incomplete_shards"] == ""
    assert_same(run_dir / "captures.h5", single)
    # --verify on the view checks its shards' rows (the view holds no checksums of its own: it said
    # "NOTHING could be verified", exit 3); a row changed in a shard is named with the shard
    from hookrun.cli.inspect_command import main as inspect_main

    assert inspect_main([str(run_dir / "captures.h5"), "--verify"]) == 0
    with h5py.File(run_dir / "captures.rank-00001.h5", "r+") as f:
        ds = f["captures/fmap/features.0/output"]
        ds[0] = ds[0] + 1.0
    assert inspect_main([str(run_dir / "captures.h5"), "--verify"]) == 1


@pytest.mark.slow
def test_a_stop_in_rank_0s_last_batch_still_writes_the_incomplete_view(tmp_path, single):
    """Rank 1 is killed in its first batch while rank 0 waits in its last: torchrun's SIGTERM reaches
    rank 0 in that batch, which ends its shard complete. Rank 0 must still write the incomplete view
    after a short wait; it waited for rank 1 (dead, never done) until torchrun's SIGKILL 30 s later
    and left no view. Resume then gives the one-process file."""
    env = {"HOOKRUN_TEST_KILL": "1:3", "HOOKRUN_TEST_WAIT_STOP": "0:2"}  # 6 batches: rank 0 runs 0-2, rank 1 3-5
    proc = cli(*ARGS, "hydra.run.dir=run", cwd=tmp_path, launcher=TORCHRUN, env=env)
    assert proc.returncode != 0
    run_dir = tmp_path / "run"
    with h5py.File(run_dir / "captures.rank-00000.h5") as f:
        assert f.attrs["status"] == "complete" and f.attrs["steps_complete"] == 3
    assert "SIGTERM: finishing the batch in flight" in proc.stderr + proc.stdout
    assert (run_dir / "captures.h5").exists(), proc.stderr[-3000:]
    with h5py.File(run_dir / "captures.h5") as f:
        assert f.attrs["status"] == "incomplete"
        assert "captures.rank-00001.h5 (running, 0 batches)" in f.attrs["incomplete_shards"]
    proc = cli(*ARGS, "hydra.run.dir=run", "resume=true", cwd=tmp_path, launcher=TORCHRUN)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_same(run_dir / "captures.h5", single)


@pytest.mark.slow
def test_rank_0_takes_a_silent_rank_for_dead_and_marks_the_view(tmp_path):
    """Two tasks started by hand with submitit's variables (no launcher to stop rank 0 when rank 1
    dies): rank 0 sees rank 1's heartbeat stop and writes an incomplete view instead of hanging."""
    procs = []
    for rank in range(2):
        env = {**os.environ, **ENV, "SUBMITIT_LOCAL_JOB_ID": f"t{os.getpid()}", "SUBMITIT_LOCAL_NTASKS": "2",
               "SUBMITIT_LOCAL_GLOBALID": str(rank), "SUBMITIT_LOCAL_LOCALID": str(rank),
               "HOOKRUN_TEST_KILL": "1:4", "HOOKRUN_RANK_TIMEOUT": "4"}
        procs.append(subprocess.Popen([sys.executable, "-m", "hookrun", *ARGS, "hydra.run.dir=run"], cwd=tmp_path, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=120) for p in procs]
    assert procs[1].returncode == -9 and procs[0].returncode == 1, outs[0][1][-2000:]
    assert "rank 1 has been silent" in outs[0][0] + outs[0][1]  # the log (stdout)
    assert "captures.rank-00001.h5 (running, 1 batches)" in outs[0][1]  # the one error line
    with h5py.File(tmp_path / "run" / "captures.h5") as f:
        assert f.attrs["status"] == "incomplete" and f.attrs["samples_complete"] >= 12


def test_resume_with_another_world_size_is_refused(tmp_path):
    cfg = load_config({"model": {"_target_": "my_pkg.Net"}, "data": {"dataset": {"_target_": "my_pkg.MyData"}},
                                   "output": {"path": str(tmp_path / "captures.h5")}, "resume": True})
    for rank in range(2):
        with h5py.File(shard_path(tmp_path / "captures.h5", rank), "w") as f:
            f.attrs["world_size"] = 2
    with pytest.raises(ConfigError, match=r"written by 2 process\(es\) and this run has 3; resume with 2"):
        ShardRun(cfg, Ranks(0, 3, 0, "torchrun", "t")).check_files()
    with pytest.raises(ConfigError, match=r"written by 2 process\(es\) and this run has 1"):
        ShardRun(cfg, Ranks(0, 1, 0, "torchrun", "t")).check_files()
    one = {"model": {"_target_": "my_pkg.Net"}, "data": {"dataset": {"_target_": "my_pkg.MyData"}}, "resume": True,
           "output": {"path": str(tmp_path / "captures.h5")}}
    # one process beside the shards of a killed run (rank 0 killed: no view): it said "no file" and ran it all
    with pytest.raises(ConfigError, match=rf"^resume: {tmp_path} was written by 2 process\(es\) and this run has 1; resume with 2"):
        hookrun.run(one)
    assert not (tmp_path / "captures.h5").exists()
    with h5py.File(tmp_path / "captures.h5", "w") as f:  # a one-process run's file: a torchrun resume replaced it by a view
        f.attrs["status"] = "complete"
    with pytest.raises(ConfigError, match=r"captures.h5 is not the view of the shards beside it .*: move it away"):
        ShardRun(cfg, Ranks(0, 2, 0, "torchrun", "t")).check_files()
    (tmp_path / "captures.h5").unlink()
    cfg.resume = False
    with pytest.raises(ConfigError, match=r"captures.rank-00000.h5.* exist\(s\); set output.overwrite=true"):
        ShardRun(cfg, Ranks(0, 2, 0, "torchrun", "t")).check_files()
    with h5py.File(tmp_path / "captures.h5", "w") as f:  # a view, resumed by one process
        f.attrs["world_size"] = 2
    with pytest.raises(ConfigError, match=r"is the merged view of a 2-process run; resume it with the same launcher"):
        hookrun.run(one)


def test_a_missing_shard_is_named_in_the_view(tmp_path):
    shards = [shard_path(tmp_path / "captures.h5", r) for r in range(2)]
    with h5py.File(shards[0], "w") as f:
        f.attrs.update(status="complete", format_version="1")
        f["samples/index"] = np.arange(4)
        f["samples/step"] = np.zeros(4, dtype=np.int64)
        f.create_group("captures")
    view = build_view(tmp_path / "captures.h5", shards, {"config": "{}"})
    assert view.status == "incomplete" and view.incomplete == ["captures.rank-00001.h5 (missing)"]
    with hookrun.open_run(tmp_path) as run:  # what the view maps is all there: it opens, and says what is not
        assert run.status == "incomplete" and list(run.samples) == [0, 1, 2, 3]
        assert "not complete: captures.rank-00001.h5 (missing)" in run.summary(stats=False)


def test_the_view_carries_the_shards_model_fingerprint_and_refuses_shards_of_other_weights(tmp_path):
    """The view lacked model_fingerprint (each shard had it), so sae.evaluate's weight check was skipped
    against a many-process cache. Reference: the shards' own attribute, read with h5py."""
    shards = [shard_path(tmp_path / "captures.h5", r) for r in range(2)]
    for k, path in enumerate(shards):
        with h5py.File(path, "w") as f:
            f.attrs.update(status="complete", format_version="1", model_fingerprint="0123456789abcdef")
            f["samples/index"] = np.arange(4 * k, 4 * k + 4)
            f["samples/step"] = np.full(4, k, dtype=np.int64)
            f.create_group("captures")
    build_view(tmp_path / "captures.h5", shards, {"config": "{}"})
    with h5py.File(tmp_path / "captures.h5") as view, h5py.File(shards[1]) as f:
        assert view.attrs["model_fingerprint"] == f.attrs["model_fingerprint"]
    with h5py.File(shards[1], "a") as f:
        f.attrs["model_fingerprint"] = "fedcba9876543210"
    with pytest.raises(RunError, match=r"^captures.rank-00001.h5 was written by a model with other weights than "
                                       r"captures.rank-00000.h5 \(model_fingerprint fedcba9876543210, not 0123456789abcdef\)"):
        build_view(tmp_path / "captures.h5", shards, {"config": "{}"})


def test_a_shard_killed_before_its_first_batch_lacks_the_target_column_and_the_view_is_made(tmp_path):
    """(/samples/target is made at a shard's first batch: the view was refused, 'not written by one config')"""
    shards = [shard_path(tmp_path / "captures.h5", r) for r in range(2)]
    for k, path in enumerate(shards):
        with h5py.File(path, "w") as f:
            f.attrs.update(status="complete" if k == 0 else "running", format_version="1")
            f["samples/index"] = np.arange(4) if k == 0 else np.zeros(0, dtype=np.int64)
            f["samples/step"] = np.zeros(4 if k == 0 else 0, dtype=np.int64)
            if k == 0:
                f["samples/target"] = np.array([3, 1, 4, 1])
            f.create_group("captures")
    view = build_view(tmp_path / "captures.h5", shards, {"config": "{}"})
    assert view.status == "incomplete"
    with hookrun.open_run(tmp_path) as run:
        assert list(run.samples) == [0, 1, 2, 3] and list(run.targets) == [3, 1, 4, 1]


def test_ranks_whose_items_differ_in_having_a_target_are_refused_at_the_merge_and_no_old_view_stays(tmp_path):
    """A rank whose items have targets beside one whose items have none: the merge's line said 'not written by one
    config' (the configs are one); with output.overwrite=true the old view stayed, marked complete, reading the new
    rank's missing targets as class 0 ([0 1 0 1 0 0 0 0] for labels 0 1 0 1 and none)."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 2))
    labelled, bare = [(torch.randn(4), i % 2) for i in range(4)], [torch.randn(4) for _ in range(4)]
    shards = [shard_path(tmp_path / "captures.h5", r) for r in range(2)]

    def write(*datas):
        for path, data in zip(shards, datas, strict=True):
            hookrun.run({"hooks": {"h": {"at": "0", "type": "forward"}}, "progress": False, "data": {"batch_size": 2},
                         "output": {"path": str(path), "overwrite": True}}, model=model, dataset=data)

    write(labelled, labelled)
    assert build_view(tmp_path / "captures.h5", shards, {"config": "{}"}).status == "complete"
    with hookrun.open_run(tmp_path / "captures.h5") as run:
        assert list(run.targets) == [y for _, y in labelled] * 2
    write(labelled, bare)
    with pytest.raises(RunError) as exc:
        build_view(tmp_path / "captures.h5", shards, {"config": "{}"})
    assert str(exc.value) == ("/samples/target is in 1 of 2 shards (captures.rank-00000.h5): their items differ: every "
                              "item must give a target, or none does (data.target=null)")
    assert not (tmp_path / "captures.h5").exists() and sorted(p.name for p in tmp_path.glob("*.h5")) == [p.name for p in shards]


@pytest.mark.slow
def test_rank_benchmark_quick_mode_runs(tmp_path):
    proc = subprocess.run([sys.executable, "benchmarks/ranks.py", "--quick", "--markdown", str(tmp_path / "b.md")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, env={**os.environ, **ENV})
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = (tmp_path / "b.md").read_text()
    assert "| 1 process x 2 threads |" in table and "| 2 processes x 1 thread |" in table
    assert "rank 0" in table and "rank 1" in table and "merged view written by rank 0" in table


@pytest.mark.parametrize("error", [ConfigError("hooks.b.at: no module 'blockX'"), NotFoundError("no module 'blockX'")])
def test_a_refused_run_makes_no_view_and_says_nothing_about_one(tmp_path, caplog, error):
    """Rank 0 tried to merge the shards of a run refused before any shard existed, and logged an ERROR
    ("could not write the merged view ...") beside the refusal (or, some times, instead of it)."""
    import torch.distributed as dist

    cfg = load_config({"model": {"_target_": "my_pkg.Net"}, "data": {"dataset": {"_target_": "my_pkg.MyData"}},
                       "output": {"path": str(tmp_path / "captures.h5")}})
    run = ShardRun(cfg, Ranks(0, 2, 0, "torchrun", "t"))
    run.merge = lambda *a, **k: pytest.fail("a refused run was merged")

    def body(*_):
        raise error

    with pytest.raises(type(error)):
        run.run_and_merge(dist.HashStore(), cfg, body)
    assert "merged view" not in caplog.text


def test_a_rank_whose_process_here_has_ended_is_gone_and_one_running_or_elsewhere_is_not():
    """Rank 0's grace wait stops waiting for a rank whose process on this machine has ended (zombie or
    reaped) without saying it is done; a live process, another machine's, or one never named, is waited for."""
    import torch.distributed as dist

    from hookrun.output.shards import gone, process_mark

    store = dist.HashStore()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    store.set("pid/1", process_mark(child.pid))
    store.set("pid/2", "another-boot:1:" + process_mark(child.pid).split(":", 2)[2])
    try:
        assert not gone(store, 1) and not gone(store, 2) and not gone(store, 3)
    finally:
        child.kill()
    while open(f"/proc/{child.pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
        time.sleep(0.01)  # (killed, not yet reaped: a zombie)
    assert gone(store, 1) and not gone(store, 2)
    child.wait()
    assert gone(store, 1) and not gone(store, 2)
