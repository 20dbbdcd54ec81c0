"""A multirun whose jobs are refused or fail: what the command says and what the sweep's readers show.
References: each job's own refusal as a single run (the same line), the folders on disk, each job's
file read by h5py."""

from __future__ import annotations

import pytest
from conftest import run_cli

pytestmark = pytest.mark.slow
SMALL = ("data.limit=1", "data.batch_size=2", "progress=false")


def test_a_sweep_whose_job_a_config_check_refuses_is_refused_before_any_job_runs(tmp_path):
    """`params.factor=0,abc,1`: job 0 ran (a ResNet built, a file written), then job 1 was refused and job 2
    never started; the line named no job. Now every job's config is checked first: the refused job is
    named with its overrides and the line its own run gives, nothing runs and nothing is written."""
    alone = run_cli("experiment=ablate_layer3", "params.factor=abc", *SMALL, "hydra.run.dir=alone", cwd=tmp_path)
    (line,) = [x for x in alone.stderr.splitlines() if x.startswith("hookrun: error: ")]
    assert alone.returncode == 2 and "factor='abc' is not a number" in line  # (the reference: the job's own refusal)
    swept = run_cli("-m", "experiment=ablate_layer3", "params.factor=0,abc,1", *SMALL, "hydra.sweep.dir=s", cwd=tmp_path)
    assert swept.returncode == 2, swept.stderr[-2000:]
    errors = [x for x in swept.stderr.splitlines() if x.startswith("hookrun: error: ")]
    assert errors == [line.replace("hookrun: error: ", "hookrun: error: job 1 (params.factor=abc): ")]
    assert "Traceback" not in swept.stderr and "#0 :" not in swept.stdout + swept.stderr  # (no job launched)
    assert not (tmp_path / "s").exists()  # (Hydra wrote no sweep folder: the check ran before it)
