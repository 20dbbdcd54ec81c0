"""The `sae:` kind trains from a cache in an object store (moto's S3 server on 127.0.0.1, the
fixtures of tests/helpers/moto_s3.py), its parts fetched by the parts loader: equal to SAELens'
SAETrainer run directly on the same rows, read from the same run written to a local file."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch
from moto_s3 import URL, cfg, local_run, moto_bucket

import hookrun

sae_lens = pytest.importorskip("sae_lens")
from sae_lens import SAETrainer, TopKTrainingSAE, TopKTrainingSAEConfig  # noqa: E402
from sae_lens.config import SAETrainerConfig  # noqa: E402

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
    stream = torch.cat([rows] * 3)
    logs = []

    class Logged(SAETrainer):
        def step(self, batch):
            out = super().step(batch)
            logs.append(self.build_train_step_log_dict(out, self.n_training_samples))
            return out

    Logged(SAETrainerConfig(total_training_samples=160, train_batch_size_samples=16, lr=1e-3, lr_end=1e-4), ref,
           iter([stream[i * 16:(i + 1) * 16] for i in range(10)])).fit()
    with hookrun.open_run(result.path) as run:
        curves = run.sae_curves()
        assert run.sae["epochs"] == 3
    assert [r["mse_loss"] for r in curves.rows] == pytest.approx([w["losses/mse_loss"] for w in logs], rel=1e-6)
    loaded = sae_lens.SAE.load_from_disk(str(tmp_path / "sae_run" / "sae"))
    ref.save_inference_model(str(tmp_path / "ref"))
    with torch.no_grad():
        torch.testing.assert_close(loaded.encode(rows), sae_lens.SAE.load_from_disk(str(tmp_path / "ref")).encode(rows),
                                   rtol=1e-5, atol=1e-5)
