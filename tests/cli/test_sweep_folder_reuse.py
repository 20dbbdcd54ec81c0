"""A sweep run again into an earlier sweep's folder (cli/sweep_folder.py, analysis/sweep.py): with
output.overwrite=true the table is the new sweep's jobs alone; resume=true of other overrides is refused
before Hydra rewrites multirun.yaml. References: the command lines' own values, each job's
.hydra/config.yaml (what Hydra ran), each job's file by h5py, and the folder's bytes before and after."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import yaml
from conftest import run_cli
from warm_python import python as warm

from hookrun import open_sweep

SMALL = ["experiment=ablate_layer3", "data.limit=1", "data.batch_size=2", "progress=false", "hydra.sweep.dir=s"]


@pytest.fixture
def three_jobs(tmp_path):
    first = run_cli("-m", "params.factor=0,0.5,1", *SMALL, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]
    return tmp_path / "s"


def test_a_smaller_sweep_over_an_earlier_ones_folder_tables_its_own_jobs_alone(three_jobs):
    """Jobs 0 and 1 of factors 0 and 1 over a sweep of 0, 0.5, 1: the earlier sweep's job 2 (factor 1)
    was a third row of the new sweep, in open_sweep, inspect and the sweep's last line."""
    again = run_cli("-m", "params.factor=0,1", *SMALL, "output.overwrite=true", cwd=three_jobs.parent)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "hookrun: sweep folder: s (2 jobs;" in again.stdout
    with pytest.warns(UserWarning, match=r"job folder\(s\) 2 hold overrides its multirun.yaml does not plan"):
        sweep = open_sweep(three_jobs)
    assert [j.num for j in sweep.jobs] == ["0", "1"]
    table = sweep.table()
    assert table.column("params.factor") == [0, 1] and table.column("status") == ["complete", "complete"]
    for job, row in zip(sweep.jobs, table, strict=True):
        ran = yaml.safe_load((three_jobs / job.num / ".hydra" / "config.yaml").read_text())["params"]["factor"]
        assert job.overrides["params.factor"] == ran
        with h5py.File(three_jobs / job.num / "captures.h5", "r") as f:
            a = f["captures/logits/fc/output"][()].astype(np.float64)
        np.testing.assert_allclose(row["logits/fc/output:mean"], a.mean(), rtol=1e-9)
    out = warm(["-m", "hookrun.inspect", str(three_jobs), "--no-stats"], check=True)
    assert "s: 2 jobs, swept: params.factor" in out.stdout and out.stdout.count("complete") == 2
    assert "job folder(s) 2 hold overrides" in out.stderr


def test_resume_of_other_overrides_is_one_line_and_leaves_the_sweeps_record(three_jobs):
    """resume=true of factors 5, 6 stopped at job 0 with a clear message, but Hydra had rewritten
    multirun.yaml to 5,6 by then while the job folders held 0, 0.5 and 1."""
    before = {p: p.read_bytes() for p in [three_jobs / "multirun.yaml", *sorted(three_jobs.glob("*/.hydra/*.yaml"))]}
    other = run_cli("-m", "params.factor=5,6", *SMALL, "resume=true", cwd=three_jobs.parent)
    assert other.returncode == 2 and other.stderr.count("\n") == 1, other.stderr[-2000:]
    assert {p: p.read_bytes() for p in before} == before and not (three_jobs / "3").exists()
    assert other.stderr.startswith("hookrun: error: hydra.sweep.dir=s: resume=true goes on with the sweep there "
                                   "(params.factor=0,0.5,1 experiment=ablate_layer3 data.limit=1")
    assert "params.factor=5,6" in other.stderr and "output.overwrite=true" in other.stderr
    # the same sweep resumes (run-control keys aside: progress, resume)
    same = run_cli("-m", "params.factor=0,0.5,1", *[a for a in SMALL if a != "progress=false"], "resume=true", cwd=three_jobs.parent)
    assert same.returncode == 0, same.stderr[-2000:]
    assert yaml.safe_load((three_jobs / "multirun.yaml").read_text())["hydra"]["overrides"]["task"][:2] == [
        "params.factor=0,0.5,1", "experiment=ablate_layer3"]
