"""examples/train_sae.py trains a sparse autoencoder from a cache file with the shuffled reader."""

from __future__ import annotations

import importlib.util

import h5py
import numpy as np
import torch
from conftest import ROOT

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
