"""The `sae:` kind trains from a cache in an object store (moto's S3 server on 127.0.0.1, the
fixtures of tests/helpers/moto_s3.py), its parts fetched by the parts loader: equal to SAELens'
SAETrainer run directly on the same rows, read from the same run written to a local file."""

from __future__ import annotations

import os
import subprocess
import sys

import h5py
import numpy as np
import pytest
import torch
from conftest import ENV
from moto_s3 import URL, cfg, local_run, moto_bucket

import hookrun

sae_lens = pytest.importorskip("sae_lens")
from sae_lens import TopKTrainingSAE, TopKTrainingSAEConfig  # noqa: E402
from saelens_reference import assert_same_latents, saelens_fit  # noqa: E402

s3 = pytest.fixture(moto_bucket)  # moto's server, a clean bucket: the same fixture


def test_sae_trains_from_an_s3_cache_like_saelens(s3, tmp_path, monkeypatch):
    torch.set_num_threads(1)
    monkeypatch.setenv("HOOKRUN_CACHE_DIR", str(tmp_path / "fetched"))
    hookrun.run(cfg(URL, tmp_path))  # the cache, in parts of ~700 bytes in the bucket
    with h5py.File(local_run(tmp_path), "r") as f:  # the same run, written to a local file
        rows = torch.from_numpy(f["captures/h/0/output"][:].astype(np.float32))
    assert rows.shape == (64, 16)
    run_cfg = cfg(str(tmp_path / "sae_run" / "captures.h5"), tmp_path)
    run_cfg.pop("hooks")
    run_cfg["output"] = {"path": str(tmp_path / "sae_run" / "captures.h5")}
    run_cfg["sae"] = {"from": URL, "capture": "h/0/output", "architecture": "topk", "k": 4, "d_sae": 32, "lr": 1e-3,
                      "batch_rows": 16, "rows": 160, "shuffle": False, "seed": 1}
    result = hookrun.run(run_cfg)
    torch.manual_seed(1)
    ref = TopKTrainingSAE(TopKTrainingSAEConfig(d_in=16, d_sae=32, k=4))
    logs = saelens_fit(ref, rows, 160, 16)  # 10 steps over the 64 rows in order
    with hookrun.open_run(result.path) as run:
        curves = run.sae_curves()
        assert run.sae["epochs"] == 3
    assert [r["mse_loss"] for r in curves.rows] == pytest.approx([w["losses/mse_loss"] for w in logs], rel=1e-6)
    assert_same_latents(tmp_path / "sae_run" / "sae", ref, rows, tmp_path / "ref")


def test_a_parts_loader_iterator_open_at_exit_ends_quietly(s3, tmp_path):
    """As tests/sae/test_sae_bad_values.py's local loader: an S3 cache's iterator kept to the end of the
    process (was: 'Exception ignored in: <generator object PartsLoader.__iter__>' ... shutil already gone)."""
    hookrun.run(cfg(URL, tmp_path))
    code = (f"import hookrun\nrun = hookrun.open_run({URL!r}, cache_dir={str(tmp_path / 'fetched')!r})\n"
            "it = iter(run.loader('h/0/output', batch_size=8, seed=0))\nprint(tuple(next(it).shape))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **ENV})
    assert proc.returncode == 0 and proc.stdout.strip() == "(8, 16)", proc.stderr[-2000:]
    assert proc.stderr == ""


KILLED_AFTER_SAVE = """  # the SAE run, SIGKILLed right after it wrote its SAE to sae.out (where sae.evaluate would then run)
import json, os, signal, sys
import hookrun
import hookrun.runner.kinds.sae.kind as kind
kind.mark_sweep_out = lambda out: os.kill(os.getpid(), signal.SIGKILL)
hookrun.run(json.loads(sys.argv[1]))
"""


def test_a_run_to_the_bucket_killed_after_its_sae_was_written_resumes_to_saelens(s3, tmp_path, monkeypatch):
    """output.path in the store, sae.overwrite off: the resume takes the SAE in sae.out for its own run's, as a
    local run's does (was: 'sae.out: ... already holds an SAE ...; resume=true finds no SAE run to continue at
    output.path', exit 2, though the run was at output.path), and ends equal to SAELens' trainer."""
    from moto_s3 import BUCKET, s3_env

    server, _ = s3
    torch.set_num_threads(1)
    monkeypatch.setenv("HOOKRUN_CACHE_DIR", str(tmp_path / "fetched"))
    hookrun.run(cfg(URL, tmp_path))
    with h5py.File(local_run(tmp_path), "r") as f:  # the same cache, written to a local file, read by h5py
        rows = torch.from_numpy(f["captures/h/0/output"][:].astype(np.float32))
    run_cfg = cfg(f"s3://{BUCKET}/sae/captures.h5", tmp_path)
    run_cfg.pop("hooks")
    run_cfg["output"] = {"path": f"s3://{BUCKET}/sae/captures.h5", "staging": str(tmp_path / "sae_stage")}
    run_cfg["sae"] = {"from": URL, "capture": "h/0/output", "architecture": "topk", "k": 4, "d_sae": 32, "lr": 1e-3,
                      "batch_rows": 16, "rows": 160, "shuffle": False, "seed": 1, "out": str(tmp_path / "out"),
                      "overwrite": False, "checkpoints": 2}
    killed = subprocess.run([sys.executable, "-c", KILLED_AFTER_SAVE, __import__("json").dumps(run_cfg)],
                            capture_output=True, text=True, env={**os.environ, **ENV, **s3_env(server)})
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert (tmp_path / "out" / "cfg.json").exists()
    with hookrun.open_run(run_cfg["output"]["path"]) as run:
        assert run.status == "running"
    result = hookrun.run({**run_cfg, "resume": True})
    with hookrun.open_run(result.path) as run:
        assert run.status == "complete"
        curves = run.sae_curves()
    torch.manual_seed(1)
    ref = TopKTrainingSAE(TopKTrainingSAEConfig(d_in=16, d_sae=32, k=4))
    logs = saelens_fit(ref, rows, 160, 16)
    assert [r["mse_loss"] for r in curves.rows] == pytest.approx([w["losses/mse_loss"] for w in logs], rel=1e-6)
    assert_same_latents(tmp_path / "out", ref, rows, tmp_path / "ref")
