"""A sweep's jobs sharing one absolute sae.out: each job with sae.overwrite (experiment=sae_shapes sets
it) replaced the SAE of the job before, so the sweep kept one SAE and said nothing of the others; the
second job is now refused in one line before any batch, and the first job's SAE stays as it wrote it."""

from __future__ import annotations

import json
import subprocess
import sys

import h5py
import pytest
from conftest import ENV, ROOT

pytest.importorskip("sae_lens")


@pytest.mark.slow
def test_the_jobs_of_a_sweep_do_not_replace_each_others_sae(tmp_path):
    shared, sweep = tmp_path / "shared", tmp_path / "sweep"
    proc = subprocess.run([sys.executable, "-m", "hookrun", "-m", "experiment=sae_shapes", "sae.k=4,8", f"sae.out={shared}",
                           "data.dataset.size=64", "sae.budget=2048", "sae.batch_rows=256", "sae.shuffle.buffer_rows=1024",
                           "sae.lr_schedule={warmup: 0, decay: 0}", "progress=false", f"hydra.sweep.dir={sweep}"],
                          capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=600)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1] == (
        f"hookrun: error: sae.out: {shared} holds the SAE job 0 of this sweep trained, and job 1 would replace it; give "
        "each job its own folder: a relative sae.out (in each job's folder) or one holding ${hydra:job.num}")
    assert json.loads((shared / "cfg.json").read_text())["k"] == 4  # job 0's SAE, as it wrote it
    with h5py.File(sweep / "0" / "captures.h5", "r") as f:
        assert f.attrs["status"] == "complete" and json.loads(f.attrs["sae"])["out"] == str(shared)
    assert not (sweep / "1" / "captures.h5").exists()  # refused before the file is made
