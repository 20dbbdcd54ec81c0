"""model=tiny_cnn and data=shapes: the shipped shape classifier knows its shapes, its training script
is reproducible, and experiment=shapes_gradcam records what raw PyTorch computes, with Grad-CAM
maps that fall on the shape rather than the background."""

from __future__ import annotations

import subprocess
import sys

import h5py
import numpy as np
import pytest
import torch
from conftest import ROOT

import hookrun
from hookrun.data.shapes import SHAPES, draw, shapes
from hookrun.models.tiny_cnn import tiny_cnn


def test_shapes_are_fixed_per_index_and_drawn_as_named():
    ds = shapes(size=16, seed=0)
    x0, y0 = ds[3]
    x1, y1 = ds[3]
    assert torch.equal(x0, x1) and y0 == y1 and x0.shape == (1, 32, 32)
    assert not torch.equal(ds[3][0], shapes(size=16, seed=5)[3][0])
    circle, square = draw(0, 16, 16, 6, 32), draw(1, 16, 16, 6, 32)
    assert circle[16, 16] == 1 and circle[16, 2] == 0 and circle[11, 11] == 0 and square[11, 11] == 1  # a corner: square only
    with pytest.raises(IndexError):
        ds[16]


def test_the_shipped_model_classifies_shapes_it_never_saw():
    model = tiny_cnn()
    ds = shapes(size=200, seed=0)  # trained on seed 1, held out seed 2: seed 0 is new
    x = torch.stack([ds[i][0] for i in range(len(ds))])
    y = torch.tensor([ds[i][1] for i in range(len(ds))])
    with torch.no_grad():
        accuracy = float((model(x).argmax(1) == y).float().mean())
    assert accuracy >= 0.95 and set(y.tolist()) == set(range(len(SHAPES)))


@pytest.mark.slow
def test_training_is_reproducible(tmp_path):
    outs = []
    for k in range(2):
        out = tmp_path / str(k)
        proc = subprocess.run([sys.executable, "examples/train_tiny_cnn.py", "--train", "128", "--held-out", "32", "--epochs", "1",
                               "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600,
                              env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
        assert proc.returncode == 0, proc.stderr
        outs.append((out / "model.safetensors").read_bytes())
    assert outs[0] == outs[1]


def test_shapes_gradcam_records_the_maps_and_gradients_raw_pytorch_computes(tmp_path):
    cfg = hookrun.compose("experiment=shapes_gradcam", "data.dataset.size=8", "data.batch_size=4", "device=cpu",
                          "progress=false", f"output.path={tmp_path / 'g.h5'}")
    hookrun.run(cfg)
    model = tiny_cnn()
    ds = shapes(size=8, seed=0)
    x = torch.stack([ds[i][0] for i in range(8)])
    y = torch.tensor([ds[i][1] for i in range(8)])
    kept = {}
    model.block3.register_forward_hook(lambda m, i, o: kept.update(a=o))
    logits = model(x)
    grad = torch.autograd.grad(logits.gather(1, y[:, None]).sum(), kept["a"])[0]
    with h5py.File(tmp_path / "g.h5") as f:
        act, g = f["captures/fmap/block3/output"][:], f["captures/fmap_grad/block3/grad"][:]
        np.testing.assert_allclose(act, kept["a"].detach().numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(g, grad.numpy(), rtol=1e-4, atol=1e-7)
    # Grad-CAM (relu of the gradient-weighted maps) lies mostly on the shape: its mean over the
    # shape's pixels, upsampled 4x, beats its mean over the background
    cam = np.maximum((grad.mean(dim=(2, 3), keepdim=True) * kept["a"]).sum(1).detach().numpy(), 0)
    cam = cam.repeat(4, axis=1).repeat(4, axis=2)
    inside = x[:, 0].numpy() > 0.5
    on, off = (cam * inside).sum((1, 2)) / inside.sum((1, 2)), (cam * ~inside).sum((1, 2)) / (~inside).sum((1, 2))
    assert (on > off).mean() >= 0.75, (on, off)


@pytest.mark.slow
def test_a_wheel_carries_the_weights_and_the_report_page(tmp_path, wheel_site):
    import os

    names, site = wheel_site
    for name in ("hookrun/models/tiny_cnn/model.safetensors", "hookrun/models/tiny_cnn/training.json",
                 "hookrun/conf/model/tiny_cnn.yaml", "hookrun/conf/data/shapes.yaml", "hookrun/conf/experiment/shapes_gradcam.yaml",
                 "hookrun/analysis/report/assets/report.js", "hookrun/analysis/report/assets/report.css"):
        assert name in names, name
    probe = ("import hookrun.models as m, hookrun.analysis.report.page as p; m.tiny_cnn(); "
             "print(p.__file__, len(p.render({'title': 't', 'source': 's', 'sections': []})) > 10**6)")
    proc = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(site)}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == [str(site / "hookrun" / "analysis" / "report" / "page.py"), "True"]
