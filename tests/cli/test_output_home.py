"""`output.path='~/...'` on the command line is the home folder's file, as a shell and os.path.expanduser
read it (the reference); it was written to a folder literally named `~` inside the run folder
(outputs/.../~/run.h5). In a multirun it names one file for every job, so it is refused as an absolute
path is."""

from __future__ import annotations

import os

import h5py
import pytest
from conftest import ROOT
from warm_python import python as warm

ARGS = ["-m", "hookrun", "experiment=resnet_layer1", "data.limit=1", "data.batch_size=2", "progress=false"]


@pytest.mark.slow
def test_a_tilde_output_path_is_the_home_folders_file(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HOME": str(home)}
    env.pop("HYDRA_FULL_ERROR", None)
    proc = warm([*ARGS, "hydra.run.dir=run", "output.path='~/runs_x.h5'"], cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    want = os.path.join(str(home), "runs_x.h5")  # (os.path.expanduser with that HOME)
    with h5py.File(want, "r") as f:
        assert f.attrs["status"] == "complete"
    assert not (tmp_path / "run" / "~").exists()
    sweep = warm(["-m", "hookrun", "-m", "experiment=resnet_layer1", "data.limit=1", "progress=false", "data.batch_size=1,2",
                  "hydra.sweep.dir=sw", "output.path='~/runs_y.h5'"], cwd=tmp_path, env=env)
    assert sweep.returncode == 2, sweep.stderr[-2000:]
    assert sweep.stderr.strip().splitlines()[-1] == ("hookrun: error: output.path=~/runs_y.h5 is absolute: every job of a "
                                                     "multirun would write the same file; give a path inside the job's "
                                                     "folder (each job has its own) or one with ${hydra:job.num} in it")
