"""Sweeps for real, in subprocesses: the basic launcher, joblib, submitit_local; the sweep table,
inspect and plot of a multirun, dry_run from the CLI, the console script."""

from __future__ import annotations

import shutil
import subprocess

import h5py
import numpy as np
import pytest
from conftest import run_cli
from warm_python import python as warm

from hookrun import open_run, open_sweep

pytestmark = pytest.mark.slow


def sweep_folder(tmp_path):
    (folder,) = [p for p in (tmp_path / "outputs" / "multirun").glob("*/*") if p.is_dir()]
    return folder


def check_sweep(folder, n_jobs, key):
    sweep = open_sweep(folder)
    table = sweep.table()
    assert len(table) == n_jobs and sweep.swept == [key]
    for row, job in zip(table, sweep.jobs, strict=True):
        assert row["status"] == "complete"
        with open_run(job.file) as run:
            a = run["fc", "output"][:].astype(np.float64)
        np.testing.assert_allclose(row["logits/fc/output:mean"], a.mean(), rtol=1e-9)
        np.testing.assert_allclose(row["logits/fc/output:std"], a.std(), rtol=1e-9)
    return table


def test_joblib_sweep_table_inspect_and_plot(tmp_path):
    proc = run_cli("-m", "experiment=ablate_layer3", "params.factor=0,0.5,1", "hydra/launcher=joblib",
                   "data.limit=1", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    folder = sweep_folder(tmp_path)
    table = check_sweep(folder, 3, "params.factor")
    assert table.column("params.factor") == [0, 0.5, 1]
    assert [type(v) for v in table.column("params.factor")] == [int, float, int]  # typed, as Hydra reads them
    stds = dict(zip(table.column("params.factor"), table.column("logits/fc/output:std"), strict=True))
    assert stds[0.0] < stds[0.5] < stds[1.0]  # scaling layer3 down shrinks the spread of the logits
    out = warm(["-m", "hookrun.inspect", str(folder)], check=True).stdout
    assert "3 jobs, swept: params.factor" in out and out.count("complete") == 3
    plot = warm(["-m", "hookrun.plot", str(folder), "--out", str(tmp_path / "fig")], check=True)
    # each metric against each swept parameter: the logits' mean against params.factor among them
    assert (tmp_path / "fig" / "sweep_logits__fc__output_mean_vs_params.factor.png").stat().st_size > 5000, plot.stderr


def test_submitit_local_sweep(tmp_path):
    proc = run_cli("-m", "experiment=resnet_layer1", "seed=0,1", "hydra/launcher=submitit_local", "data.limit=1",
                   "+hooks.logits={at: fc, type: forward, actions: [{name: record, what: output}]}", cwd=tmp_path, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    check_sweep(sweep_folder(tmp_path), 2, "seed")


def test_inspect_a_run_file(tmp_path):
    assert run_cli("experiment=fc_input", "data.limit=1", "hydra.run.dir=outputs/r", cwd=tmp_path).returncode == 0
    out = warm(["-m", "hookrun.inspect", "outputs/r/captures.h5"], cwd=tmp_path, check=True).stdout
    assert "status    complete" in out and "features/fc/input" in out and "(16, 512)" in out and "mean" in out
    bad = warm(["-m", "hookrun.inspect", "nope.h5"], cwd=tmp_path)
    assert bad.returncode == 2 and "no file" in bad.stderr and "Traceback" not in bad.stderr


def test_dry_run_from_the_cli_writes_nothing(tmp_path):
    proc = run_cli("experiment=resnet_layer1", "dry_run=true", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "estimated file size: 98.0 MiB for 64 samples" in proc.stdout
    assert list(tmp_path.iterdir()) == []


def test_a_dry_run_sweep_says_nothing_was_written(tmp_path):
    """It ended "sweep folder: ... (0 jobs; python -m hookrun.inspect ...)" with two plans above, and that
    inspect then failed."""
    proc = run_cli("-m", "experiment=fc_input", "seed=0,1", "dry_run=true", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("hookrun plan (dry run: nothing is written)") == 2
    assert "a dry run of a sweep: each job's plan is above; nothing was written" in proc.stdout
    assert "sweep folder" not in proc.stdout and not list(tmp_path.rglob("*.h5"))


def test_console_script_is_the_same_app(tmp_path):
    exe = shutil.which("hookrun")
    assert exe, "the hookrun console script is not installed"
    proc = subprocess.run([exe, "experiment=resnet_layer1", "dry_run=true"], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0 and "hookrun plan" in proc.stdout


def test_sweep_jobs_never_share_a_file(tmp_path):
    proc = run_cli("-m", "seed=0,1", "data.limit=1", "hooks={l: {at: fc, type: forward, actions: [record]}}", cwd=tmp_path)
    assert proc.returncode == 0
    files = sorted(sweep_folder(tmp_path).rglob("*.h5"))
    assert len(files) == 2 and files[0].parent != files[1].parent
    with h5py.File(files[0]) as a, h5py.File(files[1]) as b:
        assert a.attrs["config"] != b.attrs["config"]
