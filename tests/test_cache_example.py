"""examples/train_sae.py trains a sparse autoencoder from a cache file with the shuffled reader."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import h5py
import numpy as np
import pytest
import torch
from conftest import ROOT

from hookrun.sae import load_sae
from hookrun.store.h5store import H5Store
from hookrun.store.records import Capture, CaptureKey, StepRecord


def load_example():
    spec = importlib.util.spec_from_file_location("train_sae", ROOT / "examples" / "train_sae.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sae_example_learns_the_cache(tmp_path):
    """Rows that are sparse sums of 24 directions: the SAE trained from the file reconstructs the
    file's rows (numpy, from its weights) five times better than their mean does."""
    rng = np.random.default_rng(0)
    d, n = 16, 3000
    dictionary = rng.standard_normal((24, d)).astype(np.float32)
    codes = rng.exponential(1.0, (n, 24)).astype(np.float32) * (rng.random((n, 24)) < 0.1)
    x = (codes @ dictionary).astype(np.float16)
    path = tmp_path / "cache.h5"
    with H5Store(path, {"config": "{}"}) as store:
        for step, lo in enumerate(range(0, n, 500)):
            cap = Capture(CaptureKey("res", "transformer.h.1", "forward", "output"), torch.from_numpy(x[lo:lo + 500]), False)
            store.write(StepRecord(step, np.arange(lo, lo + 500), None, None, [cap]))
    sae, losses = load_example().train(str(path), "res/transformer.h.1/output", features=4, epochs=6,
                                       batch_size=128, l1=1e-3, lr=3e-3)
    assert losses[-1] < losses[0]
    with h5py.File(path) as f:
        rows = f["captures/res/transformer.h.1/output"][:].astype(np.float64)
    w = {k: v.detach().numpy().astype(np.float64) for k, v in sae.state_dict().items()}
    feats = np.maximum((rows - w["b_dec"]) @ w["W_enc"] + w["b_enc"], 0)
    err = ((feats @ w["W_dec"] + w["b_dec"] - rows) ** 2).sum(1).mean()
    baseline = ((rows - rows.mean(0)) ** 2).sum(1).mean()
    assert err < 0.2 * baseline, (err, baseline)
    assert (feats > 0).mean() < 0.5  # sparse
    # --out: an SAELens folder that load_sae reads back into the same function, on the file's rows
    example = load_example()
    folder = example.save_saelens(sae, str(tmp_path / "sae"))
    loaded = load_sae(folder)
    assert (loaded.source, loaded.architecture, loaded.hook_name, loaded.d_in, loaded.d_sae) == (
        "saelens", "standard", "transformer.h.1", 16, 64)
    x = torch.from_numpy(rows.astype(np.float32))
    with torch.no_grad():
        x_hat, f = sae(x)
        np.testing.assert_allclose(loaded(x).numpy(), x_hat.numpy(), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(loaded.encode(x).numpy(), f.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(loaded.encode(x).numpy(), feats, rtol=1e-4, atol=1e-4)  # the numpy formula above


@pytest.mark.slow
def test_sae_example_cli_out_writes_an_saelens_folder(tmp_path):
    x = np.random.default_rng(1).standard_normal((300, 8)).astype(np.float32)
    with H5Store(tmp_path / "c.h5", {"config": "{}"}) as store:
        cap = Capture(CaptureKey("res", "encoder.layer.0", "forward", "output"), torch.from_numpy(x), False)
        store.write(StepRecord(0, np.arange(300), None, None, [cap]))
    subprocess.run([sys.executable, str(ROOT / "examples" / "train_sae.py"), str(tmp_path / "c.h5"), "--capture",
                    "res/encoder.layer.0/output", "--epochs", "1", "--out", str(tmp_path / "sae")], check=True,
                   capture_output=True)
    cfg = json.loads((tmp_path / "sae" / "cfg.json").read_text())
    assert cfg["architecture"] == "standard" and cfg["metadata"]["hook_name"] == "encoder.layer.0"
    assert (cfg["d_in"], cfg["d_sae"], cfg["normalize_activations"], cfg["apply_b_dec_to_input"]) == (8, 32, "none", True)
    assert load_sae(tmp_path / "sae").hook_name == "encoder.layer.0"
