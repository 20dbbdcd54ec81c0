"""Under load: a 64-job joblib sweep on this machine, and 100 hooks on every leaf module in flat memory."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, run_cli

from hookrun import open_sweep

pytestmark = pytest.mark.slow
ENV = {"PYTHONPATH": str(ROOT)}


def test_64_job_joblib_sweep_completes_every_file(tmp_path):
    proc = run_cli("-m", "hydra/launcher=joblib", "model=custom", "model._target_=my_pkg.Net", "data=custom",
                   "data.dataset._target_=my_pkg.MyData", "+data.dataset.n=8", "data.batch_size=4", "progress=false",
                   "seed=range(64)", "hooks={h: {at: head, type: forward, actions: [{name: record, what: output}]}}",
                   cwd=tmp_path, env=ENV, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (folder,) = [p for p in (tmp_path / "outputs" / "multirun").glob("*/*") if p.is_dir()]
    sweep = open_sweep(folder)
    assert len(sweep.jobs) == 64 and len({j.file for j in sweep.jobs}) == 64
    for job in sweep.jobs:
        with job.open() as run:
            assert run.status == "complete" and run["head", "output"].shape == (8, 10)


PEAK = r"""
import json, resource, sys, hookrun
leaves = ["features.0", "features.1", "features.2", "features.3", "pool", "head"]
hooks = {f"h{i}": {"at": leaves, "type": "forward", "actions": [{"name": "record", "what": "output", "dtype": "float16"}]} for i in range(100)}
cfg = {"model": {"_target_": "my_pkg.Net", "width": 8},
       "data": {"dataset": {"_target_": "my_pkg.MyData", "n": 800, "size": 8}, "batch_size": 8, "limit": int(sys.argv[1])},
       "device": "cpu", "progress": False, "hooks": hooks, "output": {"path": sys.argv[2]}}
r = hookrun.run(cfg)
print(json.dumps({"steps": r.steps, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""
# Per sample and hook, the six leaves' float16 outputs of an 8x8 image are 3,124 bytes: the long
# run writes 100 hooks x 8 samples x 50 batches of them (119 MiB), 104 MiB more than the short one.
# (Batches of 8: a batch's time is its 600 hook firings and dataset appends, whatever their rows,
# so the same 400 samples and bytes as 200 batches of 2 take a quarter of the time.)
LEAF_BYTES = 2 * (8 * 8 * 8 * 2 + 16 * 4 * 4 * 2 + 16 + 10)
BATCH = 8  # PEAK's batch_size


def peak(batches: int, path) -> dict:
    """Run `batches` batches in a fresh process; its step count, peak RSS and bytes written (the file is then deleted)."""
    proc = subprocess.run([sys.executable, "-c", PEAK, str(batches), str(path)], capture_output=True, text=True,
                          env={**os.environ, **ENV}, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["mb_written"] = path.stat().st_size / 2**20
    path.unlink()
    return result


def test_100_hooks_on_every_leaf_keep_memory_flat(tmp_path):
    small = peak(6, tmp_path / "small.h5")
    large = peak(50, tmp_path / "large.h5")
    assert small["steps"] == 6 and large["steps"] == 50
    assert large["mb_written"] >= 0.95 * 50 * BATCH * 100 * LEAF_BYTES / 2**20, large  # every capture is on disk
    # 600 hook points, 8x more batches and samples: peak memory grows by less than a tenth of what was written
    # (keeping the captures, or a partly filled 1 MiB chunk per capture, would add far more)
    assert large["rss_mb"] - small["rss_mb"] <= 0.1 * (large["mb_written"] - small["mb_written"]), (small, large)
