"""A sweep's job folders wherever Hydra's conventions put them, and the sweep charts' titles naming the
jobs with no line. References: each job's file read with h5py, its .hydra/config.yaml."""

from __future__ import annotations

import h5py
import numpy as np
import yaml
from conftest import run_cli

from hookrun.analysis.sweep import is_sweep, open_sweep


def test_a_sweep_whose_subdir_nests_a_value_with_slashes_finds_every_job(tmp_path):
    """`hydra.sweep.subdir=${hydra.job.override_dirname}` with a path as a value (`+params.tag=a/b`)
    puts each job's folder several folders deep: the sweep said "0 jobs", open_sweep listed both
    as "not run" and inspect refused the folder, with both complete files there."""
    done = run_cli("-m", "experiment=ablate_layer3", "params.factor=0.5", "+params.tag=a/b,c/d/e", "data.limit=1",
                   "data.batch_size=2", "progress=false", "hydra.sweep.dir=sw",
                   "hydra.sweep.subdir=${hydra.job.override_dirname}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "hookrun: sweep folder: sw (2 jobs; python -m hookrun.inspect sw)" in done.stdout
    files = sorted(tmp_path.glob("sw/**/captures.h5"))
    assert len(files) == 2 and is_sweep(tmp_path / "sw")
    sweep = open_sweep(tmp_path / "sw")
    table = sweep.table(stats=("mean",))
    assert sweep.swept == ["params.tag"] and len(table) == 2
    for job, row in zip(sweep.jobs, table.rows, strict=True):
        tag = yaml.safe_load((job.folder / ".hydra" / "config.yaml").read_text())["params"]["tag"]
        assert row["status"] == "complete" and row["params.tag"] == tag == job.overrides["params.tag"]
        with h5py.File(job.file, "r") as f:
            assert f.attrs["status"] == "complete"
            mean = float(np.mean(f["captures/logits/fc/output"][()], dtype=np.float64))
        np.testing.assert_allclose(row["logits/fc/output:mean"], mean, rtol=1e-6)
    assert sorted(j.file for j in sweep.jobs) == files

